#include "lib/base/block_recycler.h"

#include <algorithm>
#include <thread>

namespace adaptcomm {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kKeepBlocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kKeepBlocks = false;
#else
constexpr bool kKeepBlocks = true;
#endif
#else
constexpr bool kKeepBlocks = true;
#endif

}  // namespace

void BlockRecycler::SpinLock::Lock() {
  // A holder runs a few instructions; one preempted in between is waited out by yielding.
  for (int spins = 0; held_.exchange(true, std::memory_order_acquire); ++spins) {
    while (held_.load(std::memory_order_relaxed)) {
      if (++spins > 64) std::this_thread::yield();
    }
  }
}

BlockRecycler::BlockRecycler(size_t block_bytes, size_t max_kept)
    : block_bytes_(std::max(block_bytes, sizeof(FreeBlock))),
      max_kept_(kKeepBlocks ? max_kept : 0) {}

BlockRecycler::~BlockRecycler() {
  Hold hold(&lock_);
  while (free_ != nullptr) {
    FreeBlock* next = free_->next;
    ::operator delete(free_);
    free_ = next;
  }
}

void* BlockRecycler::Take() {
  {
    Hold hold(&lock_);
    if (FreeBlock* block = free_; block != nullptr) {
      free_ = block->next;
      --kept_;
      return block;
    }
  }
  return ::operator new(block_bytes_);
}

void BlockRecycler::Give(void* block) {
  {
    Hold hold(&lock_);
    if (kept_ < max_kept_) {
      free_ = new (block) FreeBlock{free_};
      ++kept_;
      return;
    }
  }
  ::operator delete(block);
}

size_t BlockRecycler::kept() const {
  Hold hold(&lock_);
  return kept_;
}

}  // namespace adaptcomm
