// The demo: data-parallel training of a small MLP with adaptcomm.
//
//   adaptcomm launch -n 4 -- adaptcomm_trainer            # 4 ranks, each on a quarter of the data
//   adaptcomm_trainer --reference --shards 4 --out ref.txt  # the same training in one process
//   adaptcomm launch --elastic -n 4 -- adaptcomm_trainer --elastic --kill-rank 2 --kill-step 30
//                                       # rank 2 dies at step 30; the other 3 finish the training
//   adaptcomm launch --elastic --max-restarts 1 -n 4 -- adaptcomm_trainer --elastic --kill-rank 2
//                                       # ... and a replacement joins: it finishes on 4 again
//
// Each rank computes the gradient on its shard and averages it over all ranks through a
// GradientBucketer (the model's four tensors, marked ready last layer first, as backward produces
// them), so every rank applies the full-data gradient and the weights stay identical everywhere;
// the final weights equal single-process training on the same data (tests/demo_test.cc checks
// it). The elastic loop keeps one allreduce: its step sums gradient, loss and shard size together.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "adaptcomm/adaptcomm.h"
#include "adaptcomm/bucketer.h"
#include "examples/mlp.h"

namespace {

struct Flags {
  int steps = 200;
  size_t samples = 4096;
  int inputs = 16;
  int hidden = 64;
  float learning_rate = 0.1f;
  int log_every = 20;
  bool reference = false;
  int shards = 1;
  std::string out;
  bool elastic = false;  // go on without a rank that dies (README, "Elastic membership")
  int kill_rank = -1;    // fault injection: this rank (at start) kills itself (SIGKILL)...
  int kill_step = 0;     // ...when it reaches this step
  // Fault injection: this rank stops (SIGSTOP) inside this step, and a helper process continues
  // it after stop_seconds (a stalled rank that comes back: its peers time out and redo the step).
  int stop_rank = -1;
  int stop_step = 0;
  int stop_seconds = 15;
  // Monitoring demos: each step also sleeps this long (a stand-in for compute), and the ranks keep
  // their communicator this long after the last step, so that a scraper sees the final counts.
  int pace_ms = 0;
  int hold_seconds = 0;
};

bool ParseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps")
      f.steps = std::atoi(value("--steps"));
    else if (a == "--samples")
      f.samples = std::strtoul(value("--samples"), nullptr, 10);
    else if (a == "--hidden")
      f.hidden = std::atoi(value("--hidden"));
    else if (a == "--lr")
      f.learning_rate = std::strtof(value("--lr"), nullptr);
    else if (a == "--log-every")
      f.log_every = std::atoi(value("--log-every"));
    else if (a == "--shards")
      f.shards = std::atoi(value("--shards"));
    else if (a == "--out")
      f.out = value("--out");
    else if (a == "--reference")
      f.reference = true;
    else if (a == "--elastic")
      f.elastic = true;
    else if (a == "--kill-rank")
      f.kill_rank = std::atoi(value("--kill-rank"));
    else if (a == "--kill-step")
      f.kill_step = std::atoi(value("--kill-step"));
    else if (a == "--stop-rank")
      f.stop_rank = std::atoi(value("--stop-rank"));
    else if (a == "--stop-step")
      f.stop_step = std::atoi(value("--stop-step"));
    else if (a == "--stop-seconds")
      f.stop_seconds = std::atoi(value("--stop-seconds"));
    else if (a == "--pace-ms")
      f.pace_ms = std::atoi(value("--pace-ms"));
    else if (a == "--hold")
      f.hold_seconds = std::atoi(value("--hold"));
    else {
      std::fprintf(
          stderr,
          "usage: %s [--steps N] [--samples N] [--hidden N] [--lr X] [--log-every N] "
          "[--out FILE] [--reference --shards N] [--elastic [--kill-rank R --kill-step S]] "
          "[--stop-rank R --stop-step S [--stop-seconds T]] [--pace-ms N] [--hold S]\n",
          argv[0]);
      return a == "--help" || a == "-h" ? (std::exit(0), false) : false;
    }
  }
  return f.steps > 0 && f.samples > 0 && f.hidden > 0 && f.shards > 0 && f.log_every > 0 &&
         f.pace_ms >= 0 && f.hold_seconds >= 0;
}

