// The demo: data-parallel training of a small MLP with adaptcomm.
//
//   adaptcomm launch -n 4 -- adaptcomm_trainer            # 4 ranks, each on a quarter of the data
//   adaptcomm_trainer --reference --shards 4 --out ref.txt  # the same training in one process
//
// Each rank computes the gradient on its shard and averages it over all ranks with one allreduce,
// so every rank applies the full-data gradient and the weights stay identical everywhere; the
// final weights equal single-process training on the same data (tests/demo_test.cc checks it).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "adaptcomm/adaptcomm.h"
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
    else {
      std::fprintf(stderr,
                   "usage: %s [--steps N] [--samples N] [--hidden N] [--lr X] [--log-every N] "
                   "[--out FILE] [--reference --shards N]\n",
                   argv[0]);
      return a == "--help" || a == "-h" ? (std::exit(0), false) : false;
    }
  }
  return f.steps > 0 && f.samples > 0 && f.hidden > 0 && f.shards > 0 && f.log_every > 0;
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
  std::vector<float> grad;
  double comm_seconds = 0, comm_bytes = 0;
  for (int step = 1; step <= f.steps; ++step) {
    float loss =
        static_cast<float>(model.LossAndGradient(data, rank * shard, (rank + 1) * shard, grad));
    auto t0 = std::chrono::steady_clock::now();
    absl::Status s =
        comm.Allreduce(adaptcomm::HostView(grad.data(), grad.size()), {adaptcomm::ReduceOp::kAvg})
            .Wait();
    comm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    comm_bytes += grad.size() * sizeof(float);
    if (s.ok())
      s = comm.Allreduce(adaptcomm::HostView(&loss, 1), {adaptcomm::ReduceOp::kAvg}).Wait();
    if (!s.ok()) {
      std::fprintf(stderr, "step %d: allreduce failed: %s\n", step, s.ToString().c_str());
      return adaptcomm::kExitCommunicationFailure;
    }
    model.Step(grad, f.learning_rate);
    if (rank == 0 && (step % f.log_every == 0 || step == f.steps)) {
      std::printf("step %d loss %.6f  gradient allreduce %.3f ms avg, %.1f MB/s algbw\n", step,
                  loss, 1e3 * comm_seconds / step, comm_bytes / comm_seconds / 1e6);
    }
  }
  if (rank == 0) WriteWeights(f.out, model.params());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, flags)) return 2;
  return flags.reference ? RunReference(flags) : RunDistributed(flags);
}
