// Backend selection across thread ranks: the truth table on fakes (all capable -> NCCL; one rank
// not -> Gloo everywhere, staged for device views, naming the rank; deny -> error everywhere),
// init timeouts, old versions, a library missing a symbol, and the real loader on this machine.
#include <sys/stat.h>

#include <functional>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/base/cpu_binding.h"
#include "lib/base/log.h"
#include "lib/core/selection/backend_selection.h"
#include "lib/nccl/nccl_backend.h"
#include "tests/fake_nccl_api.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using internal::selection::SelectedBackend;
using internal::selection::SelectionDeps;
using testing::FakeNcclApi;
using testing::FakeNcclFaults;
using ::testing::HasSubstr;

struct Outcome {
  std::vector<absl::StatusOr<SelectedBackend>> result;
  std::vector<std::shared_ptr<FakeNcclApi>> apis;
};

// Runs selection on `n` thread ranks. `setup` adjusts each rank's faults and deps (deps.nccl is
// preset to that rank's fake; setting it to null simulates a failed load).
Outcome Select(int n, CommunicatorOptions base,
               const std::function<void(int, FakeNcclFaults&)>& faults,
               const std::function<void(int, SelectionDeps&)>& deps_setup = nullptr,
               absl::Duration bound = absl::Seconds(20)) {
  Outcome out;
  auto world = testing::MakeFakeNcclWorld();
  auto store = CreateHashStore();
  for (int i = 0; i < n; ++i) {
    FakeNcclFaults f;
    if (faults) faults(i, f);
    out.apis.push_back(std::make_shared<FakeNcclApi>(world, f));
  }
  for (int i = 0; i < n; ++i) out.result.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      log::ScopedThreadRank rank_for_log(i);
      CommunicatorOptions o = base;
      o.rank = i;
      o.world_size = n;
      // Create() fills these from the profile before selection; here selection runs alone.
      if (!o.timeout) o.timeout = absl::Seconds(60);
      if (!o.init_timeout) o.init_timeout = absl::Seconds(30);
      internal::Rendezvous rv;
      rv.root_store = store;
      rv.store = CreatePrefixStore("comm", store);
      rv.transport_host = "127.0.0.1";
      SelectionDeps deps;
      deps.use_given_apis = true;
      deps.nccl = out.apis[i];
      deps.cuda = out.apis[i];
      if (deps_setup) deps_setup(i, deps);
      out.result[i] = internal::selection::SelectBackendWith(o, rv, absl::Now() + bound, deps);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TensorView Dev(float* data, size_t count) {
  return TensorView{data, count, DType::kF32, Device::Cuda(0), nullptr};
}

// A device-view allreduce (sum) on every rank's selected backend; checks the values.
void ExpectAllreduceWorks(Outcome& out) {
  const int n = static_cast<int>(out.result.size());
  std::vector<std::vector<float>> data(n);
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    data[i] = {1.0f + i, 10.0f};
    threads.emplace_back([&, i] {
      OpDesc d;
      d.kind = OpKind::kAllreduce;
      d.input = d.output = Dev(data[i].data(), 2);
      d.timeout = absl::Seconds(10);
      status[i] = out.result[i]->backend->Supports(d);
      if (status[i].ok()) status[i] = out.result[i]->backend->Run(d);
    });
  }
  for (auto& t : threads) t.join();
  const float sum = n * (n + 1) / 2.0f;
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(status[i].ok()) << "rank " << i << ": " << status[i];
    EXPECT_FLOAT_EQ(data[i][0], sum) << "rank " << i;
    EXPECT_FLOAT_EQ(data[i][1], 10.0f * n) << "rank " << i;
  }
}

TEST(NcclSelection, AllRanksCapableChoosesNccl) {
  Outcome out = Select(4, {}, nullptr);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(out.result[i].ok()) << "rank " << i << ": " << out.result[i].status();
    EXPECT_STREQ(out.result[i]->backend->name(), "nccl");
    EXPECT_THAT(out.result[i]->reason, HasSubstr("backend=auto: nccl on every rank (NCCL 2.28.9 "
                                                 "from fake://libnccl.so.2, cuda:0)"));
    EXPECT_EQ(out.apis[i]->init_calls(), 1);
  }
  ExpectAllreduceWorks(out);
}

