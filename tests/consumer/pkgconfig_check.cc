// Compiled with nothing but `pkg-config --cflags --libs adaptcomm`.
#include <cstdio>

#include "adaptcomm/adaptcomm.h"

int main() {
  std::printf("%s %d\n", adaptcomm::DTypeName(adaptcomm::DType::kBF16),
              adaptcomm::IsRetryable(absl::UnavailableError("peer gone")) ? 1 : 0);
  return 0;
}