void WriteWeights(const std::string& path, const std::vector<float>& params) {
  if (path.empty()) return;
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  for (float p : params) std::fprintf(f, "%.9g\n", p);
  std::fclose(f);
}

// The same training in one process: the gradient of each of `shards` equal shards, averaged.
int RunReference(const Flags& f) {
  auto data = adaptcomm::examples::MakeRegressionSet(f.samples, f.inputs, 1234);
  adaptcomm::examples::Mlp model(f.inputs, f.hidden, 42);
  std::vector<float> grad, sum;
  const size_t shard = f.samples / f.shards;
  for (int step = 1; step <= f.steps; ++step) {
    sum.assign(model.params().size(), 0.0f);
    double loss = 0;
    for (int s = 0; s < f.shards; ++s) {
      loss += model.LossAndGradient(data, s * shard, (s + 1) * shard, grad);
      for (size_t k = 0; k < sum.size(); ++k) sum[k] += grad[k];
    }
    for (float& g : sum) g /= static_cast<float>(f.shards);
    model.Step(sum, f.learning_rate);
    if (step % f.log_every == 0 || step == f.steps) {
      std::printf("step %d loss %.6f\n", step, loss / f.shards);
    }
  }
  WriteWeights(f.out, model.params());
  return 0;
}

// The elastic loop a trainer writes (README, "Elastic membership"). The step's one allreduce sums
// [gradient x shard size, loss x shard size, shard size] over the ranks, each rank taking its
// shard of the data under the membership it sees; the full-data gradient is that sum divided by
// the number of samples. When a rank is lost mid-step the survivors' shards no longer cover the
// data (the summed shard size is not the number of samples): every rank sees the same sum, so
// every rank redoes the step, on the new membership's shards. No rank decides alone.
//
// At the end of each step the members admit the replacements waiting to join (AdmitJoiners: one
// store request on rank 0 and a 16-byte broadcast when nobody waits); when the world grew, rank 0
// broadcasts the state a replacement needs (the next step and the weights), which the replacement
// receives right after it is created.
absl::Status SendState(adaptcomm::Communicator& comm, int64_t& next_step,
                       std::vector<float>& params) {
  absl::Status s = comm.Broadcast(adaptcomm::HostView(&next_step, 1)).Wait();
  if (s.ok()) s = comm.Broadcast(adaptcomm::HostView(params.data(), params.size())).Wait();
  return s;
}

