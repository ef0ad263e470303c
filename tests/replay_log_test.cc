// ReplayLog: inputs of host and device ops are recorded, restored and re-run into scratch; device
// copies go through the backend's DeviceMemory on the op's own stream and reuse their buffers.
#include "lib/core/executor/replay_log.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace adaptcomm::internal {
namespace {

using ::testing::HasSubstr;

// "Device" memory that is host memory, recording every call.
class RecordingDeviceMemory final : public DeviceMemory {
 public:
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Device device,
                         void* stream) override {
    copies.push_back({dst, src, bytes, device.index, stream});
    if (!copy_error.ok()) return copy_error;
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Allocate(Device device, size_t bytes) override {
    if (!alloc_error.ok()) return alloc_error;
    ++allocations;
    last_alloc_device = device.index;
    return static_cast<void*>(new unsigned char[bytes]);
  }
  void Free(Device, void* ptr) override {
    ++frees;
    delete[] static_cast<unsigned char*>(ptr);
  }

  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
    int device;
    void* stream;
  };
  std::vector<Copy> copies;
  int allocations = 0;
  int frees = 0;
  int last_alloc_device = -1;
  absl::Status copy_error;
  absl::Status alloc_error;
};

void* const kStream = reinterpret_cast<void*>(0x5);

OpDesc DeviceAllreduce(std::vector<float>& buf, uint64_t seq) {
  OpDesc op;
  op.kind = OpKind::kAllreduce;
  op.input = TensorView{buf.data(), buf.size(), DType::kF32, Device::Cuda(1), kStream};
  op.output = op.input;
  op.seq = seq;
  return op;
}

