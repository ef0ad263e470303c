// 3D-parallel training of a tiny two-stage model: tensor x pipeline x data, on 8 ranks as 2 x 2
// x 2.
//
//   adaptcomm launch -n 8 -- adaptcomm_parallel3d --out w.txt        # tensor 2, pipeline 2, data 2
//   adaptcomm_parallel3d --reference --shards 2 --out ref.txt        # the same model, one process
//
// The model: stage 0 is x (16) -> tanh(W1 x + b1) (32) -> W2 h + b2 (16); stage 1 is the same block
// from 16 to 32 to 1; the loss is the mean squared error on the regression set of examples/mlp.h.
// Each stage is split across its tensor group as in Megatron-LM: W1 by rows (column-parallel: each
// rank computes its slice of the hidden layer), W2 by columns (row-parallel: each rank's product
// is a partial sum, allreduced in the tensor group). Backward allreduces the input gradient of
// stage 1 the same way, then sends it to stage 0. Stage 0's output goes to stage 1 (and the
// gradient back) with Send/Recv in the pipeline group. Each rank's gradients (its slices) are
// averaged over the data group through a GradientBucketer, marked ready in the order backward
// produces them. The final weights equal single-process training on the same data
// (tests/parallel3d_test.cc checks it).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "adaptcomm/adaptcomm.h"
#include "adaptcomm/bucketer.h"
#include "adaptcomm/grid.h"
#include "examples/mlp.h"

namespace {

constexpr int kInputs = 16, kHidden = 32, kMiddle = 16;

struct Flags {
  int steps = 60;
  size_t samples = 512;
  float learning_rate = 0.05f;
  int tensor = 2;
  int shards = 1;  // --reference: data-parallel replicas to emulate
  // Small on purpose: the model is tiny, and buckets of ~1 KiB make the bucketer fuse two tensors
  // per bucket and launch the first bucket while stage 0's backward still runs.
  size_t bucket_bytes = 1024;
  bool reference = false;
  std::string out;
};

bool ParseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--steps" && has_value) {
      f.steps = std::atoi(argv[++i]);
    } else if (a == "--samples" && has_value) {
      f.samples = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--lr" && has_value) {
      f.learning_rate = std::strtof(argv[++i], nullptr);
    } else if (a == "--tensor" && has_value) {
      f.tensor = std::atoi(argv[++i]);
    } else if (a == "--shards" && has_value) {
      f.shards = std::atoi(argv[++i]);
    } else if (a == "--bucket-bytes" && has_value) {
      f.bucket_bytes = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--out" && has_value) {
      f.out = argv[++i];
    } else if (a == "--reference") {
      f.reference = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--steps N] [--samples N] [--lr X] [--tensor T] [--bucket-bytes B] "
                   "[--out FILE] [--reference --shards D]\n",
                   argv[0]);
      return false;
    }
  }
  return f.steps >= 0 && f.samples > 0 && f.tensor > 0 && kHidden % f.tensor == 0 && f.shards > 0 &&
         f.bucket_bytes > 0;
}

// Allreduces a partial sum in the tensor group (identity without one).
using Reduce = std::function<bool(std::vector<float>&)>;

// One stage's block in -> hidden -> out, holding rank `tp`'s slice of `tensor` (W1's rows, b1,
// W2's columns; b2 whole on every rank of the group).
struct Stage {
  int in = 0, out = 0, h = 0;  // h: this rank's hidden units
  std::vector<float> w1, b1, w2, b2;
  std::vector<float> gw1, gb1, gw2, gb2;
  std::vector<float> hidden;  // forward's tanh, kept for backward [samples x h]

