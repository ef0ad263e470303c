// A memcpy for large copies nobody reads soon (the retry's input records): non-temporal stores
// skip the read-for-ownership of the destination and leave the caches to the collective.
#ifndef ADAPTCOMM_LIB_BASE_STREAM_COPY_H_
#define ADAPTCOMM_LIB_BASE_STREAM_COPY_H_

#include <cstddef>

namespace adaptcomm::internal {

// Copies like memcpy (the ranges must not overlap). Non-temporal from kStreamCopyMinBytes on, where
// the CPU has AVX2; an ordinary memcpy otherwise. Ends with a store fence.
void StreamCopy(void* dst, const void* src, size_t bytes);
inline constexpr size_t kStreamCopyMinBytes = size_t{1} << 20;

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_BASE_STREAM_COPY_H_
