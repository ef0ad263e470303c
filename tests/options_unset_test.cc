// Unset, in the public options structs, is an empty std::optional (adaptcomm/profile.h): an unset
// field takes the environment's or the profile's value, a set one wins, and a set value that
// cannot be meant (a rank of -1, a timeout of zero, port 0) is refused instead of read as "unset".
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "adaptcomm/adaptcomm.h"
#include "adaptcomm/ext/backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/scoped_env.h"

namespace adaptcomm {
namespace {

using ::testing::HasSubstr;
using testing::ScopedEnv;

// One rank on an in-process store, rank and world size as `o` leaves them.
absl::StatusOr<std::unique_ptr<Communicator>> CreateOnHashStore(CommunicatorOptions o) {
  o.store = CreateHashStore();
  o.init_timeout = absl::Seconds(10);
  return Communicator::Create(o);
}

TEST(OptionsUnset, RankAndWorldSizeComeFromTheLauncherUnlessSet) {
  // Unset: torchrun's variables decide. RANK=3 of WORLD_SIZE=1 is out of range, which proves
  // that the environment was read.
  ScopedEnv rank("RANK", "3");
  ScopedEnv world("WORLD_SIZE", "1");
  absl::StatusOr<std::unique_ptr<Communicator>> c = CreateOnHashStore({});
  ASSERT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("rank 3 is out of range for world size 1"));

  // A set rank wins over RANK; the unset world size still comes from WORLD_SIZE.
  CommunicatorOptions o;
  o.rank = 0;
  c = CreateOnHashStore(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->rank(), 0);
  EXPECT_EQ((*c)->size(), 1);

  // Both set: the environment is not read at all (a RANK it cannot parse is refused when it is).
  ScopedEnv bad_rank("RANK", "not a number");
  EXPECT_TRUE(absl::IsInvalidArgument(CreateOnHashStore({}).status()));
  o.world_size = 1;
  c = CreateOnHashStore(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->size(), 1);
}

TEST(OptionsUnset, SetValuesThatWereSentinelsAreRefused) {
  CommunicatorOptions o;
  o.world_size = 1;
  o.rank = -1;  // once "from the launcher"; now a rank out of range
  absl::StatusOr<std::unique_ptr<Communicator>> c = CreateOnHashStore(o);
  ASSERT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("rank -1 is out of range"));

  o.rank = 0;
  o.master_port = 0;  // once "MASTER_PORT"; now not a port
  c = CreateOnHashStore(o);
  ASSERT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("master_port 0 is not a TCP port"));

  o.master_port.reset();
  o.master_addr = "";
  c = CreateOnHashStore(o);
  ASSERT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("master_addr is set but empty"));
}

// A one-rank backend that records the timeout of every op it runs.
class TimeoutRecorder final : public Backend {
 public:
  const char* name() const override { return "recorder"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Capabilities capabilities() const override { return Capabilities{}; }
  absl::Status Supports(const OpDesc&) const override { return absl::OkStatus(); }
  absl::Status Run(const OpDesc& op) override {
    absl::MutexLock lock(&mu_);
    timeouts_.push_back(op.timeout);
    return absl::OkStatus();
  }
  void Abort(const absl::Status&) override {}
  absl::Status health() const override { return absl::OkStatus(); }

  std::vector<absl::Duration> timeouts() const {
    absl::MutexLock lock(&mu_);
    return timeouts_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<absl::Duration> timeouts_ ABSL_GUARDED_BY(mu_);
};

TEST(OptionsUnset, PerOpTimeoutUnsetTakesTheCommunicatorsSetOneWins) {
  auto owned = std::make_unique<TimeoutRecorder>();
  TimeoutRecorder* backend = owned.get();
  CommunicatorOptions o;
  o.timeout = absl::Seconds(7);  // the communicator's default bound
  o.max_retry_attempts = 1;
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      Communicator::CreateWithBackend(std::move(owned), o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  float x = 1;
  ASSERT_TRUE(c.Allreduce(HostView(&x, 1)).Wait().ok());
  ASSERT_TRUE(c.Allreduce(HostView(&x, 1), {.timeout = absl::Milliseconds(1500)}).Wait().ok());
  ASSERT_TRUE(c.Barrier().Wait().ok());
  ASSERT_TRUE(c.Barrier({.timeout = absl::Seconds(3)}).Wait().ok());
  EXPECT_EQ(backend->timeouts(),
            (std::vector<absl::Duration>{absl::Seconds(7), absl::Milliseconds(1500),
                                         absl::Seconds(7), absl::Seconds(3)}));
}

TEST(OptionsUnset, PerOpTimeoutSetToZeroOrLessIsRefusedNamingTheOp) {
  auto owned = std::make_unique<TimeoutRecorder>();
  TimeoutRecorder* backend = owned.get();
  CommunicatorOptions o;
  o.max_retry_attempts = 1;
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      Communicator::CreateWithBackend(std::move(owned), o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  Communicator& c = **comm;
  float x = 1, y = 1;
  // Zero used to mean "the communicator's default"; set, it is a bound nothing can meet.
  absl::Status s = c.Allreduce(HostView(&x, 1), {.timeout = absl::ZeroDuration()}).Wait();
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("allreduce: timeout must be positive, got 0"));
  s = c.Broadcast(HostView(&x, 1), {.timeout = absl::Seconds(-1)}).Wait();
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("broadcast: timeout must be positive, got -1s"));
  AllgatherOptions gather;
  gather.timeout = absl::ZeroDuration();
  s = c.Allgather(HostView(&x, 1), HostView(&y, 1), gather).Wait();
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("allgather: timeout must be positive"));
  EXPECT_TRUE(backend->timeouts().empty());    // refused before reaching the backend
  EXPECT_TRUE(c.health().ok()) << c.health();  // a refused op does not break the communicator
}

}  // namespace
}  // namespace adaptcomm