  // The full stage is initialized from `seed` alone, then sliced, so that every split of it
  // starts from the same weights.
  Stage(int inputs, int outputs, unsigned seed, int tp, int tensor)
      : in(inputs), out(outputs), h(kHidden / tensor) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> full_w1(kHidden * in), full_w2(out * kHidden);
    for (float& w : full_w1) w = normal(rng) / std::sqrt(static_cast<float>(in));
    for (float& w : full_w2) w = normal(rng) / std::sqrt(static_cast<float>(kHidden));
    w1.assign(full_w1.begin() + tp * h * in, full_w1.begin() + (tp + 1) * h * in);
    b1.assign(h, 0.0f);
    for (int o = 0; o < out; ++o) {
      for (int j = 0; j < h; ++j) w2.push_back(full_w2[o * kHidden + tp * h + j]);
    }
    b2.assign(out, 0.0f);
  }

  bool Forward(const std::vector<float>& x, size_t n, std::vector<float>& y, const Reduce& reduce) {
    hidden.assign(n * h, 0.0f);
    y.assign(n * out, 0.0f);
    for (size_t s = 0; s < n; ++s) {
      for (int j = 0; j < h; ++j) {
        double z = b1[j];
        for (int i = 0; i < in; ++i) z += double(w1[j * in + i]) * x[s * in + i];
        hidden[s * h + j] = static_cast<float>(std::tanh(z));
      }
      for (int o = 0; o < out; ++o) {
        double p = 0;
        for (int j = 0; j < h; ++j) p += double(w2[o * h + j]) * hidden[s * h + j];
        y[s * out + o] = static_cast<float>(p);
      }
    }
    if (!reduce(y)) return false;  // row-parallel W2: the partial products summed
    for (size_t s = 0; s < n; ++s) {
      for (int o = 0; o < out; ++o) y[s * out + o] += b2[o];
    }
    return true;
  }

  // dy: the loss gradient at this stage's output. dx (when asked): at its input, summed over the
  // tensor group (each rank holds the part through its hidden slice).
  bool Backward(const std::vector<float>& x, size_t n, const std::vector<float>& dy,
                std::vector<float>* dx, const Reduce& reduce) {
    std::vector<double> g1(w1.size()), gbias1(h), g2(w2.size()), gbias2(out);
    if (dx != nullptr) dx->assign(n * in, 0.0f);
    for (size_t s = 0; s < n; ++s) {
      for (int o = 0; o < out; ++o) gbias2[o] += dy[s * out + o];
      for (int j = 0; j < h; ++j) {
        const double hj = hidden[s * h + j];
        double dh = 0;
        for (int o = 0; o < out; ++o) {
          g2[o * h + j] += dy[s * out + o] * hj;
          dh += double(w2[o * h + j]) * dy[s * out + o];
        }
        const double dz = dh * (1 - hj * hj);
        gbias1[j] += dz;
        for (int i = 0; i < in; ++i) {
          g1[j * in + i] += dz * x[s * in + i];
          if (dx != nullptr) (*dx)[s * in + i] += static_cast<float>(dz * w1[j * in + i]);
        }
      }
    }
    auto to_float = [](const std::vector<double>& d, std::vector<float>& f) {
      f.assign(d.begin(), d.end());
    };
    to_float(g1, gw1);
    to_float(gbias1, gb1);
    to_float(g2, gw2);
    to_float(gbias2, gb2);
    return dx == nullptr || reduce(*dx);
  }

  std::vector<std::vector<float>*> params() { return {&w1, &b1, &w2, &b2}; }
  std::vector<std::vector<float>*> grads() { return {&gw1, &gb1, &gw2, &gb2}; }
  void Step(float lr) {
    auto p = params();
    auto g = grads();
    for (size_t t = 0; t < p.size(); ++t) {
      for (size_t k = 0; k < p[t]->size(); ++k) (*p[t])[k] -= lr * (*g[t])[k];
    }
  }
};

Stage MakeStage(int pp, int tp, int tensor) {
  return pp == 0 ? Stage(kInputs, kMiddle, 42, tp, tensor) : Stage(kMiddle, 1, 43, tp, tensor);
}

// Loss and its gradient at the model's output: mean squared error over the shard.
double LossGradient(const std::vector<float>& y, const std::vector<float>& target, size_t begin,
                    size_t n, std::vector<float>& dy) {
  double loss = 0;
  dy.resize(n);
  for (size_t s = 0; s < n; ++s) {
    const double err = double(y[s]) - target[begin + s];
    loss += err * err;
    dy[s] = static_cast<float>(2 * err / double(n));
  }
  return loss / double(n);
}

std::vector<float> Inputs(const adaptcomm::examples::Dataset& d, size_t begin, size_t n) {
  return std::vector<float>(d.x.begin() + begin * kInputs, d.x.begin() + (begin + n) * kInputs);
}

// Writes stages 0 and 1, each as W1 (rows), b1, W2 (rows), b2 of the whole (unsplit) stage.
void WriteWeights(const std::string& path, const std::vector<std::vector<float>>& flat) {
  if (path.empty()) return;
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  for (const auto& t : flat) {
    for (float v : t) std::fprintf(f, "%.9g\n", v);
  }
  std::fclose(f);
}

// The stage's tensors in the file's layout from the slices of every tensor rank (slices[tp]).
std::vector<std::vector<float>> Assemble(const std::vector<Stage>& slices) {
  const Stage& s0 = slices[0];
  const int h = s0.h;
  std::vector<float> w1, b1, w2(s0.out * kHidden), b2 = s0.b2;
  for (size_t tp = 0; tp < slices.size(); ++tp) {
    w1.insert(w1.end(), slices[tp].w1.begin(), slices[tp].w1.end());
    b1.insert(b1.end(), slices[tp].b1.begin(), slices[tp].b1.end());
    for (int o = 0; o < s0.out; ++o) {
      for (int j = 0; j < h; ++j) w2[o * kHidden + tp * h + j] = slices[tp].w2[o * h + j];
    }
  }
  return {w1, b1, w2, b2};
}

