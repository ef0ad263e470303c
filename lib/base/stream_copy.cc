#include "lib/base/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace adaptcomm::internal {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx2"))) void StreamCopyAvx2(unsigned char* dst, const unsigned char* src,
                                                    size_t bytes) {
  // Align the destination to 32 bytes with an ordinary copy of the head.
  const size_t head = (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31;
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
  _mm_sfence();  // the streamed stores are visible before anyone reads the record
}
#endif

}  // namespace

void StreamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2 && bytes >= kStreamCopyMinBytes) {
    StreamCopyAvx2(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace adaptcomm::internal
