// CommunicatorImpl: what a Communicator owns: the rendezvous, the executor (and through it the
// backend), and the resolved options.
#ifndef ADAPTCOMM_LIB_CORE_COMMUNICATOR_IMPL_H_
#define ADAPTCOMM_LIB_CORE_COMMUNICATOR_IMPL_H_

#include <memory>
#include <string>

#include "adaptcomm/communicator.h"
#include "lib/core/op_executor.h"
#include "lib/core/rendezvous.h"

namespace adaptcomm::internal {

class CommunicatorImpl {
 public:
  CommunicatorImpl(CommunicatorOptions options, Rendezvous rendezvous,
                   std::shared_ptr<OpExecutor> executor, std::string selection_reason);
  ~CommunicatorImpl();

  // Validates `desc` (generic rules, then the backend's), fills in the default timeout, queues it.
  Work Submit(OpDesc desc);

  const CommunicatorOptions& options() const { return options_; }
  OpExecutor& executor() { return *executor_; }
  const OpExecutor& executor() const { return *executor_; }
  const std::string& selection_reason() const { return selection_reason_; }

 private:
  const CommunicatorOptions options_;
  Rendezvous rendezvous_;
  std::shared_ptr<OpExecutor> executor_;
  const std::string selection_reason_;
};

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_COMMUNICATOR_IMPL_H_