const Reduce kNoReduce = [](std::vector<float>&) { return true; };

int RunReference(const Flags& f) {
  auto data = adaptcomm::examples::MakeRegressionSet(f.samples, kInputs, 1234);
  std::vector<Stage> model = {MakeStage(0, 0, 1), MakeStage(1, 0, 1)};
  const size_t shard = f.samples / f.shards;
  std::vector<float> a, y, dy, da;
  for (int step = 1; step <= f.steps; ++step) {
    std::vector<std::vector<float>> sum[2];
    double loss = 0;
    for (int d = 0; d < f.shards; ++d) {
      const std::vector<float> x = Inputs(data, d * shard, shard);
      model[0].Forward(x, shard, a, kNoReduce);
      model[1].Forward(a, shard, y, kNoReduce);
      loss += LossGradient(y, data.y, d * shard, shard, dy);
      model[1].Backward(a, shard, dy, &da, kNoReduce);
      model[0].Backward(x, shard, da, nullptr, kNoReduce);
      for (int s = 0; s < 2; ++s) {
        auto g = model[s].grads();
        if (d == 0) sum[s].assign(g.size(), {});
        for (size_t t = 0; t < g.size(); ++t) {
          sum[s][t].resize(g[t]->size());
          for (size_t k = 0; k < g[t]->size(); ++k) sum[s][t][k] += (*g[t])[k];
        }
      }
    }
    for (int s = 0; s < 2; ++s) {
      auto g = model[s].grads();
      for (size_t t = 0; t < g.size(); ++t) {
        for (size_t k = 0; k < g[t]->size(); ++k) {
          (*g[t])[k] = sum[s][t][k] / static_cast<float>(f.shards);
        }
      }
      model[s].Step(f.learning_rate);
    }
    if (step % 20 == 0 || step == f.steps)
      std::printf("step %d loss %.6f\n", step, loss / f.shards);
  }
  std::vector<std::vector<float>> flat;
  for (const Stage& s : model) {
    for (auto& t : Assemble({s})) flat.push_back(t);
  }
  WriteWeights(f.out, flat);
  return 0;
}

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return adaptcomm::kExitCommunicationFailure;
}

