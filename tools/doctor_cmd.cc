// `adaptcomm doctor LOG...`: names the causes of a failed run from its logs, with fixes.
// Exit code: 0 clean (no known failure signature and no error line), 1 known failure(s) found,
// 2 unreadable log or knowledge base, 3 error lines that no known signature explains and that
// resemble no family (an unknown failure: the report lists them), 4 no known signature, but error
// lines resemble a known family (a likely cause: the report names the family and its fix).
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/diag/config_file.h"
#include "lib/diag/kb_similarity.h"
#include "lib/diag/knowledge_base.h"
#include "lib/diag/log_doctor.h"
#include "tools/subcommands.h"

namespace adaptcomm::tools {
namespace {

struct DoctorArgs {
  std::vector<std::string> logs;
  std::string kb;
  bool json = false;
  size_t top = 10;
};

int RunDoctor(const DoctorArgs& args) {
  std::string kb_path = args.kb.empty() ? diag::FindConfigFile("knowledge_base.yaml") : args.kb;
  if (kb_path.empty()) {
    std::fprintf(stderr,
                 "doctor: configs/knowledge_base.yaml not found; pass --kb FILE or set "
                 "ADAPTCOMM_CONFIG_DIR\n");
    return diag::kDoctorExitUnreadable;
  }
  auto kb = diag::KnowledgeBase::Load(kb_path);
  if (!kb.ok()) {
    std::fprintf(stderr, "doctor: %s\n", std::string(kb.status().message()).c_str());
    return diag::kDoctorExitUnreadable;
  }
  diag::LogDoctor doctor(*kb);
  for (const std::string& log : args.logs) {
    if (absl::Status s = doctor.FeedFile(log); !s.ok()) {
      std::fprintf(stderr, "doctor: %s\n", std::string(s.message()).c_str());
      return diag::kDoctorExitUnreadable;
    }
  }
  diag::DoctorReport report = doctor.Report();
  const std::string out =
      args.json ? diag::RenderDoctorJson(report) + "\n" : diag::RenderDoctorText(report, args.top);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return diag::DoctorExitCode(report);
}

std::function<int()> SetupDoctor(CLI::App& sub) {
  auto args = std::make_shared<DoctorArgs>();
  sub.add_option("logs", args->logs, "Trainer/NCCL log files ('-' = standard input)")->required();
  sub.add_option("--kb", args->kb, "Knowledge base (default: configs/knowledge_base.yaml)");
  sub.add_flag("--json", args->json, "Machine-readable report");
  sub.add_option("--top", args->top, "Causes to print in the text report")
      ->check(CLI::PositiveNumber);
  sub.footer(absl::StrFormat(
      "Exit code: 0 clean, 1 known failure(s) found, 2 unreadable input, 3 error lines that no "
      "known signature explains and that resemble no known family, 4 no known signature but error "
      "lines that resemble a known family.\n"
      "Resembles: an error line no signature matches is compared, word by word (rare words weigh "
      "more), with every example of the knowledge base; at a similarity of %.2f or more (%d "
      "shared words at least) the report names the closest family, its cause and fix as a likely "
      "cause (--json: \"resembles\"). Families and signatures: docs/failures.md#the-log-doctor.",
      diag::kResemblanceThreshold, static_cast<int>(diag::kMinSharedWords)));
  return [args] { return RunDoctor(*args); };
}

}  // namespace

ADAPTCOMM_SUBCOMMAND(doctor, "Classify failures in trainer/NCCL logs and print the fixes",
                     SetupDoctor);

}  // namespace adaptcomm::tools
