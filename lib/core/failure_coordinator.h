// FailureCoordinator: turns one rank's failure into a prompt, named failure on every rank.
//
// A rank whose op fails publishes "failure/<rank>" = seq|op|cause to the communicator's store,
// dumps its flight recorder, and wakes every other rank (key "wake/<r>"). A woken rank answers
// ("ack/<rank>" = its own position), dumps, and aborts its pending work with Aborted naming the
// failed rank, instead of waiting out its own timeout. The failing rank waits (bounded by the
// report window) for every other rank's answer: a rank that never answers is dead or stalled,
// and the final error names it as the likely culprit.
#ifndef ADAPTCOMM_LIB_CORE_FAILURE_COORDINATOR_H_
#define ADAPTCOMM_LIB_CORE_FAILURE_COORDINATOR_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "adaptcomm/store.h"
#include "lib/core/op_executor.h"
#include "lib/trace/flight_recorder.h"

namespace adaptcomm::internal {

struct FailureCoordinatorOptions {
  int rank = 0;
  int world_size = 1;
  std::string name;                                 // communicator name, for messages
  absl::Duration report_window = absl::Seconds(5);  // how long to wait for peers' reports
};

class FailureCoordinator final : public FailureHandler {
 public:
  // `store` is the communicator's scoped store; `recorder` may be null.
  FailureCoordinator(FailureCoordinatorOptions options, std::shared_ptr<Store> store,
                     trace::FlightRecorder* recorder);
  ~FailureCoordinator() override;

  // Starts listening for other ranks' failures; on one, calls abort(reason).
  void Start(std::function<void(const absl::Status&)> abort);
  // Stops listening (bounded: wakes its own listener through the store).
  void Stop();

  absl::Status OnOpFailure(const OpDesc& op, absl::Status status) override;

 private:
  void Listen();
  void Publish(const std::string& key, const std::string& value);

  const FailureCoordinatorOptions options_;
  const std::shared_ptr<Store> store_;
  trace::FlightRecorder* const recorder_;
  std::function<void(const absl::Status&)> abort_;
  std::atomic<bool> reported_{false};  // only the first failure is coordinated
  std::thread listener_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_FAILURE_COORDINATOR_H_
