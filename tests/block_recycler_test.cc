#include "lib/base/block_recycler.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "lib/core/executor/work_impl.h"
#include "tests/sanitizer_build.h"

namespace adaptcomm {
namespace {

using testing::kUnderAddressSanitizer;

TEST(BlockRecycler, AGivenBlockIsTakenAgainAndAtMostMaxKeptAreKept) {
  BlockRecycler recycler(64, 2);
  void* a = recycler.Take();
  void* b = recycler.Take();
  void* c = recycler.Take();
  EXPECT_EQ(recycler.kept(), 0u);
  recycler.Give(a);
  recycler.Give(b);
  recycler.Give(c);  // past max_kept: back to the heap
  if (kUnderAddressSanitizer) {
    // Nothing is kept, so that ASan still sees a use after free of a recycled object.
    EXPECT_EQ(recycler.kept(), 0u);
    return;
  }
  EXPECT_EQ(recycler.kept(), 2u);
  void* again = recycler.Take();
  EXPECT_EQ(again, b);  // the last one given
  EXPECT_EQ(recycler.kept(), 1u);
  EXPECT_EQ(recycler.Take(), a);
  EXPECT_EQ(recycler.kept(), 0u);
  recycler.Give(again);
  recycler.Give(a);
}

struct Small {
  int64_t value = 0;
};
struct Large {
  std::array<char, 512> bytes{};
};

TEST(BlockRecycler, AllocateSharedPlacesObjectAndControlBlockInOneBlockWhenTheyFit) {
  BlockRecycler recycler(sizeof(Small) + 64, 8);
  auto first = std::allocate_shared<Small>(RecyclingAllocator<Small>(&recycler));
  first->value = 7;
  const Small* const where = first.get();
  first.reset();
  EXPECT_EQ(recycler.kept(), kUnderAddressSanitizer ? 0u : 1u);
  auto second = std::allocate_shared<Small>(RecyclingAllocator<Small>(&recycler));
  EXPECT_EQ(second->value, 0);  // constructed afresh
  if (!kUnderAddressSanitizer) {
    EXPECT_EQ(second.get(), where);
  }
  EXPECT_EQ(recycler.kept(), 0u);

  // Too large for a block: the heap's, and never kept.
  auto large = std::allocate_shared<Large>(RecyclingAllocator<Large>(&recycler));
  large->bytes[511] = 1;
  large.reset();
  EXPECT_EQ(recycler.kept(), 0u);
}

TEST(BlockRecycler, NoBlockIsHandedToTwoThreadsAtOnce) {
  BlockRecycler recycler(sizeof(uint64_t) * 4, 16);
  std::atomic<int> clashes{0};
  auto churn = [&](uint64_t id) {
    for (int i = 0; i < 20000; ++i) {
      auto* block = static_cast<uint64_t*>(recycler.Take());
      for (int w = 0; w < 4; ++w) block[w] = id;
      std::this_thread::yield();
      for (int w = 0; w < 4; ++w) {
        if (block[w] != id) clashes.fetch_add(1);
      }
      recycler.Give(block);
    }
  };
  std::thread one(churn, 1), two(churn, 2);
  one.join();
  two.join();
  EXPECT_EQ(clashes.load(), 0);
  EXPECT_LE(recycler.kept(), 16u);
}

OpDesc AllreduceOn(Device device) {
  OpDesc desc;
  desc.kind = OpKind::kAllreduce;
  desc.input = desc.output = TensorView{nullptr, 0, DType::kF32, device, nullptr};
  return desc;
}

// A device op's Work state comes from the process's WorkImpl blocks and goes back there; a host
// op's comes from the heap (internal::MakeWorkImpl).
TEST(BlockRecycler, DeviceOpWorkStatesAreRecycledAndHostOnesAreNot) {
  if (kUnderAddressSanitizer) GTEST_SKIP() << "nothing is kept under ASan";
  const size_t before = ProcessBlocks<internal::WorkImpl>().kept();
  std::shared_ptr<internal::WorkImpl> work = internal::WorkImpl::Failed(
      AllreduceOn(Device::Cuda(0)), absl::InternalError("refused before it was queued"));
  const internal::WorkImpl* const where = work.get();
  work.reset();
  EXPECT_EQ(ProcessBlocks<internal::WorkImpl>().kept(), before + 1);
  work = internal::MakeWorkImpl(AllreduceOn(Device::Cuda(0)), absl::Now());
  EXPECT_EQ(work.get(), where);
  EXPECT_EQ(ProcessBlocks<internal::WorkImpl>().kept(), before);

  std::shared_ptr<internal::WorkImpl> host =
      internal::MakeWorkImpl(AllreduceOn(Device::Cpu()), absl::Now());
  EXPECT_EQ(ProcessBlocks<internal::WorkImpl>().kept(), before);  // not taken from the blocks
  host.reset();
  EXPECT_EQ(ProcessBlocks<internal::WorkImpl>().kept(), before);  // nor given to them
}

}  // namespace
}  // namespace adaptcomm
