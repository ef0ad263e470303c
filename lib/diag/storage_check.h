// Checkpoint storage: write, fsync and read throughput and fsync latency of a directory, with a
// clear failure when the directory cannot hold a checkpoint-sized file.
#ifndef ADAPTCOMM_LIB_DIAG_STORAGE_CHECK_H_
#define ADAPTCOMM_LIB_DIAG_STORAGE_CHECK_H_

#include <string>
#include <vector>

#include "adaptcomm/diagnose.h"

namespace adaptcomm::diag {

// Writes options.checkpoint_bytes to a scratch file in options.checkpoint_dir (set; removed after),
// fsyncs, reads it back with the page cache dropped for it, and times 8 small write+fsync rounds.
std::vector<CheckResult> CheckStorage(const DiagnoseOptions& options);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_STORAGE_CHECK_H_
