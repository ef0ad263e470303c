#include "lib/diag/check_report.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace adaptcomm::diag {

std::string RenderCheckTable(const std::vector<CheckResult>& results) {
  size_t width = 5;
  for (const auto& r : results) width = std::max(width, r.check.size());
  width = std::min<size_t>(width, 40);
  std::string out =
      absl::StrFormat("%-*s  %-6s %s\n", static_cast<int>(width), "CHECK", "STATUS", "DETAIL");
  int counts[3] = {0, 0, 0};
  for (const auto& r : results) {
    ++counts[static_cast<int>(r.status)];
    std::string status = CheckStatusName(r.status);
    if (r.status == CheckStatus::kFail) status = "FAIL";
    absl::StrAppend(&out, absl::StrFormat("%-*s  %-6s %s\n", static_cast<int>(width), r.check,
                                          status, r.detail));
    if (r.status != CheckStatus::kPass && !r.fix.empty()) {
      absl::StrAppend(&out, std::string(width + 9, ' '), "fix: ", r.fix, "\n");
    }
  }
  absl::StrAppend(
      &out, absl::StrFormat("\n%d pass, %d warn, %d fail\n", counts[0], counts[1], counts[2]));
  return out;
}

std::string RenderCheckJson(const std::vector<CheckResult>& results) {
  nlohmann::json j;
  int counts[3] = {0, 0, 0};
  j["checks"] = nlohmann::json::array();
  for (const auto& r : results) {
    ++counts[static_cast<int>(r.status)];
    j["checks"].push_back({{"check", r.check},
                           {"status", CheckStatusName(r.status)},
                           {"detail", r.detail},
                           {"fix", r.fix}});
  }
  j["summary"] = {{"pass", counts[0]}, {"warn", counts[1]}, {"fail", counts[2]}};
  j["ok"] = counts[2] == 0;
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace adaptcomm::diag
