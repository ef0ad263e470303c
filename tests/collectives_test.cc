// Every collective x dtype x reduce op x size (1 element .. 16 MiB) on 2, 3 and 4 ranks, as
// threads and as processes, checked element by element against a reference computed here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adaptcomm/adaptcomm.h"
#include "gtest/gtest.h"
#include "tests/dtype_values.h"
#include "tests/harness.h"

namespace adaptcomm {
namespace {

using testing::RankEnv;
using testing::RankMode;

// Small integers: exact in every dtype (bf16 holds integers up to 256 exactly), and sums and
// products of 4 ranks stay in range of i8.
double InputValue(ReduceOp op, int rank, size_t i) {
  if (op == ReduceOp::kProd) return 1 + static_cast<double>((rank + i) % 2);
  return static_cast<double>((rank + 1) * 3 + static_cast<int>(i % 5));
}

double ToDType(DType t, double v) { return testing::RoundTo(t, v); }

class Buffer {
 public:
  Buffer(DType t, size_t n) : dtype_(t), count_(n), bytes_(std::max<size_t>(1, n * DTypeSize(t))) {}
  TensorView view() { return TensorView{bytes_.data(), count_, dtype_}; }
  void Set(size_t i, double v) {
    testing::StoreAs(dtype_, v, bytes_.data() + i * DTypeSize(dtype_));
  }
  double Get(size_t i) const {
    return testing::LoadAs(dtype_, bytes_.data() + i * DTypeSize(dtype_));
  }