TEST(NcclSelection, OneRankWithoutNcclMakesEveryRankUseStagedGloo) {
  Outcome out = Select(4, {}, nullptr, [](int i, SelectionDeps& d) {
    if (i == 3) {
      d.nccl = nullptr;  // its CUDA still works: staging applies there too
      d.nccl_load_error = absl::UnavailableError(
          "libnccl.so.2: cannot open shared object file: No such file or directory");
    }
  });
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(out.result[i].ok()) << "rank " << i << ": " << out.result[i].status();
    // Every rank is on this host: auto's host-memory fallback is shm (staged like Gloo).
    EXPECT_STREQ(out.result[i]->backend->name(), "shm+staged") << "rank " << i;
    EXPECT_THAT(out.result[i]->reason, HasSubstr("shm: all 4 ranks on "));
    EXPECT_THAT(out.result[i]->reason,
                HasSubstr("because NCCL is not usable: rank 3: libnccl.so.2: "
                          "cannot open shared object file"));
    EXPECT_THAT(out.result[i]->reason, HasSubstr("staged through pinned host memory"));
    EXPECT_EQ(out.apis[i]->init_calls(), 0) << "no rank may start NCCL init";
  }
  ExpectAllreduceWorks(out);
  // One copy each way per device view.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out.apis[i]->memcpy_calls(), 2) << "rank " << i;
}

TEST(NcclSelection, DenyFailsOnEveryRankWithTheReason) {
  CommunicatorOptions o;
  o.backend = BackendChoice::kNccl;
  o.fallback = Fallback::kDeny;
  Outcome out = Select(3, o, [](int i, FakeNcclFaults& f) {
    if (i == 1) f.device_count_error = cuda::kCudaErrorNoDevice;
  });
  for (int i = 0; i < 3; ++i) {
    ASSERT_FALSE(out.result[i].ok()) << "rank " << i;
    EXPECT_EQ(out.result[i].status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(out.result[i].status().message(),
                HasSubstr("backend=nccl with fallback deny: NCCL is not usable on every rank: "
                          "rank 1: no CUDA device (cudaGetDeviceCount: cudaErrorNoDevice"));
  }
}

TEST(NcclSelection, OldVersionIsRefusedNamingTheVersion) {
  Outcome out = Select(2, {}, [](int i, FakeNcclFaults& f) {
    if (i == 1) f.version = 21305;
  });
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(out.result[i].ok()) << out.result[i].status();
    EXPECT_STREQ(out.result[i]->backend->name(), "shm+staged");  // one host: shm
    EXPECT_THAT(out.result[i]->reason,
                HasSubstr("rank 1: NCCL 2.13.5 from fake://libnccl.so.2 is older than the "
                          "minimum NCCL 2.14.0"));
  }
  // The pre-2.9 version scheme (2.8.4 = 2804) is decoded, not taken for 0.2804.
  Outcome old = Select(1, {}, [](int, FakeNcclFaults& f) { f.version = 2804; });
  ASSERT_TRUE(old.result[0].ok());
  EXPECT_THAT(old.result[0]->reason, HasSubstr("NCCL 2.8.4 from fake://libnccl.so.2 is older"));
}

