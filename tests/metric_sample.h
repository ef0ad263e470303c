// Reading one sample out of Prometheus exposition text (lib/trace/metrics.h's RenderMetrics), for
// the tests that check what a communicator counted.
#ifndef ADAPTCOMM_TESTS_METRIC_SAMPLE_H_
#define ADAPTCOMM_TESTS_METRIC_SAMPLE_H_

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace adaptcomm::testing {

// The value of the one sample of `family` whose labels contain every one of `labels`; -1 if none.
inline double MetricSample(const std::string& text, const std::string& family,
                           const std::vector<std::string>& labels) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, absl::StrCat(family, "{"))) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && absl::StrContains(line, l);
    if (!all) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
  }
  return -1;
}

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_METRIC_SAMPLE_H_
