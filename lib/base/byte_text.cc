#include "lib/base/byte_text.h"

#include "absl/strings/str_cat.h"

namespace adaptcomm {

std::string ByteSizeText(uint64_t bytes) {
  constexpr uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
  if (bytes != 0 && bytes % kGiB == 0) return absl::StrCat(bytes / kGiB, " GiB");
  if (bytes != 0 && bytes % kMiB == 0) return absl::StrCat(bytes / kMiB, " MiB");
  if (bytes != 0 && bytes % kKiB == 0) return absl::StrCat(bytes / kKiB, " KiB");
  return absl::StrCat(bytes, " B");
}

}  // namespace adaptcomm
