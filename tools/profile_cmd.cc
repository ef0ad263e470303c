// `adaptcomm profile explain --model 70B --world 64 [--file F] [--json] [--strict]`: prints the
// effective configuration a trainer with these inputs would get, each setting with its source.
#include <cstdio>
#include <memory>
#include <string>

#include "adaptcomm/profile.h"
#include "tools/subcommands.h"

namespace {

struct ExplainArgs {
  std::string model;
  int world = 8;
  std::string file;
  bool json = false;
  bool strict = false;
};

int RunExplain(const ExplainArgs& args) {
  adaptcomm::ProfileRequest req;
  if (!args.model.empty()) req.model_size = args.model;
  req.world_size = args.world;
  if (!args.file.empty()) req.file = args.file;
  req.strict = args.strict;
  absl::StatusOr<adaptcomm::EffectiveConfig> cfg = adaptcomm::ResolveProfile(req);
  if (!cfg.ok()) {
    std::fprintf(stderr, "adaptcomm profile explain: %s\n", cfg.status().ToString().c_str());
    return 1;
  }
  std::string text = args.json ? cfg->ExplainJson() + "\n" : cfg->Explain();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

std::function<int()> SetupProfile(CLI::App& sub) {
  auto args = std::make_shared<ExplainArgs>();
  sub.require_subcommand(1);
  CLI::App* explain = sub.add_subcommand(
      "explain", "Print every effective setting with its value, source and how it is applied");
  explain->add_option("--model", args->model,
                      "Model size (7B, 235B, 1.5T, 7000000000) or a profile name; default: "
                      "ADAPTCOMM_MODEL_SIZE, else the smallest tier");
  explain->add_option("--world", args->world, "World size (number of ranks)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  explain->add_option("--file", args->file,
                      "Profile file; default: ADAPTCOMM_PROFILE, else profiles.yaml in the "
                      "configuration directory");
  explain->add_flag("--json", args->json, "Machine-readable output");
  explain->add_flag(
      "--strict", args->strict,
      "Refuse variables NCCL never reads or does not know (ADAPTCOMM_PROFILE_STRICT=1)");
  return [args, explain]() -> int {
    if (explain->parsed()) return RunExplain(*args);
    return 2;
  };
}

}  // namespace

ADAPTCOMM_SUBCOMMAND(profile, "Explain size-tiered profiles and the settings they produce",
                     SetupProfile);
