// StreamCopy copies exactly like memcpy at every size and alignment around its thresholds, and
// writes nothing outside the destination range.
#include "lib/base/stream_copy.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace adaptcomm::internal {
namespace {

TEST(StreamCopy, SameBytesAsMemcpyAtEveryAlignmentAndNothingOutside) {
  const size_t sizes[] = {0,
                          1,
                          127,
                          kStreamCopyMinBytes - 1,
                          kStreamCopyMinBytes,
                          kStreamCopyMinBytes + 129,
                          3 * kStreamCopyMinBytes + 17};
  for (size_t bytes : sizes) {
    std::vector<unsigned char> src(bytes + 64);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
    for (size_t dst_off : {0, 1, 31, 32, 45}) {
      for (size_t src_off : {0, 3}) {
        std::vector<unsigned char> dst(bytes + 128, 0xEE);
        StreamCopy(dst.data() + dst_off, src.data() + src_off, bytes);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_off && i < dst_off + bytes;
          const unsigned char want = inside ? src[src_off + i - dst_off] : 0xEE;
          ASSERT_EQ(dst[i], want) << "bytes " << bytes << " dst+" << dst_off << " src+" << src_off
                                  << " at " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace adaptcomm::internal
