// Versions of the CUDA driver, the CUDA runtime and NCCL as this process would load them
// (dlopen at run time), with the path of the file actually loaded.
#ifndef ADAPTCOMM_LIB_DIAG_LIBRARY_PROBE_H_
#define ADAPTCOMM_LIB_DIAG_LIBRARY_PROBE_H_

#include <string>
#include <vector>

namespace adaptcomm::diag {

struct LibraryVersion {
  std::string library;  // "CUDA driver", "CUDA runtime", "NCCL"
  bool found = false;
  int code = 0;         // as the library reports it: 12040 (CUDA 12.4), 22809 (NCCL 2.28.9)
  std::string version;  // "12.4", "2.28.9"
  std::string path;     // the file loaded
  std::string error;    // why not found / not usable
};

LibraryVersion ProbeCudaDriver();
LibraryVersion ProbeCudaRuntime();
LibraryVersion ProbeNccl();

// "12.4" from 12040; "2.28.9" from 22809 (NCCL >= 2.9 encodes major*10000 + minor*100 + patch).
std::string CudaVersionText(int code);
std::string NcclVersionTextFromCode(int code);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_LIBRARY_PROBE_H_
