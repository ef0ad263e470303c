// BlockRecycler: fixed-size memory blocks kept for reuse by one kind of per-op object (an op's
// Work state, its CUDA events), and the allocator that hands them to std::allocate_shared.
//
// Why: a trainer holds a step's Works until the step ends, so glibc's per-thread cache of freed
// chunks (tcache, 7 per size) is empty long before the step's last op is issued, and each op's
// allocations take malloc's slow path (its bins, and a consolidation of the fastbins now and then
// that the next unrelated allocation pays for). A free list of the object's own blocks costs two
// atomic operations per take or give instead (stream_order_bench measures it).
//
// Under AddressSanitizer nothing is kept: every block goes back to the heap, so that a use after
// free of a recycled object is still reported.
#ifndef ADAPTCOMM_LIB_BASE_BLOCK_RECYCLER_H_
#define ADAPTCOMM_LIB_BASE_BLOCK_RECYCLER_H_

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "lib/base/spin_lock.h"

namespace adaptcomm {

// Thread-safe: Take and Give may be called from any thread, at once (a SpinLock guards the list:
// it is held for a push or a pop).
class BlockRecycler {
 public:
  // Blocks of `block_bytes` (aligned as operator new aligns); at most `max_kept` are kept while no
  // one uses them, the others go back to the heap.
  BlockRecycler(size_t block_bytes, size_t max_kept);
  ~BlockRecycler();
  BlockRecycler(const BlockRecycler&) = delete;
  BlockRecycler& operator=(const BlockRecycler&) = delete;

  size_t block_bytes() const { return block_bytes_; }
  // A kept block, else a new one from the heap.
  void* Take();
  // REQUIRES: `block` came from Take() of this recycler and is no longer used.
  void Give(void* block);
  // Blocks kept right now (for tests).
  size_t kept() const;

 private:
  struct FreeBlock {
    FreeBlock* next;
  };

  const size_t block_bytes_;
  const size_t max_kept_;
  mutable SpinLock lock_;
  FreeBlock* free_ ABSL_GUARDED_BY(lock_) = nullptr;
  size_t kept_ ABSL_GUARDED_BY(lock_) = 0;
};

// std::allocate_shared's allocator over a BlockRecycler: the one allocation of the object and its
// control block comes from the recycler when it fits a block, else from the heap. The recycler
// must outlive every object allocated with it (the users keep theirs for the whole process).
template <typename T>
class RecyclingAllocator {
 public:
  using value_type = T;

  explicit RecyclingAllocator(BlockRecycler* recycler) : recycler_(recycler) {}
  template <typename U>
  RecyclingAllocator(const RecyclingAllocator<U>& other)  // NOLINT: rebinding is implicit
      : recycler_(other.recycler()) {}

  T* allocate(size_t n) {
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    if (Fits(n)) return static_cast<T*>(recycler_->Take());
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) {
    if (Fits(n)) {
      recycler_->Give(p);
    } else {
      ::operator delete(p);
    }
  }
  BlockRecycler* recycler() const { return recycler_; }
  template <typename U>
  bool operator==(const RecyclingAllocator<U>& other) const {
    return recycler_ == other.recycler();
  }

 private:
  bool Fits(size_t n) const { return n == 1 && sizeof(T) <= recycler_->block_bytes(); }

  BlockRecycler* recycler_;
};

// How many free blocks of one type the process keeps at most: four windows of the executor's
// 1,024 stream-ordered ops in flight without retries.
inline constexpr size_t kKeptBlocksPerType = 4096;
// Room for std::allocate_shared's control block (its vtable, two counts and the allocator) beside
// the object.
inline constexpr size_t kControlBlockRoom = 64;

// The process's recycler of T's blocks, shared by all its communicators; never destroyed, since
// an object may outlive every communicator.
template <typename T>
BlockRecycler& ProcessBlocks() {
  static BlockRecycler* const blocks =
      new BlockRecycler(sizeof(T) + kControlBlockRoom, kKeptBlocksPerType);
  return *blocks;
}

// A T made by std::allocate_shared in one of ProcessBlocks<T>()'s blocks.
template <typename T, typename... Args>
std::shared_ptr<T> MakeRecycled(Args&&... args) {
  return std::allocate_shared<T>(RecyclingAllocator<T>(&ProcessBlocks<T>()),
                                 std::forward<Args>(args)...);
}

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_BLOCK_RECYCLER_H_
