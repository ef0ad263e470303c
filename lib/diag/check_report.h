// Rendering of check results: an aligned table for terminals and JSON for pipelines.
#ifndef ADAPTCOMM_LIB_DIAG_CHECK_REPORT_H_
#define ADAPTCOMM_LIB_DIAG_CHECK_REPORT_H_

#include <string>
#include <vector>

#include "adaptcomm/diagnose.h"

namespace adaptcomm::diag {

// CHECK / STATUS / DETAIL columns, the fix on an indented line under each non-passing row, and a
// summary line ("12 pass, 1 warn, 1 fail").
std::string RenderCheckTable(const std::vector<CheckResult>& results);
// {"ok": bool, "summary": {"pass": n, "warn": n, "fail": n}, "checks": [{check,status,detail,fix}]}
std::string RenderCheckJson(const std::vector<CheckResult>& results);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_CHECK_REPORT_H_