int RunElastic(const Flags& f) {
  adaptcomm::CommunicatorOptions options;
  options.elastic.on_loss = adaptcomm::LossPolicy::kShrink;  // ADAPTCOMM_ELASTIC not needed
  options.elastic.on_change = [](const adaptcomm::Membership& m) {
    std::fprintf(stderr, "membership changed: now rank %d of %d (%s)\n", m.rank, m.world_size,
                 m.reason.c_str());
  };
  absl::StatusOr<std::unique_ptr<adaptcomm::Communicator>> created =
      adaptcomm::Communicator::Create(options);
  if (!created.ok()) {
    std::fprintf(stderr, "cannot create the communicator: %s\n",
                 created.status().ToString().c_str());
    return adaptcomm::kExitCommunicationFailure;
  }
  adaptcomm::Communicator& comm = **created;
  const bool replacement = comm.membership().joined;
  const int initial_rank = replacement ? -1 : comm.rank();  // a replacement is never killed
  if (comm.rank() == 0) {
    std::printf("adaptcomm demo (elastic): %d ranks, backend %s\n", comm.size(),
                comm.backend_name());
  }
  auto data = adaptcomm::examples::MakeRegressionSet(f.samples, f.inputs, 1234);
  adaptcomm::examples::Mlp model(f.inputs, f.hidden, 42);
  std::vector<float> grad, buf;
  int redone = 0;
  int64_t first_step = 1;
  if (replacement) {
    if (absl::Status s = SendState(comm, first_step, model.params()); !s.ok()) {
      std::fprintf(stderr, "replacement: receiving the state failed: %s\n", s.ToString().c_str());
      return adaptcomm::kExitCommunicationFailure;
    }
    std::fprintf(stderr, "replacement: joined as rank %d of %d, going on at step %lld\n",
                 comm.rank(), comm.size(), static_cast<long long>(first_step));
  }
  for (int step = static_cast<int>(first_step); step <= f.steps; ++step) {
    if (initial_rank == f.kill_rank && step == f.kill_step) raise(SIGKILL);
    const int rank = comm.rank(), world = comm.size();
    const size_t begin = f.samples * rank / world, end = f.samples * (rank + 1) / world;
    const double loss = model.LossAndGradient(data, begin, end, grad);
    const float n = static_cast<float>(end - begin);
    buf.resize(grad.size() + 2);
    for (size_t k = 0; k < grad.size(); ++k) buf[k] = grad[k] * n;
    buf[grad.size()] = static_cast<float>(loss) * n;
    buf[grad.size() + 1] = n;
    absl::Status s = comm.Allreduce(adaptcomm::HostView(buf.data(), buf.size())).Wait();
    if (!s.ok() && !adaptcomm::IsMembershipChanged(s)) {
      std::fprintf(stderr, "step %d: allreduce failed: %s\n", step, s.ToString().c_str());
      return adaptcomm::kExitCommunicationFailure;
    }
    if (!s.ok() || buf[grad.size() + 1] != static_cast<float>(f.samples)) {
      ++redone;  // the membership changed during the step: redo it on the new one
      --step;
      continue;
    }
    for (size_t k = 0; k < grad.size(); ++k) grad[k] = buf[k] / static_cast<float>(f.samples);
    model.Step(grad, f.learning_rate);
    if (comm.rank() == 0 && (step % f.log_every == 0 || step == f.steps)) {
      std::printf("step %d loss %.6f  world %d\n", step, buf[grad.size()] / f.samples, comm.size());
    }
    if (step == f.steps) break;
    absl::Status admitted = comm.AdmitJoiners();
    if (adaptcomm::IsMembershipChanged(admitted)) {
      int64_t next = step + 1;
      admitted = SendState(comm, next, model.params());
    }
    if (!admitted.ok()) {
      std::fprintf(stderr, "step %d: admitting joiners failed: %s\n", step,
                   admitted.ToString().c_str());
      return adaptcomm::kExitCommunicationFailure;
    }
  }
  if (comm.rank() == 0) {
    const adaptcomm::Membership m = comm.membership();
    std::printf("finished on %d ranks (%d membership change(s), %d step(s) redone)\n", m.world_size,
                m.changes, redone);
    WriteWeights(f.out, model.params());
  }
  return 0;
}

// Stops this process; a child continues it after `seconds`.
void StopFor(int seconds) {
  const pid_t self = getpid();
  if (fork() == 0) {
    sleep(static_cast<unsigned>(seconds));
    kill(self, SIGCONT);
    _exit(0);
  }
  std::fprintf(stderr, "rank stopping for %d s (--stop-rank)\n", seconds);
  raise(SIGSTOP);
}