TEST(NcclSelection, InitTimeoutAbortsThenFallsBackOrFailsPerPolicy) {
  for (Fallback policy : {Fallback::kAllow, Fallback::kDeny}) {
    CommunicatorOptions o;
    o.fallback = policy;
    const absl::Time start = absl::Now();
    Outcome out = Select(
        3, o, [](int i, FakeNcclFaults& f) { f.init_never_finishes = i == 2; }, nullptr,
        absl::Seconds(3));
    // Init gets half of the 3 s; Gloo the rest.
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(out.apis[i]->abort_calls(), 1) << "rank " << i;
      if (policy == Fallback::kAllow) {
        ASSERT_TRUE(out.result[i].ok()) << out.result[i].status();
        EXPECT_STREQ(out.result[i]->backend->name(), "shm+staged");  // one host: shm
        EXPECT_THAT(out.result[i]->reason,
                    HasSubstr("rank 2: NCCL init of rank 2 on cuda:0 did not finish within"));
      } else {
        ASSERT_FALSE(out.result[i].ok());
        // A failed init may pass next time: Unavailable, which creation retries on every rank.
        EXPECT_EQ(out.result[i].status().code(), absl::StatusCode::kUnavailable);
        EXPECT_THAT(out.result[i].status().message(),
                    HasSubstr("fallback deny: NCCL is not usable on every rank: "));
        EXPECT_THAT(out.result[i].status().message(), HasSubstr("rank 2: NCCL init of rank 2"));
      }
    }
  }
}

TEST(NcclSelection, InitFailureOnOneRankAbortsTheOthersInit) {
  // Rank 0 fails fast; rank 1's init can then never complete. Rank 1 sees rank 0's published
  // failure, abandons its init at once (aborting it) instead of waiting out the init timeout (1 s
  // of the 2 s here), and both agree on Gloo. Nobody finalizes a communicator that never worked.
  const absl::Time start = absl::Now();
  Outcome out = Select(
      2, {}, [](int i, FakeNcclFaults& f) { f.init_fails = i == 0; }, nullptr, absl::Seconds(2));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(out.result[i].ok()) << out.result[i].status();
    EXPECT_THAT(out.result[i]->reason, HasSubstr("rank 0: NCCL init of rank 0 on cuda:0: "
                                                 "ncclSystemError"));
    EXPECT_THAT(out.result[i]->reason,
                HasSubstr("rank 1: NCCL init of rank 1 on cuda:0 abandoned (rank 0 failed)"));
    EXPECT_EQ(out.apis[i]->abort_calls(), 1);
    EXPECT_EQ(out.apis[i]->finalize_calls(), 0);
  }
}

TEST(NcclSelection, GlooRequestedNeverTouchesNccl) {
  CommunicatorOptions o;
  o.backend = BackendChoice::kGloo;
  Outcome out = Select(2, o, [](int, FakeNcclFaults& f) { f.device_count = 0; });
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(out.result[i].ok()) << out.result[i].status();
    EXPECT_STREQ(out.result[i]->backend->name(), "gloo");  // no device: no staging
    // (On a one-CPU machine the reason goes on: GlooOnARankConfinedToOneCpuSaysSoInItsReason.)
    if (AllowedCpuCount() > 1) {
      EXPECT_EQ(out.result[i]->reason, "backend=gloo requested");
    }
    EXPECT_EQ(out.apis[i]->init_calls(), 0);
  }
}

// Gloo hands every op between the caller, the executor's worker and its own I/O thread: a rank
// confined to one CPU (as `adaptcomm launch --bind-to auto` leaves it where the host has a core
// per rank) is told why its small ops are slow, and how to launch instead.
TEST(NcclSelection, GlooOnARankConfinedToOneCpuSaysSoInItsReason) {
  const std::vector<std::vector<int>> cores = AllowedCores();
  ASSERT_FALSE(cores.empty());
  CommunicatorOptions o;
  o.backend = BackendChoice::kGloo;
  Outcome out = Select(
      2, o, [](int, FakeNcclFaults& f) { f.device_count = 0; },
      [&](int i, SelectionDeps&) {
        if (i == 0) {
          ASSERT_TRUE(BindCallingThread({cores.front().front()}).ok());
        }
      });
  ASSERT_TRUE(out.result[0].ok()) << out.result[0].status();
  EXPECT_EQ(out.result[0]->reason,
            "backend=gloo requested; this rank may run on one CPU only (its affinity), where "
            "gloo's threads take turns on every op: small ops run several times slower "
            "(`adaptcomm launch --bind-to none`, or 2 or more CPUs per rank)");
  ASSERT_TRUE(out.result[1].ok()) << out.result[1].status();
  if (AllowedCpuCount() > 1) {
    EXPECT_EQ(out.result[1]->reason, "backend=gloo requested");
  }
}