int RunDistributed(const Flags& f) {
  auto created = adaptcomm::Communicator::Create({});
  if (!created.ok()) return Fail("cannot create the communicator", created.status());
  adaptcomm::Communicator& world = **created;
  adaptcomm::GridOptions layout;
  layout.tensor = f.tensor;
  layout.pipeline = 2;  // the model's two stages
  auto made = adaptcomm::CreateGrid(world, layout);
  if (!made.ok()) return Fail("cannot build the grid", made.status());
  adaptcomm::Grid& grid = *made;
  const int tp = grid.tensor_rank, pp = grid.pipeline_rank, dp = grid.data_rank;
  if (f.samples % grid.data_size != 0) {
    std::fprintf(stderr, "--samples %zu is not divisible by %d replicas\n", f.samples,
                 grid.data_size);
    return 2;
  }
  if (world.rank() == 0) {
    std::printf("adaptcomm 3D demo: %d ranks = tensor %d x pipeline %d x data %d, backend %s\n",
                world.size(), grid.tensor_size, grid.pipeline_size, grid.data_size,
                grid.tensor->backend_name());
  }
  auto data = adaptcomm::examples::MakeRegressionSet(f.samples, kInputs, 1234);
  Stage stage = MakeStage(pp, tp, grid.tensor_size);
  const size_t n = f.samples / grid.data_size, begin = dp * n;

  // Registered in the model's order; backward produces them in reverse (b2 first).
  std::vector<adaptcomm::GradientSpec> specs;
  const char* names[] = {"w1", "b1", "w2", "b2"};
  for (int t = 0; t < 4; ++t) {
    specs.push_back({"stage" + std::to_string(pp) + "." + names[t], stage.params()[t]->size()});
  }
  adaptcomm::BucketerOptions bo;
  bo.op = adaptcomm::ReduceOp::kAvg;
  bo.bucket_bytes = f.bucket_bytes;
  auto bucketer = adaptcomm::GradientBucketer::Create(*grid.data, specs, bo);
  if (!bucketer.ok()) return Fail("cannot create the bucketer", bucketer.status());

  const Reduce tensor_sum = [&](std::vector<float>& v) {
    return grid.tensor->Allreduce(adaptcomm::HostView(v.data(), v.size())).Wait().ok();
  };
  // Pairs ordered by hand: stage 0 sends its activations, then receives their gradient; stage 1
  // receives, then sends. Each transfer goes one way, so the order is forced anyway; a schedule
  // that sends and receives at once between stages (1F1B) would issue both in one
  // Communicator::Group, as the weight gather below does.
  const int peer = 1 - pp;
  std::vector<float> x = Inputs(data, begin, n), a, y, dy, da;
  int launched_early = 0;
  for (int step = 1; step <= f.steps; ++step) {
    bool ok = true;
    double loss = 0;
    if (pp == 0) {
      ok = stage.Forward(x, n, a, tensor_sum) &&
           grid.pipeline->Send(adaptcomm::HostView(a.data(), a.size()), peer).Wait().ok();
      da.resize(n * kMiddle);
      ok = ok && grid.pipeline->Recv(adaptcomm::HostView(da.data(), da.size()), peer).Wait().ok();
      ok = ok && stage.Backward(x, n, da, nullptr, tensor_sum);
    } else {
      a.resize(n * kMiddle);
      ok = grid.pipeline->Recv(adaptcomm::HostView(a.data(), a.size()), peer).Wait().ok() &&
           stage.Forward(a, n, y, tensor_sum);
      if (ok) loss = LossGradient(y, data.y, begin, n, dy);
      ok = ok && stage.Backward(a, n, dy, &da, tensor_sum) &&
           grid.pipeline->Send(adaptcomm::HostView(da.data(), da.size()), peer).Wait().ok();
    }
    if (!ok) return Fail("tensor or pipeline transfer", absl::InternalError("step failed"));
    auto grads = stage.grads();
    for (int t = 3; t >= 0 && ok; --t) {
      ok = (*bucketer)->MarkReady(t, adaptcomm::HostView(grads[t]->data(), grads[t]->size())).ok();
    }
    absl::StatusOr<adaptcomm::BucketStepStats> reduced = (*bucketer)->Wait();
    if (!reduced.ok()) return Fail("gradient allreduce", reduced.status());
    launched_early += reduced->launched_before_wait;
    stage.Step(f.learning_rate);
    if (pp == 1 && tp == 0 && dp == 0 && (step % 20 == 0 || step == f.steps)) {
      std::printf("step %d loss %.6f (replica 0)\n", step, loss);
    }
  }
  // Rank 0 gathers the replica-0 slices (parent ranks of data index 0) and writes whole stages.
  std::vector<float> mine;
  for (auto* p : stage.params()) mine.insert(mine.end(), p->begin(), p->end());
  if (dp == 0 && world.rank() != 0) {
    if (!world.Send(adaptcomm::HostView(mine.data(), mine.size()), 0).Wait().ok()) {
      return Fail("sending weights", absl::InternalError("send failed"));
    }
  }
  if (world.rank() == 0) {
    // The slices in file order (stage, then tensor rank), received as one group: each completes
    // whenever its peer sends, in any order.
    std::vector<Stage> parts;
    std::vector<std::vector<float>> bufs;
    std::vector<adaptcomm::Work> recvs;
    for (int s = 0; s < 2; ++s) {
      for (int t = 0; t < grid.tensor_size; ++t) {
        parts.push_back(MakeStage(s, t, grid.tensor_size));
        size_t count = 0;
        for (auto* p : parts.back().params()) count += p->size();
        bufs.emplace_back(count);
      }
    }
    absl::Status group = world.Group([&] {
      for (size_t k = 0; k < parts.size(); ++k) {
        const int s = static_cast<int>(k) / grid.tensor_size,
                  t = static_cast<int>(k) % grid.tensor_size;
        const int from = adaptcomm::GridRank(layout, world.size(), t, s, 0);
        if (from == 0) {
          bufs[k] = mine;
        } else {
          recvs.push_back(world.Recv(adaptcomm::HostView(bufs[k].data(), bufs[k].size()), from));
        }
      }
    });
    for (adaptcomm::Work& r : recvs) {
      if (absl::Status s = group.ok() ? r.Wait() : group; !s.ok()) {
        return Fail("receiving weights", s);
      }
    }
    std::vector<std::vector<float>> flat;
    for (int s = 0; s < 2; ++s) {
      std::vector<Stage> slices;
      for (int t = 0; t < grid.tensor_size; ++t) {
        const size_t k = static_cast<size_t>(s * grid.tensor_size + t);
        size_t at = 0;
        for (auto* p : parts[k].params()) {
          std::copy(bufs[k].begin() + at, bufs[k].begin() + at + p->size(), p->begin());
          at += p->size();
        }
        slices.push_back(std::move(parts[k]));
      }
      for (auto& t : Assemble(slices)) flat.push_back(t);
    }
    WriteWeights(f.out, flat);
    std::printf("finished: %d bucket launches overlapped backward on rank 0\n", launched_early);
  }
  return 0;  // the bucketer, then the groups, then their parent: reverse order of creation
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, flags)) return 2;
  return flags.reference ? RunReference(flags) : RunDistributed(flags);
}
