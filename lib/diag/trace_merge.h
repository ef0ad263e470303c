// `adaptcomm trace merge`: joins the per-rank Chrome trace files (DIR/trace.rank<R>.json, written
// by the trace recorder) onto rank 0's clock, as one file Perfetto / chrome://tracing opens.
//
// Input per rank: {"traceEvents":[{"name","cat","ph":"X","ts","dur","pid":rank,"tid",
//   "args":{"seq","dtype","count","bytes","enqueue_ts"}}...],
//  "otherData":{"rank","world_size","clock_offset_us"}}  (offset = this clock minus rank 0's).
#ifndef ADAPTCOMM_LIB_DIAG_TRACE_MERGE_H_
#define ADAPTCOMM_LIB_DIAG_TRACE_MERGE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::diag {

// Rank files of `dir`, sorted by rank. NotFound if there are none.
absl::StatusOr<std::vector<std::string>> ListRankTraces(const std::string& dir);

// The merged trace: every event with ts (and args.enqueue_ts) moved to rank 0's clock, a
// process_name metadata event per rank, and otherData {world_size, ranks, clock_offsets_us,
// merged_from}. InvalidArgument naming the file for a malformed input.
absl::StatusOr<nlohmann::json> MergeTraces(const std::vector<std::string>& rank_files);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_TRACE_MERGE_H_
