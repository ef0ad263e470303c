// Run under `adaptcomm launch -n 4`: every rank contributes rank+1, so each element of the
// allreduced vector must be 1+2+...+N (10 for 4 ranks). Prints OK and exits 0, else exits 1.
#include <cstdio>
#include <vector>

#include "adaptcomm/adaptcomm.h"

int main() {
  adaptcomm::CommunicatorOptions options;
  options.init_timeout = absl::Seconds(60);
  options.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<adaptcomm::Communicator>> comm =
      adaptcomm::Communicator::Create(options);
  if (!comm.ok()) {
    std::fprintf(stderr, "Create failed: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  const int rank = (*comm)->rank();
  const int size = (*comm)->size();
  std::vector<float> data(4096, static_cast<float>(rank + 1));
  absl::Status status = (*comm)->Allreduce(adaptcomm::HostView(data.data(), data.size())).Wait();
  if (!status.ok()) {
    std::fprintf(stderr, "Allreduce failed: %s\n", status.ToString().c_str());
    return 1;
  }
  const float expected = static_cast<float>(size * (size + 1) / 2);
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] != expected) {
      std::fprintf(stderr, "element %zu is %g, expected %g\n", i, data[i], expected);
      return 1;
    }
  }
  std::printf("OK rank %d of %d sum %g backend %s\n", rank, size, expected,
              (*comm)->backend_name());
  return 0;
}
