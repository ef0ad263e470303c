// Host cost of a stream-ordered device collective (issue + Work::Wait) through the public API,
// against the bare sequence of the same seam calls a hand-written NCCL loop makes per op (event
// record on the caller's stream, stream wait on the communicator's stream, the NCCL call and, on
// a nonblocking communicator, the ncclCommGetAsyncError that says it is queued, event record after
// it, and the caller's stream waiting for that event, which is what Work::Wait does),
// both on the fake NCCL with its streams held: the "device" runs nothing while the host is timed,
// so only host cost is measured (and --ops is at most internal::kInFlightWithoutRetries, the ops
// the executor keeps in flight with retries off).
// Each loop is timed on its second pass, after an untimed one that grows what it grows
// (HeldMicrosPerOp). Same run, interleaved rounds, medians.
//
//   build/bench/stream_order_bench [--ops 1000] [--rounds 7] [--only bare|api] [--seams]
//                                  [--paced US] [--burst N] [--protection]
//
// --seams times every call into the fake, in both loops alike (bench/timed_seams.h: two clock
// reads a call), and splits each loop's host cost into the time spent inside the fake's calls and
// the rest: the same calls may cost more between the library's own code than in a tight loop.
// --only runs one of the two loops, for a profiler (`perf stat -e instructions:u` counts what a
// change saves without this machine's timing noise).
// --paced US measures instead how busy the host keeps a device that finishes one collective every
// US microseconds, with coordinated retry on (its small in-flight window) and off
// (PacedDeviceUtilization).
// --protection compares the library's loop with the default profile (coordinated retry on,
// retry.replay auto) against protection off (retry.max_attempts 1), paired rounds.
// --burst N measures how long a burst of N allreduces (issue + Wait each) holds the trainer's
// thread while the device takes --paced US (default 100) per op, with retry.in_flight 2, 8 and 32
// and with retries off (BurstHostMicros).
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/store.h"
#include "bench/timed_seams.h"
#include "lib/core/communicator/communicator_factory.h"
#include "lib/core/executor/op_executor.h"
#include "tests/fake_nccl_api.h"