TEST(ReplayLog, DeviceInPlaceOpIsRecordedOnItsStreamAndRestored) {
  auto mem = std::make_shared<RecordingDeviceMemory>();
  ReplayLog log;
  std::vector<float> buf = {1, 2, 3, 4};
  const OpDesc op = DeviceAllreduce(buf, 7);
  ASSERT_TRUE(log.Record(op, mem, nullptr).ok());
  ASSERT_EQ(mem->copies.size(), 1u);
  EXPECT_EQ(mem->copies[0].src, buf.data());
  EXPECT_EQ(mem->copies[0].bytes, 16u);
  EXPECT_EQ(mem->copies[0].device, 1);
  EXPECT_EQ(mem->copies[0].stream, kStream);
  EXPECT_EQ(mem->last_alloc_device, 1);
  EXPECT_TRUE(log.Covers(7, 7));

  buf = {9, 9, 9, 9};  // the failed attempt scribbled over the buffer
  ASSERT_TRUE(log.RestoreInput(7, nullptr).ok());
  EXPECT_EQ(buf, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(mem->copies.back().dst, buf.data());
  EXPECT_EQ(mem->copies.back().stream, kStream);
}

TEST(ReplayLog, DetachedDeviceCopyRunsOnScratchNotTheCallersBuffer) {
  auto mem = std::make_shared<RecordingDeviceMemory>();
  ReplayLog log;
  std::vector<float> buf = {1, 2, 3};
  ASSERT_TRUE(log.Record(DeviceAllreduce(buf, 3), mem, nullptr).ok());
  buf = {6, 6, 6};  // completed: the caller owns its buffer again
  absl::StatusOr<OpDesc> copy = log.DetachedCopy(3, nullptr);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_NE(copy->input.data, buf.data());
  EXPECT_EQ(copy->output.data, copy->input.data);
  EXPECT_EQ(copy->input.stream, kStream);
  EXPECT_TRUE(copy->input.device.is_cuda());
  const float* scratch = static_cast<const float*>(copy->input.data);
  EXPECT_EQ(std::vector<float>(scratch, scratch + 3), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(buf, (std::vector<float>{6, 6, 6}));
}

TEST(ReplayLog, DeviceBuffersAreReusedAndFreed) {
  auto mem = std::make_shared<RecordingDeviceMemory>();
  {
    ReplayLog log(/*depth=*/2);
    std::vector<float> buf(256, 1.0f);
    for (uint64_t seq = 1; seq <= 20; ++seq)
      ASSERT_TRUE(log.Record(DeviceAllreduce(buf, seq), mem, nullptr).ok());
    EXPECT_EQ(mem->allocations, 1);  // the slab, reused from then on
    ASSERT_TRUE(log.DetachedCopy(20, nullptr).ok());
    ASSERT_TRUE(log.DetachedCopy(19, nullptr).ok());
    EXPECT_EQ(mem->allocations, 2);  // plus one scratch shared by the re-runs
  }
  EXPECT_EQ(mem->frees, 2);
}

TEST(ReplayLog, HostOpsNeedNoDeviceMemory) {
  ReplayLog log;
  std::vector<int32_t> in = {1, 2}, out(4);
  OpDesc op;
  op.kind = OpKind::kAllgather;
  op.input = TensorView{in.data(), 2, DType::kI32};
  op.output = TensorView{out.data(), 4, DType::kI32};
  op.seq = 1;
  ASSERT_TRUE(log.Record(op, nullptr, nullptr).ok());
  in = {5, 5};
  absl::StatusOr<OpDesc> copy = log.DetachedCopy(1, nullptr);
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(static_cast<const int32_t*>(copy->input.data)[0], 1);
  EXPECT_EQ(static_cast<const int32_t*>(copy->input.data)[1], 2);
  EXPECT_NE(copy->output.data, out.data());
}

// A log deep enough for a wide window of device ops keeps every device op of that depth, but host
// ops (which run one at a time) share kHostRecords host buffers: the oldest host records are
// dropped, not overwritten under a record that still claims them.
TEST(ReplayLog, DeepLogKeepsEveryDeviceOpButOnlyTheLastHostOps) {
  constexpr uint64_t kDepth = 16;
  ReplayLog log(kDepth);
  auto memory = std::make_shared<RecordingDeviceMemory>();
  std::vector<std::vector<float>> device(kDepth, std::vector<float>(4));
  for (uint64_t seq = 1; seq <= kDepth; ++seq) {
    std::fill(device[seq - 1].begin(), device[seq - 1].end(), static_cast<float>(seq));
    ASSERT_TRUE(log.Record(DeviceAllreduce(device[seq - 1], seq), memory, nullptr).ok()) << seq;
  }
  EXPECT_TRUE(log.Covers(1, kDepth));
  EXPECT_EQ(memory->allocations, 1);

  std::vector<std::vector<int32_t>> host(kDepth, std::vector<int32_t>(3));
  for (uint64_t seq = kDepth + 1; seq <= 2 * kDepth; ++seq) {
    std::vector<int32_t>& buf = host[seq - kDepth - 1];
    std::fill(buf.begin(), buf.end(), static_cast<int32_t>(seq));
    OpDesc op;
    op.kind = OpKind::kAllreduce;
    op.input = TensorView{buf.data(), buf.size(), DType::kI32};
    op.output = op.input;
    op.seq = seq;
    ASSERT_TRUE(log.Record(op, nullptr, nullptr).ok()) << seq;
    std::fill(buf.begin(), buf.end(), -1);  // the op's result overwrites its input
  }
  const uint64_t last = 2 * kDepth, kept = ReplayLog::kHostRecords;
  EXPECT_TRUE(log.Covers(last - kept + 1, last));
  EXPECT_FALSE(log.Covers(last - kept, last - kept)) << "a host record older than the buffers";
  for (uint64_t seq = last - kept + 1; seq <= last; ++seq) {
    ASSERT_TRUE(log.RestoreInput(seq, nullptr).ok());
    EXPECT_THAT(host[seq - kDepth - 1], ::testing::Each(static_cast<int32_t>(seq))) << seq;
  }
  EXPECT_EQ(memory->allocations, 1) << "host ops took device memory";
}

// The device records stay within their budget (retry.record_bytes): one slab, cut in issue order.
// An op whose record does not fit beside the records in flight is not recorded (not replayable)
// and takes no memory; once the window slides past the old records it fits again.
TEST(ReplayLog, DeviceRecordsStayWithinTheirBudget) {
  constexpr uint64_t kKiB = 1024;
  ReplayLog log(/*depth=*/4, /*device_record_bytes=*/3 * kKiB);
  auto memory = std::make_shared<RecordingDeviceMemory>();
  std::vector<std::vector<float>> bufs(9, std::vector<float>(kKiB / sizeof(float)));
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    std::fill(bufs[seq].begin(), bufs[seq].end(), static_cast<float>(seq));
    ASSERT_TRUE(log.Record(DeviceAllreduce(bufs[seq], seq), memory, nullptr).ok()) << seq;
  }
  EXPECT_EQ(memory->allocations, 1);

  // A fourth 1 KiB record does not fit beside the three in flight.
  absl::Status over = log.Record(DeviceAllreduce(bufs[4], 4), memory, nullptr);
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_EQ(over.message(),
            "its retry record (1 KiB) does not fit beside the 3 records in flight (3 KiB) in "
            "retry.record_bytes (3 KiB); lower retry.in_flight or raise retry.record_bytes");
  EXPECT_FALSE(log.Covers(4, 4));
  EXPECT_TRUE(log.Covers(1, 3)) << "a refusal dropped the records before it";

  // Op 5 takes op 1's entry and, with it, its place in the slab.
  std::fill(bufs[5].begin(), bufs[5].end(), 5.0f);
  ASSERT_TRUE(log.Record(DeviceAllreduce(bufs[5], 5), memory, nullptr).ok());
  std::fill(bufs[5].begin(), bufs[5].end(), -1.0f);  // the op's result
  ASSERT_TRUE(log.RestoreInput(5, nullptr).ok());
  EXPECT_THAT(bufs[5], ::testing::Each(5.0f));
  EXPECT_TRUE(log.Covers(2, 3)) << "op 5's record overwrote a record in flight";

  // Larger than the whole budget: refused, saying so.
  std::vector<float> big(4 * kKiB / sizeof(float), 6.0f);
  absl::Status too_big = log.Record(DeviceAllreduce(big, 6), memory, nullptr);
  EXPECT_TRUE(absl::IsResourceExhausted(too_big)) << too_big;
  EXPECT_THAT(std::string(too_big.message()),
              HasSubstr("is larger than retry.record_bytes (3 KiB)"));
  EXPECT_EQ(memory->allocations, 1);
  EXPECT_EQ(memory->frees, 0);
}

// Ops that grow, shrink and grow again never allocate device memory after the first record, nor
// free any: a cudaMalloc or cudaFree synchronises the device, and would run on the trainer's
// thread.
TEST(ReplayLog, OpsOfGrowingSizesNeverAllocateAfterTheFirstRecord) {
  constexpr size_t kMiB = 1 << 20;
  ReplayLog log(/*depth=*/4, /*device_record_bytes=*/16 * kMiB);
  auto memory = std::make_shared<RecordingDeviceMemory>();
  const std::vector<size_t> sizes = {4096, 64 * 1024, kMiB, 3 * kMiB, 256, 4 * kMiB, 2 * kMiB};
  uint64_t seq = 0;
  for (int step = 0; step < 5; ++step) {
    for (size_t bytes : sizes) {
      std::vector<float> buf(bytes / sizeof(float), static_cast<float>(++seq));
      ASSERT_TRUE(log.Record(DeviceAllreduce(buf, seq), memory, nullptr).ok()) << seq;
      std::fill(buf.begin(), buf.end(), -1.0f);
      ASSERT_TRUE(log.RestoreInput(seq, nullptr).ok());
      ASSERT_THAT(buf, ::testing::Each(static_cast<float>(seq))) << seq;
    }
  }
  EXPECT_EQ(memory->allocations, 1);
  EXPECT_EQ(memory->frees, 0);
  EXPECT_TRUE(log.Covers(seq - 3, seq));
}

TEST(ReplayLog, DeviceOpsAreNotReplayableWithoutDeviceMemoryOrWhenACopyFails) {
  ReplayLog log;
  std::vector<float> buf(8);
  absl::Status none = log.Record(DeviceAllreduce(buf, 1), nullptr, nullptr);
  EXPECT_TRUE(absl::IsUnimplemented(none)) << none;
  EXPECT_THAT(std::string(none.message()), HasSubstr("no device memory"));
  EXPECT_FALSE(log.Covers(1, 1));

  auto mem = std::make_shared<RecordingDeviceMemory>();
  mem->alloc_error = absl::InternalError("cudaMalloc of 32 bytes on cuda:1: out of memory");
  absl::Status oom = log.Record(DeviceAllreduce(buf, 2), mem, nullptr);
  EXPECT_THAT(std::string(oom.message()), HasSubstr("out of memory"));
  EXPECT_FALSE(log.Covers(2, 2));
  EXPECT_TRUE(absl::IsFailedPrecondition(log.DetachedCopy(2, nullptr).status()));

  mem->alloc_error = absl::OkStatus();
  mem->copy_error = absl::InternalError("cudaMemcpyAsync: an illegal memory access");
  EXPECT_FALSE(log.Record(DeviceAllreduce(buf, 3), mem, nullptr).ok());
  EXPECT_FALSE(log.Covers(3, 3));
}

TEST(ReplayLog, MixedHostAndDeviceViewsAreRefused) {
  auto mem = std::make_shared<RecordingDeviceMemory>();
  ReplayLog log;
  std::vector<float> in(2), out(4);
  OpDesc op;
  op.kind = OpKind::kAllgather;
  op.input = TensorView{in.data(), 2, DType::kF32, Device::Cuda(0)};
  op.output = TensorView{out.data(), 4, DType::kF32};
  op.seq = 1;
  absl::Status s = log.Record(op, mem, nullptr);
  EXPECT_THAT(std::string(s.message()), HasSubstr("host and CUDA memory"));
}

OpDesc StableAllgather(std::vector<int32_t>& in, std::vector<int32_t>& out, uint64_t seq) {
  OpDesc op;
  op.kind = OpKind::kAllgather;
  op.input = TensorView{in.data(), in.size(), DType::kI32};
  op.output = TensorView{out.data(), out.size(), DType::kI32};
  op.seq = seq;
  op.stable_input = true;
  return op;
}

TEST(ReplayLog, StableInputIsReferencedNotCopied) {
  ReplayLog log;
  std::vector<int32_t> in = {1, 2}, out(4);
  ASSERT_TRUE(log.Record(StableAllgather(in, out, 1), nullptr, nullptr).ok());
  // The record is the caller's buffer itself: what it holds when the op is re-run.
  in = {7, 8};
  absl::StatusOr<OpDesc> copy = log.DetachedCopy(1, nullptr);
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(copy->input.data, in.data());
  EXPECT_NE(copy->output.data, out.data());
}

TEST(ReplayLog, StableInputIsCopiedBeforeAnOpThatDoesNotProveEntry) {
  ReplayLog log;
  std::vector<int32_t> in = {1, 2}, out(4);
  ASSERT_TRUE(log.Record(StableAllgather(in, out, 1), nullptr, nullptr).ok());
  // A broadcast next: its completion here does not show that every rank left the allgather, so
  // the allgather's input is copied while the caller's promise still holds.
  OpDesc bcast;
  bcast.kind = OpKind::kBroadcast;
  bcast.seq = 2;
  log.BeforeOp(bcast, nullptr);
  in = {7, 8};
  absl::StatusOr<OpDesc> copy = log.DetachedCopy(1, nullptr);
  ASSERT_TRUE(copy.ok());
  EXPECT_NE(copy->input.data, in.data());
  EXPECT_EQ(static_cast<const int32_t*>(copy->input.data)[0], 1);
  EXPECT_EQ(static_cast<const int32_t*>(copy->input.data)[1], 2);
}

TEST(ReplayLog, StableInputOfAnInPlaceOpIsCopiedAnyway) {
  auto mem = std::make_shared<RecordingDeviceMemory>();
  ReplayLog log;
  std::vector<float> buf = {1, 2};
  OpDesc op = DeviceAllreduce(buf, 1);
  op.stable_input = true;  // the op itself overwrites it: no promise can keep it
  ASSERT_TRUE(log.Record(op, mem, nullptr).ok());
  EXPECT_EQ(mem->copies.size(), 1u);
}

}  // namespace
}  // namespace adaptcomm::internal