int RunDistributed(const Flags& f) {
  absl::StatusOr<std::unique_ptr<adaptcomm::Communicator>> created =
      adaptcomm::Communicator::Create({});
  if (!created.ok()) {
    std::fprintf(stderr, "cannot create the communicator: %s\n",
                 created.status().ToString().c_str());
    return adaptcomm::kExitCommunicationFailure;
  }
  adaptcomm::Communicator& comm = **created;
  const int rank = comm.rank(), world = comm.size();
  if (f.samples % world != 0) {
    std::fprintf(stderr, "--samples %zu is not divisible by the world size %d\n", f.samples, world);
    return 2;
  }
  if (rank == 0) {
    std::printf("adaptcomm demo: %d ranks, backend %s (%s)\n", world, comm.backend_name(),
                comm.selection_reason().c_str());
  }
  auto data = adaptcomm::examples::MakeRegressionSet(f.samples, f.inputs, 1234);
  adaptcomm::examples::Mlp model(f.inputs, f.hidden, 42);
  const size_t shard = f.samples / world;
  // The model's tensors in its flat gradient (mlp.h: w1, b1, w2, b2), registered in model order.
  const size_t h = static_cast<size_t>(f.hidden), in = static_cast<size_t>(f.inputs);
  const size_t sizes[] = {h * in, h, h, 1};
  std::vector<adaptcomm::GradientSpec> specs = {
      {"w1", sizes[0]}, {"b1", sizes[1]}, {"w2", sizes[2]}, {"b2", sizes[3]}};
  auto bucketer = adaptcomm::GradientBucketer::Create(comm, specs, {});
  if (!bucketer.ok()) {
    std::fprintf(stderr, "cannot create the gradient bucketer: %s\n",
                 bucketer.status().ToString().c_str());
    return adaptcomm::kExitCommunicationFailure;
  }
  std::vector<float> grad;
  double comm_seconds = 0, comm_bytes = 0;
  int redone = 0;
  for (int step = 1; step <= f.steps; ++step) {
    // A step is committed on every rank or redone on every rank: the optimizer update comes only
    // after CommitStep, so a redo starts again from the same model (no copy of any gradient).
    absl::Status s = comm.BeginStep();
    if (rank == f.stop_rank && step == f.stop_step && redone == 0) StopFor(f.stop_seconds);
    float loss =
        static_cast<float>(model.LossAndGradient(data, rank * shard, (rank + 1) * shard, grad));
    auto t0 = std::chrono::steady_clock::now();
    if (s.ok()) {
      // Backward of this MLP yields every gradient at once; mark them as a layered model's
      // backward would, last layer first. Wait() writes the averages back into `grad`.
      const size_t offset[4] = {0, sizes[0], sizes[0] + sizes[1], sizes[0] + sizes[1] + sizes[2]};
      for (int t = 3; t >= 0 && s.ok(); --t) {
        s = (*bucketer)->MarkReady(t, adaptcomm::HostView(grad.data() + offset[t], sizes[t]));
      }
      absl::StatusOr<adaptcomm::BucketStepStats> reduced = (*bucketer)->Wait();
      if (s.ok()) s = reduced.status();
    }
    comm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    comm_bytes += grad.size() * sizeof(float);
    if (s.ok())
      s = comm.Allreduce(adaptcomm::HostView(&loss, 1), {adaptcomm::ReduceOp::kAvg}).Wait();
    // A failed op of the step is reported again by CommitStep, which says whether to redo.
    const absl::Status commit = comm.CommitStep();
    if (adaptcomm::IsStepRedo(commit)) {
      std::fprintf(stderr, "step %d: redone (%s)\n", step, commit.ToString().c_str());
      ++redone;
      --step;
      continue;
    }
    if (!commit.ok() || !s.ok()) {
      std::fprintf(stderr, "step %d failed: %s\n", step,
                   (commit.ok() ? s : commit).ToString().c_str());
      return adaptcomm::kExitCommunicationFailure;
    }
    model.Step(grad, f.learning_rate);
    if (rank == 0 && (step % f.log_every == 0 || step == f.steps)) {
      std::printf("step %d loss %.6f  gradient allreduce %.3f ms avg, %.1f MB/s algbw\n", step,
                  loss, 1e3 * comm_seconds / step, comm_bytes / comm_seconds / 1e6);
    }
    if (f.pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(f.pace_ms));
  }
  if (rank == 0) {
    if (redone > 0) std::printf("%d step(s) redone\n", redone);
    WriteWeights(f.out, model.params());
  }
  std::fflush(stdout);
  if (f.hold_seconds > 0) std::this_thread::sleep_for(std::chrono::seconds(f.hold_seconds));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, flags)) return 2;
  if (flags.reference) return RunReference(flags);
  return flags.elastic ? RunElastic(flags) : RunDistributed(flags);
}