namespace adaptcomm {
namespace {

using testing::FakeNcclApi;

// Host time per op of one loop, and (with --seams) the part spent inside the fake's calls.
struct HostCost {
  double us = 0;
  double in_seams_us = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Issues `ops` ops (issue(i)) with the fake's streams held, so that the "device" runs none of them
// while the host is timed, then lets the device run them (drain()). Twice: the first pass warms
// what the timed one would otherwise grow (the library's event pool, the fake's event table and
// call log, whose reallocation would be charged to whichever loop crossed its size), then the
// second is timed. Exits if the device ran an op while held. `seams`: the timings of the calls the
// loop makes into the fake, if they are timed.
template <typename Issue, typename Drain>
HostCost HeldMicrosPerOp(FakeNcclApi& api, bench::SeamTimes* seams, int ops, const char* what,
                         Issue issue, Drain drain) {
  HostCost cost;
  for (int pass = 0; pass < 2; ++pass) {
    const int before = api.collectives_started();
    api.HoldStreams(true);
    if (seams != nullptr) seams->Reset();
    const absl::Time start = absl::Now();
    for (int i = 0; i < ops; ++i) issue(i);
    cost.us = absl::ToDoubleMicroseconds(absl::Now() - start) / ops;
    if (seams != nullptr) cost.in_seams_us = seams->CallerMicrosPerOp(ops);
    const int started = api.collectives_started() - before;
    api.HoldStreams(false);
    drain();
    api.ClearCalls();  // keeps the log's capacity
    if (started != 0) {
      std::fprintf(stderr, "%s: the device ran %d ops while held\n", what, started);
      std::exit(1);
    }
  }
  return cost;
}

// The fake as the CUDA runtime and NCCL; with `timed`, each call is timed into `times`.
struct Seams {
  std::shared_ptr<FakeNcclApi> fake;
  std::shared_ptr<cuda::CudaApi> cuda;
  std::shared_ptr<nccl::NcclApi> nccl;
  std::shared_ptr<bench::SeamTimes> times;
};

Seams MakeSeams(bool timed) {
  Seams s;
  s.fake = std::make_shared<FakeNcclApi>(testing::MakeFakeNcclWorld(), testing::FakeNcclFaults{});
  s.cuda = s.fake;
  s.nccl = s.fake;
  if (timed) {
    s.times = std::make_shared<bench::SeamTimes>();
    s.cuda = std::make_shared<bench::TimedCudaApi>(s.fake, s.times);
    s.nccl = std::make_shared<bench::TimedNcclApi>(s.fake, s.times);
  }
  return s;
}

// The same calls per op as the backend makes, and Work::Wait after them, on pre-created events,
// nothing else.
HostCost BareMicrosPerOp(int ops, bool timed) {
  const Seams seams = MakeSeams(timed);
  cuda::CudaApi* const cu = seams.cuda.get();
  nccl::NcclApi* const api = seams.nccl.get();
  nccl::NcclUniqueId id;
  (void)api->GetUniqueId(&id);
  nccl::NcclComm comm = nullptr;
  nccl::NcclCommConfig nonblocking;
  nonblocking.blocking = 0;
  (void)api->CommInitRankConfig(&comm, 1, id, 0, nonblocking);
  cuda::CudaStream caller = nullptr, comm_stream = nullptr;
  (void)cu->StreamCreateNonBlocking(&caller);
  (void)cu->StreamCreateNonBlocking(&comm_stream);
  std::vector<cuda::CudaEvent> issued(static_cast<size_t>(ops)), done(static_cast<size_t>(ops));
  for (int i = 0; i < ops; ++i) {
    (void)cu->EventCreateDisableTiming(&issued[static_cast<size_t>(i)]);
    (void)cu->EventCreateDisableTiming(&done[static_cast<size_t>(i)]);
  }
  std::vector<float> buf(8, 1.0f);
  const HostCost cost = HeldMicrosPerOp(
      *seams.fake, seams.times.get(), ops, "bare",
      [&](int op) {
        const size_t i = static_cast<size_t>(op);
        (void)cu->EventRecord(issued[i], caller);
        (void)cu->StreamWaitEvent(comm_stream, issued[i]);
        const nccl::NcclResult r =
            api->AllReduce(buf.data(), buf.data(), buf.size(), nccl::NcclDataType::kFloat32,
                           nccl::NcclRedOp::kSum, comm, comm_stream);
        // The communicator is nonblocking (as adaptcomm's are: NCCL_COMM_BLOCKING 0): a call that
        // answers ncclInProgress is queued only once the communicator says so (NCCL docs,
        // "Fault Tolerance"), before the event after it may be recorded. The fake always answers
        // ncclInProgress, and its first query ncclSuccess.
        nccl::NcclResult state = nccl::NcclResult::kInProgress;
        while (r == nccl::NcclResult::kInProgress && state == nccl::NcclResult::kInProgress) {
          (void)api->CommGetAsyncError(comm, &state);
        }
        (void)cu->EventRecord(done[i], comm_stream);
        (void)cu->StreamWaitEvent(caller, done[i]);  // what Work::Wait does
      },
      [&] {
        // Both streams: work left queued on the caller's stream (its waits for the done events)
        // would be run by the timed pass's first call that forces it.
        if (cu->StreamSynchronize(comm_stream) != cuda::kCudaSuccess ||
            cu->StreamSynchronize(caller) != cuda::kCudaSuccess) {
          std::fprintf(stderr, "bare: synchronize failed\n");
          std::exit(1);
        }
      });
  (void)api->CommDestroy(comm);
  return cost;
}

// Allreduce on a CUDA view + Wait(), through a one-rank communicator on the fake (public API but
// for the internal factory that injects the fake).
// `profile`: a profile file (empty: the default one).
std::unique_ptr<Communicator> FakeCommunicator(const Seams& seams,
                                               std::optional<int> retry_attempts,
                                               const std::string& profile = "") {
  CommunicatorOptions o;
  if (!profile.empty()) o.profile_file = profile;
  o.rank = 0;
  o.world_size = 1;
  o.store = CreateHashStore();
  o.backend = BackendChoice::kNccl;
  o.max_retry_attempts = retry_attempts;
  o.timeout = absl::Seconds(60);
  internal::CommunicatorDeps deps;  // the fake as this rank's CUDA runtime and NCCL
  deps.use_given_apis = true;
  deps.cuda = seams.cuda;
  deps.nccl = seams.nccl;
  auto comm = internal::CreateCommunicatorWith(o, deps);
  if (!comm.ok()) {
    std::fprintf(stderr, "create: %s\n", comm.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(comm);
}

HostCost ApiMicrosPerOp(int ops, bool timed, std::optional<int> retry_attempts) {
  const Seams seams = MakeSeams(timed);
  FakeNcclApi* const api = seams.fake.get();
  std::unique_ptr<Communicator> comm = FakeCommunicator(seams, retry_attempts);
  cuda::CudaStream caller = nullptr;
  (void)api->StreamCreateNonBlocking(&caller);
  std::vector<float> buf(8, 1.0f);
  TensorView view{buf.data(), buf.size(), DType::kF32, Device::Cuda(0), caller};
  // The works are held until the pass ends, as a training step holds its ops' (each holds two
  // events of the pool until it goes).
  std::vector<Work> works;
  works.reserve(static_cast<size_t>(ops));
  return HeldMicrosPerOp(
      *api, seams.times.get(), ops, "adaptcomm",
      [&](int i) {
        works.push_back(comm->Allreduce(view));
        if (!works.back().Wait(absl::Seconds(10)).ok()) {
          std::fprintf(stderr, "op %d: wait failed\n", i);
          std::exit(1);
        }
      },
      [&] {
        if (!works.back().Synchronize(absl::Seconds(60)).ok() ||
            api->StreamSynchronize(caller) != cuda::kCudaSuccess) {
          std::fprintf(stderr, "adaptcomm: synchronize failed\n");
          std::exit(1);
        }
        works.clear();
        // A host op runs once the watchdog retired every op in flight (their events are back in
        // the pool).
        if (!comm->Barrier().Wait(absl::Seconds(60)).ok()) {
          std::fprintf(stderr, "adaptcomm: barrier after the pass failed\n");
          std::exit(1);
        }
      });
}

// A device that finishes one collective per `tick` (StepHeldDevice on a thread of its own) and a
// trainer that issues `ops` allreduces back to back, waiting on each (which blocks its thread only
// while the op cannot be queued on the device: the in-flight window is full). Returns the share
// of the device's steps that found an op to run: below 1, the device idled for lack of queued
// work, waiting for the host to notice that a slot of the window had freed.
double PacedDeviceUtilization(int ops, int retry_attempts, absl::Duration tick) {
  const Seams seams = MakeSeams(/*timed=*/false);
  FakeNcclApi* const api = seams.fake.get();
  std::unique_ptr<Communicator> comm = FakeCommunicator(seams, retry_attempts);
  cuda::CudaStream caller = nullptr;
  (void)api->StreamCreateNonBlocking(&caller);
  std::vector<float> buf(8, 1.0f);
  TensorView view{buf.data(), buf.size(), DType::kF32, Device::Cuda(0), caller};
  api->HoldStreams(true);
  std::atomic<bool> stop{false};
  std::atomic<int> steps{0}, ran{0};
  std::thread device([&] {
    while (!stop.load()) {
      absl::SleepFor(tick);
      // Counted from the first op on: before it the device idles because nothing was issued yet.
      const int started = api->StepHeldDevice();
      if (started > 0 || ran.load() > 0) {
        steps.fetch_add(1);
        ran.fetch_add(started);
      }
    }
  });
  std::vector<Work> works;
  works.reserve(static_cast<size_t>(ops));
  for (int i = 0; i < ops; ++i) {
    works.push_back(comm->Allreduce(view));
    if (!works.back().Wait(absl::Seconds(30)).ok()) {
      std::fprintf(stderr, "paced op %d: wait failed\n", i);
      std::exit(1);
    }
  }
  const bool synced = works.back().Synchronize(absl::Seconds(60)).ok();
  stop.store(true);
  device.join();
  api->HoldStreams(false);
  if (!synced || ran.load() != ops) {
    std::fprintf(stderr, "paced: %d of %d ops ran on the device\n", ran.load(), ops);
    std::exit(1);
  }
  return static_cast<double>(ran.load()) / steps.load();
}
// A profile whose coordinated retry keeps `in_flight` device ops in flight (retry.in_flight).
std::string WindowProfile(int in_flight) {
  char dir[] = "/tmp/adaptcomm_stream_order_bench_XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::perror("mkdtemp");
    std::exit(1);
  }
  const std::string path = std::string(dir) + "/profile.yaml";
  std::ofstream(path) << "schema: 1\ndefaults:\n  retry:\n    in_flight: " << in_flight
                      << "\ntiers:\n  - name: bench\n    params: any\n";
  return path;
}

// A device that finishes one collective per `tick` and a trainer that issues a burst of `ops`
// allreduces, waiting on each (a backward pass's gradient buckets): how long the trainer's thread
// is held, in microseconds. Ops beyond the in-flight window wait for the device there.
double BurstHostMicros(int ops, int retry_attempts, const std::string& profile,
                       absl::Duration tick) {
  const Seams seams = MakeSeams(/*timed=*/false);
  FakeNcclApi* const api = seams.fake.get();
  std::unique_ptr<Communicator> comm = FakeCommunicator(seams, retry_attempts, profile);
  cuda::CudaStream caller = nullptr;
  (void)api->StreamCreateNonBlocking(&caller);
  std::vector<std::vector<float>> bufs(static_cast<size_t>(ops), std::vector<float>(8, 1.0f));
  api->HoldStreams(true);
  std::atomic<bool> stop{false};
  std::thread device([&] {
    while (!stop.load()) {
      absl::SleepFor(tick);
      (void)api->StepHeldDevice();
    }
  });
  std::vector<Work> works;
  const absl::Time start = absl::Now();
  for (int i = 0; i < ops; ++i) {
    std::vector<float>& buf = bufs[static_cast<size_t>(i)];
    works.push_back(
        comm->Allreduce(TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(0), caller}));
    if (!works.back().Wait(absl::Seconds(30)).ok()) {
      std::fprintf(stderr, "burst op %d: wait failed\n", i);
      std::exit(1);
    }
  }
  const double held_us = absl::ToDoubleMicroseconds(absl::Now() - start);
  const bool synced = works.back().Synchronize(absl::Seconds(60)).ok();
  stop.store(true);
  device.join();
  api->HoldStreams(false);
  if (!synced) {
    std::fprintf(stderr, "burst: synchronize failed\n");
    std::exit(1);
  }
  return held_us;
}
}  // namespace
}  // namespace adaptcomm

int main(int argc, char** argv) {
  int ops = 1000, rounds = 7;
  std::string only;
  int paced_us = 0, burst = 0;
  bool seams = false, protection = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seams") == 0) seams = true;
    if (std::strcmp(argv[i], "--ops") == 0 && i + 1 < argc) ops = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    if (std::strcmp(argv[i], "--paced") == 0 && i + 1 < argc) paced_us = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--burst") == 0 && i + 1 < argc) burst = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--protection") == 0) protection = true;
    // Debian's abseil checks every Mutex acquisition for lock-order cycles (a graph update per
    // lock): a process-wide setting that only the application may turn off.
    if (std::strcmp(argv[i], "--no-deadlock-detection") == 0) {
      absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    }
  }
  // The device is held while a loop is timed: an op past the window of ops in flight could not be
  // queued until the device ran one, so its Wait would only time out.
  if (paced_us == 0 && burst == 0 &&
      (ops < 1 || static_cast<size_t>(ops) > adaptcomm::internal::kInFlightWithoutRetries)) {
    std::fprintf(stderr,
                 "--ops %d: must be 1..%zu (ops in flight at once with retries off; the device is "
                 "held while the loop is timed)\n",
                 ops, adaptcomm::internal::kInFlightWithoutRetries);
    return 2;
  }
  if (burst > 0) {
    const int tick_us = paced_us > 0 ? paced_us : 100;
    const absl::Duration tick = absl::Microseconds(tick_us);
    const int windows[] = {2, 8, 32};
    std::vector<std::string> profiles;
    for (int w : windows) profiles.push_back(adaptcomm::WindowProfile(w));
    std::vector<std::vector<double>> with_retry(std::size(windows));
    std::vector<double> without;
    for (int r = 0; r < rounds; ++r) {
      for (size_t w = 0; w < std::size(windows); ++w) {
        with_retry[w].push_back(adaptcomm::BurstHostMicros(burst, 3, profiles[w], tick));
      }
      without.push_back(adaptcomm::BurstHostMicros(burst, 1, "", tick));
    }
    std::printf(
        "host held by a burst of %d allreduces (issue + Wait each), device %d us per op "
        "(median of %d)\n",
        burst, tick_us, rounds);
    for (size_t w = 0; w < std::size(windows); ++w) {
      std::printf("  retry on, retry.in_flight %-3d %8.0f us\n", windows[w],
                  adaptcomm::Median(with_retry[w]));
    }
    std::printf("  retry off                   %8.0f us\n", adaptcomm::Median(without));
    return 0;
  }
  if (paced_us > 0) {
    std::vector<double> with_retry, without;
    for (int r = 0; r < rounds; ++r) {
      const absl::Duration tick = absl::Microseconds(paced_us);
      with_retry.push_back(adaptcomm::PacedDeviceUtilization(ops, /*retry_attempts=*/3, tick));
      without.push_back(adaptcomm::PacedDeviceUtilization(ops, /*retry_attempts=*/1, tick));
    }
    std::printf(
        "device busy share, one collective per %d us, %d ops issued + waited (median of %d)\n",
        paced_us, ops, rounds);
    std::printf("  coordinated retry on     %8.2f\n", adaptcomm::Median(with_retry));
    std::printf("  coordinated retry off    %8.2f\n", adaptcomm::Median(without));
    return 0;
  }
  if (protection) {
    // The default profile (coordinated retry on, retry.replay auto) against protection off, the
    // same loop alternately: what protection costs a device op's issue + Wait when nothing fails.
    std::vector<double> on, off, paired;
    for (int r = 0; r < rounds; ++r) {
      on.push_back(adaptcomm::ApiMicrosPerOp(ops, false, /*retry_attempts=*/std::nullopt).us);
      off.push_back(adaptcomm::ApiMicrosPerOp(ops, false, /*retry_attempts=*/1).us);
      paired.push_back(on.back() / off.back());
    }
    std::sort(paired.begin(), paired.end());
    std::printf("stream-ordered allreduce, %d ops issued + waited, device held (median of %d)\n",
                ops, rounds);
    std::printf("  default profile (retry on, replay auto) %8.2f us\n", adaptcomm::Median(on));
    std::printf("  protection off (retry.max_attempts 1)   %8.2f us\n", adaptcomm::Median(off));
    std::printf("  ratio (paired rounds)                   %8.2fx (quartiles %.2f-%.2f)\n",
                adaptcomm::Median(paired), paired[paired.size() / 4],
                paired[(3 * paired.size()) / 4]);
    return 0;
  }
  std::vector<double> bare, api_us, bare_seams, api_seams;
  for (int r = 0; r < rounds; ++r) {
    if (only != "api") {
      const adaptcomm::HostCost c = adaptcomm::BareMicrosPerOp(ops, seams);
      bare.push_back(c.us);
      bare_seams.push_back(c.in_seams_us);
    }
    if (only == "bare") continue;
    const adaptcomm::HostCost c = adaptcomm::ApiMicrosPerOp(ops, seams, /*retry_attempts=*/1);
    api_us.push_back(c.us);
    api_seams.push_back(c.in_seams_us);
  }
  if (!only.empty()) {
    const std::vector<double>& ran = only == "bare" ? bare : api_us;
    std::printf("%s: %.2f us per op (median of %d)\n", only.c_str(), adaptcomm::Median(ran),
                rounds);
    return 0;
  }
  // Each round's two loops run back to back, so their ratio shares the machine's state of the
  // moment (a VM's slow phases move both): the median of those paired ratios is the figure, and the
  // ratio of the medians is printed beside it.
  std::vector<double> paired;
  for (size_t r = 0; r < bare.size(); ++r) paired.push_back(api_us[r] / bare[r]);
  std::sort(paired.begin(), paired.end());
  const double b = adaptcomm::Median(bare), a = adaptcomm::Median(api_us);
  std::printf("stream-ordered allreduce, %d ops issued + waited, device held (median of %d)%s\n",
              ops, rounds, seams ? ", every call into the fake timed" : "");
  std::printf("  bare seam calls per op   %8.2f us\n", b);
  std::printf("  adaptcomm issue + Wait   %8.2f us\n", a);
  std::printf("  ratio (paired rounds)    %8.2fx  (quartiles %.2f-%.2f; ratio of medians %.2fx)\n",
              adaptcomm::Median(paired), paired[paired.size() / 4], paired[(3 * paired.size()) / 4],
              a / b);
  if (seams) {
    const double bs = adaptcomm::Median(bare_seams), as = adaptcomm::Median(api_seams);
    std::printf(
        "  inside the fake's calls: bare %.2f us, adaptcomm %.2f us (%.2fx the same calls)\n", bs,
        as, as / bs);
    std::printf("  outside them:            bare %.2f us, adaptcomm %.2f us\n", b - bs, a - as);
  }
  return 0;
}