 private:
  DType dtype_;
  size_t count_;
  std::vector<unsigned char> bytes_;
};

double Reduced(ReduceOp op, DType t, size_t i, int world) {
  double acc = InputValue(op, 0, i);
  for (int r = 1; r < world; ++r) acc = testing::Combine(op, acc, InputValue(op, r, i));
  if (op == ReduceOp::kAvg) acc /= world;
  return ToDType(t, acc);
}

// Exact except avg, which may differ in the last bit of the dtype (scale vs divide).
void ExpectElement(double got, double want, DType t, ReduceOp op, const std::string& where) {
  if (op == ReduceOp::kAvg) {
    double tol = t == DType::kF16 || t == DType::kBF16 ? 1e-2 : 1e-6;
    ASSERT_NEAR(got, want, tol * std::abs(want)) << where;
  } else {
    ASSERT_EQ(got, want) << where;
  }
}

bool Applies(DType t, ReduceOp op) { return op != ReduceOp::kAvg || IsFloatingPoint(t); }

constexpr size_t kSmallCounts[] = {1, 2, 7, 1031};

void CheckReductions(Communicator& comm, DType t, ReduceOp op, size_t n) {
  const int rank = comm.rank(), world = comm.size();
  const std::string what =
      absl::StrCat(DTypeName(t), " ", ReduceOpName(op), " n=", n, " world=", world, " rank=", rank);
  // allreduce
  Buffer data(t, n);
  for (size_t i = 0; i < n; ++i) data.Set(i, InputValue(op, rank, i));
  ASSERT_TRUE(comm.Allreduce(data.view(), {op}).Wait().ok()) << "allreduce " << what;
  for (size_t i = 0; i < n; ++i)
    ExpectElement(data.Get(i), Reduced(op, t, i, world), t, op,
                  absl::StrCat("allreduce ", what, " i=", i));
  // reduce to the last rank
  const int root = world - 1;
  for (size_t i = 0; i < n; ++i) data.Set(i, InputValue(op, rank, i));
  ASSERT_TRUE(comm.Reduce(data.view(), {root, op}).Wait().ok()) << "reduce " << what;
  if (rank == root) {
    for (size_t i = 0; i < n; ++i)
      ExpectElement(data.Get(i), Reduced(op, t, i, world), t, op,
                    absl::StrCat("reduce ", what, " i=", i));
  }
  // reduce_scatter: block b of element j holds InputValue(i = b * n + j)
  Buffer in(t, n * world), out(t, n);
  for (size_t i = 0; i < n * world; ++i) in.Set(i, InputValue(op, rank, i));
  ASSERT_TRUE(comm.ReduceScatter(in.view(), out.view(), {op}).Wait().ok())
      << "reduce_scatter " << what;
  for (size_t j = 0; j < n; ++j)
    ExpectElement(out.Get(j), Reduced(op, t, rank * n + j, world), t, op,
                  absl::StrCat("reduce_scatter ", what, " j=", j));
}

double Tagged(int rank, size_t i) { return static_cast<double>((rank * 7 + i) % 100); }

void CheckDataMovement(Communicator& comm, DType t, size_t n) {
  const int rank = comm.rank(), world = comm.size();
  const std::string what = absl::StrCat(DTypeName(t), " n=", n, " world=", world, " rank=", rank);
  // broadcast from rank 1 % world
  const int root = 1 % world;
  Buffer b(t, n);
  for (size_t i = 0; i < n; ++i) b.Set(i, Tagged(rank, i));
  ASSERT_TRUE(comm.Broadcast(b.view(), {root}).Wait().ok()) << "broadcast " << what;
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(b.Get(i), ToDType(t, Tagged(root, i))) << "broadcast " << what;
  // allgather
  Buffer mine(t, n), all(t, n * world);
  for (size_t i = 0; i < n; ++i) mine.Set(i, Tagged(rank, i));
  ASSERT_TRUE(comm.Allgather(mine.view(), all.view()).Wait().ok()) << "allgather " << what;
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(all.Get(r * n + i), ToDType(t, Tagged(r, i))) << "allgather " << what;
  // alltoall: block j of rank r's input holds Tagged(r, j * n + i); lands in block r of rank j.
  Buffer send(t, n * world), recv(t, n * world);
  for (size_t i = 0; i < n * world; ++i) send.Set(i, Tagged(rank, i));
  ASSERT_TRUE(comm.Alltoall(send.view(), recv.view()).Wait().ok()) << "alltoall " << what;
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(recv.Get(r * n + i), ToDType(t, Tagged(r, rank * n + i))) << "alltoall " << what;
  // send/recv around a ring: even ranks send first, odd ranks receive first.
  if (world > 1) {
    const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    Buffer out(t, n), in(t, n);
    for (size_t i = 0; i < n; ++i) out.Set(i, Tagged(rank, i));
    auto do_send = [&] {
      ASSERT_TRUE(comm.Send(out.view(), next, {5}).Wait().ok()) << "send " << what;
    };
    auto do_recv = [&] {
      ASSERT_TRUE(comm.Recv(in.view(), prev, {5}).Wait().ok()) << "recv " << what;
    };
    if (rank % 2 == 0) {
      do_send();
      do_recv();
    } else {
      do_recv();
      do_send();
    }
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(in.Get(i), ToDType(t, Tagged(prev, i))) << "recv " << what;
  }
  ASSERT_TRUE(comm.Barrier().Wait().ok());
}

void RunMatrix(const RankEnv& env, BackendChoice backend) {
  CommunicatorOptions options = env.options;
  options.backend = backend;
  options.fallback = Fallback::kDeny;
  auto comm = Communicator::Create(options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_EQ((*comm)->backend_name(), std::string(BackendChoiceName(backend)));
  for (DType t : kAllDTypes) {
    for (size_t n : kSmallCounts) {
      for (ReduceOp op : kAllReduceOps) {
        if (Applies(t, op)) CheckReductions(**comm, t, op, n);
      }
      CheckDataMovement(**comm, t, n);
    }
  }
  // 16 MiB buffers: f32 through every collective, plus bf16 and i64 sums.
  const size_t big = (16u << 20) / 4;
  CheckReductions(**comm, DType::kF32, ReduceOp::kSum, big / env.world_size);
  CheckDataMovement(**comm, DType::kF32, big / env.world_size);
  Buffer large(DType::kF32, big);
  for (size_t i = 0; i < big; ++i) large.Set(i, InputValue(ReduceOp::kMax, env.rank, i));
  ASSERT_TRUE((*comm)->Allreduce(large.view(), {ReduceOp::kMax}).Wait().ok());
  for (size_t i = 0; i < big; ++i)
    ASSERT_EQ(large.Get(i), Reduced(ReduceOp::kMax, DType::kF32, i, env.world_size)) << i;
  CheckReductions(**comm, DType::kBF16, ReduceOp::kSum, (1u << 20));
  CheckReductions(**comm, DType::kI64, ReduceOp::kSum, (16u << 20) / 8 / env.world_size);
}

struct MatrixParam {
  RankMode mode;
  int world;
  BackendChoice backend = BackendChoice::kGloo;
};

class CollectivesTest : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(CollectivesTest, EveryOpDTypeAndSizeMatchesReference) {
  const BackendChoice backend = GetParam().backend;
  testing::RunRanks(
      GetParam().mode, GetParam().world, [backend](const RankEnv& env) { RunMatrix(env, backend); },
      absl::Seconds(240));
}

// The same matrix on every host-memory backend (Gloo; shm for ranks of one host).
INSTANTIATE_TEST_SUITE_P(
    Ranks, CollectivesTest,
    ::testing::Values(MatrixParam{RankMode::kThreads, 2}, MatrixParam{RankMode::kThreads, 3},
                      MatrixParam{RankMode::kThreads, 4}, MatrixParam{RankMode::kProcesses, 2},
                      MatrixParam{RankMode::kProcesses, 3}, MatrixParam{RankMode::kProcesses, 4},
                      MatrixParam{RankMode::kThreads, 2, BackendChoice::kShm},
                      MatrixParam{RankMode::kThreads, 3, BackendChoice::kShm},
                      MatrixParam{RankMode::kThreads, 4, BackendChoice::kShm},
                      MatrixParam{RankMode::kProcesses, 2, BackendChoice::kShm},
                      MatrixParam{RankMode::kProcesses, 3, BackendChoice::kShm},
                      MatrixParam{RankMode::kProcesses, 4, BackendChoice::kShm}),
    [](const ::testing::TestParamInfo<MatrixParam>& info) {
      return absl::StrCat(info.param.backend == BackendChoice::kShm ? "Shm" : "",
                          testing::RankModeName(info.param.mode), info.param.world);
    });

}  // namespace
}  // namespace adaptcomm

namespace adaptcomm {
namespace {

// Found by the mixed-precision tests: blocks of 2 elements on 3 ranks, values i + 10 r.
TEST(ReduceScatter, BlocksOfTwoOnThreeRanks) {
  testing::RunRanks(RankMode::kThreads, 3, [](const RankEnv& env) {
    auto comm = Communicator::Create(env.options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<float> in(6), out(2);
    for (int i = 0; i < 6; ++i) in[i] = static_cast<float>(i + 10 * env.rank);
    ASSERT_TRUE(
        (*comm)->ReduceScatter(HostView(in.data(), 6), HostView(out.data(), 2)).Wait().ok());
    const float base = 30.0f + 6.0f * env.rank;  // sum over r of (2 * rank + j + 10 r)
    EXPECT_EQ(out[0], base);
    EXPECT_EQ(out[1], base + 3.0f);
  });
}

}  // namespace
}  // namespace adaptcomm
