#include "lib/base/block_recycler.h"

#include <algorithm>

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

BlockRecycler::BlockRecycler(size_t block_bytes, size_t max_kept)
    : block_bytes_(std::max(block_bytes, sizeof(FreeBlock))),
      max_kept_(kKeepBlocks ? max_kept : 0) {}

BlockRecycler::~BlockRecycler() {
  SpinLockHold hold(&lock_);
  while (free_ != nullptr) {
    FreeBlock* next = free_->next;
    ::operator delete(free_);
    free_ = next;
  }
}

void* BlockRecycler::Take() {
  {
    SpinLockHold hold(&lock_);
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
    SpinLockHold hold(&lock_);
    if (kept_ < max_kept_) {
      free_ = new (block) FreeBlock{free_};
      ++kept_;
      return;
    }
  }
  ::operator delete(block);
}

size_t BlockRecycler::kept() const {
  SpinLockHold hold(&lock_);
  return kept_;
}

}  // namespace adaptcomm
