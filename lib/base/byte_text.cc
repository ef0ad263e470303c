#include "lib/base/byte_text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace adaptcomm {

namespace {

std::string Text(uint64_t bytes, absl::string_view space) {
  constexpr uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
  if (bytes != 0 && bytes % kGiB == 0) return absl::StrCat(bytes / kGiB, space, "GiB");
  if (bytes != 0 && bytes % kMiB == 0) return absl::StrCat(bytes / kMiB, space, "MiB");
  if (bytes != 0 && bytes % kKiB == 0) return absl::StrCat(bytes / kKiB, space, "KiB");
  return absl::StrCat(bytes, space, "B");
}

}  // namespace

std::string ByteSizeText(uint64_t bytes) { return Text(bytes, " "); }
std::string CompactByteSizeText(uint64_t bytes) { return Text(bytes, ""); }

}  // namespace adaptcomm