TEST(NcclSelection, LibraryMissingASymbolIsReportedByName) {
  absl::StatusOr<std::shared_ptr<nccl::NcclApi>> api = nccl::LoadNcclApi("libm.so.6");
  ASSERT_FALSE(api.ok());
  if (!cuda::CudaBuiltIn()) {
    EXPECT_THAT(api.status().message(), HasSubstr("NCCL backend not built"));
    return;
  }
  EXPECT_EQ(api.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(api.status().message(), HasSubstr("libm.so.6 lacks the symbol ncclGetVersion"));
  Outcome out = Select(2, {}, nullptr, [&](int i, SelectionDeps& d) {
    if (i == 0) {
      d.nccl = nullptr;
      d.nccl_load_error = api.status();
    }
  });
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(out.result[i].ok());
    EXPECT_THAT(out.result[i]->reason, HasSubstr("rank 0: "));
    EXPECT_THAT(out.result[i]->reason, HasSubstr("lacks the symbol ncclGetVersion"));
  }
  absl::StatusOr<std::shared_ptr<nccl::NcclApi>> missing =
      nccl::LoadNcclApi("/nonexistent/libnccl.so.2");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot open shared object file"));
}

TEST(NcclSelection, RealLoaderOnThisMachineFallsBackWithTheRealReason) {
  // This machine: NCCL installed, no GPU (a GPU machine runs bench/gpu_check.sh instead).
  auto cuda = cuda::LoadCudaApi();
  int devices = 0;
  if (cuda.ok() && (*cuda)->GetDeviceCount(&devices) == cuda::kCudaSuccess && devices > 0) {
    GTEST_SKIP() << "a CUDA device is visible; covered by bench/gpu_check.sh";
  }
  absl::StatusOr<std::shared_ptr<nccl::NcclApi>> api = nccl::LoadNcclApi();
  std::string path;
  if (cuda::CudaBuiltIn() && api.ok()) {
    path = (*api)->library_path();
    struct stat st;
    EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_THAT(path, HasSubstr("libnccl.so"));
    int version = 0;
    EXPECT_EQ((*api)->GetVersion(&version), nccl::NcclResult::kSuccess);
    EXPECT_GE(nccl::NormalizeNcclVersion(version), nccl::kMinNcclVersion);
  }
  std::vector<std::string> reasons(2);
  std::vector<std::string> names(2);
  testing::RunRanks(testing::RankMode::kThreads, 2, [&](const testing::RankEnv& env) {
    CommunicatorOptions o = env.options;
    o.init_timeout = absl::Seconds(30);
    o.backend = BackendChoice::kAuto;  // the harness asks for gloo
    auto comm = Communicator::Create(o);
    ASSERT_TRUE(comm.ok()) << comm.status();
    reasons[env.rank] = (*comm)->selection_reason();
    names[env.rank] = (*comm)->backend_name();
    std::vector<float> x = {1.0f + env.rank};
    EXPECT_TRUE((*comm)->Allreduce(HostView(x.data(), 1)).Wait().ok());
    EXPECT_FLOAT_EQ(x[0], 3.0f);
  });
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(names[i], "shm");  // both ranks on this host
    if (!cuda::CudaBuiltIn()) {
      EXPECT_THAT(reasons[i], HasSubstr("ranks 0, 1: NCCL backend not built"));
    } else if (api.ok()) {
      EXPECT_THAT(reasons[i], HasSubstr("ranks 0, 1: no CUDA device (cudaGetDeviceCount: "));
      EXPECT_THAT(reasons[i], HasSubstr(absl::StrCat("from ", path)));
    } else {
      EXPECT_THAT(reasons[i], HasSubstr(std::string(api.status().message())));
    }
  }
}

}  // namespace
}  // namespace adaptcomm
