// ResolveProfile(): finds the profile file, the registry and the environment, then hands the
// text to the pure loader.
#include "adaptcomm/profile.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "lib/config/profile_loader.h"
#include "lib/config/resolve_internal.h"
#include "lib/config/settings.h"
#include "lib/config/sources.h"
#include "lib/config/tuning.h"
#include "lib/config/units.h"
#include "lib/config/yaml_util.h"

extern char** environ;

namespace adaptcomm {
namespace {

bool FileExists(const std::string& path) {
  return !path.empty() && access(path.c_str(), R_OK) == 0;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The resolved path of `path`, or "" if it does not exist.
std::string RealPath(const std::string& path) {
  char* real = realpath(path.c_str(), nullptr);
  if (real == nullptr) return "";
  std::string resolved(real);
  std::free(real);
  return resolved;
}

// Any object of the library: dladdr() on its address names the file the library was loaded from.
const char kLibraryAnchor = 0;

// The resolved directory of the libadaptcomm.so in use (or of the executable that has this code
// compiled in); "" if unknown.
std::string LoadedLibraryDir() {
  Dl_info info{};
  if (dladdr(&kLibraryAnchor, &info) == 0 || info.dli_fname == nullptr) return "";
  std::string library = RealPath(info.dli_fname);
  return library.empty() ? "" : DirName(library);
}

absl::StatusOr<std::string> FindRegistry(const std::string& profile_file) {
  std::vector<std::string> candidates;
  std::string dir = DefaultConfigDir();
  if (!dir.empty()) candidates.push_back(dir + "/nccl_params.yaml");
  // A template under configs/templates/ finds the registry one level up.
  candidates.push_back(DirName(profile_file) + "/nccl_params.yaml");
  candidates.push_back(DirName(DirName(profile_file)) + "/nccl_params.yaml");
  for (const std::string& c : candidates) {
    if (FileExists(c)) return c;
  }
  return absl::NotFoundError(absl::StrCat(
      "the NCCL parameter registry nccl_params.yaml is in none of: ", candidates[0],
      candidates.size() > 1 ? absl::StrCat(", ", candidates[1]) : "",
      " (set ADAPTCOMM_CONFIG_DIR to the directory holding profiles.yaml and nccl_params.yaml)"));
}

}  // namespace

// An installed library (or an installed program linked with adaptcomm_internal, the `adaptcomm`
// tool) finds the configs installed with it, wherever its prefix is now; the source tree's configs
// serve only the build tree's own modules, so an install never reads the checkout it was built
// from.
std::string DefaultConfigDir() {
  std::string dir = Env("ADAPTCOMM_CONFIG_DIR");
  if (!dir.empty()) return dir;
  const std::string module_dir = LoadedLibraryDir();
  if (module_dir.empty()) return "";
#if defined(ADAPTCOMM_LIBRARY_TO_CONFIG_DIR) && defined(ADAPTCOMM_PROGRAM_TO_CONFIG_DIR)
  for (const char* relative : {ADAPTCOMM_LIBRARY_TO_CONFIG_DIR, ADAPTCOMM_PROGRAM_TO_CONFIG_DIR}) {
    std::string installed = RealPath(module_dir + "/" + relative);
    if (FileExists(installed + "/profiles.yaml")) return installed;
  }
#endif
#if defined(ADAPTCOMM_BUILD_DIR) && defined(ADAPTCOMM_SOURCE_CONFIG_DIR)
  const std::string build_dir = RealPath(ADAPTCOMM_BUILD_DIR);
  if (!build_dir.empty() && absl::StartsWith(module_dir + "/", build_dir + "/") &&
      FileExists(std::string(ADAPTCOMM_SOURCE_CONFIG_DIR) + "/profiles.yaml")) {
    return ADAPTCOMM_SOURCE_CONFIG_DIR;
  }
#endif
  return "";
}

absl::StatusOr<EffectiveConfig> ResolveProfile(const ProfileRequest& request) {
  return config::ResolveSettings(request, config::RunContext{});
}

namespace config {

absl::StatusOr<EffectiveConfig> ResolveSettings(const ProfileRequest& request,
                                                const RunContext& run) {
  for (const auto& [name, value] :
       {std::pair{"model_size", &request.model_size}, std::pair{"file", &request.file}}) {
    if (value->has_value() && (*value)->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ProfileRequest::", name, " is set but empty: leave it unset for the default"));
    }
  }
  config::ResolveInputs in;
  std::string file_origin = "request";
  in.file = request.file.value_or("");
  if (in.file.empty()) {
    in.file = Env("ADAPTCOMM_PROFILE");
    file_origin = "ADAPTCOMM_PROFILE";
  }
  if (in.file.empty()) {
    std::string dir = DefaultConfigDir();
    if (dir.empty()) {
      return absl::NotFoundError(
          "no profile file: set ProfileRequest::file, ADAPTCOMM_PROFILE or ADAPTCOMM_CONFIG_DIR "
          "(no configs/ directory was found in the source tree or the install prefix)");
    }
    in.file = dir + "/profiles.yaml";
    file_origin = "default";
  }
  auto text = config::ReadConfigFile(in.file);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat(text.status().message(), " (profile from ", file_origin, ")"));
  }
  in.text = *std::move(text);
  auto registry_path = FindRegistry(in.file);
  if (!registry_path.ok()) return registry_path.status();
  auto registry = config::NcclRegistry::LoadCached(*registry_path);
  if (!registry.ok()) return registry.status();

  std::string size = request.model_size.value_or("");
  std::string size_origin;
  if (size.empty()) {
    size = Env("ADAPTCOMM_MODEL_SIZE");
    if (!size.empty()) size_origin = "ADAPTCOMM_MODEL_SIZE";
  }
  if (!size.empty()) {
    auto params = config::ParseModelSize(size);
    if (params.ok()) {
      in.model_params = *params;
    } else {
      in.tier_name = size;  // a profile name, or a typo the loader reports with both readings
    }
    in.model_size_text = size;
  }
  std::string strict_env = absl::AsciiStrToLower(Env("ADAPTCOMM_PROFILE_STRICT"));
  in.strict = request.strict || strict_env == "1" || strict_env == "true";
  in.world_size = request.world_size;
  in.overrides = request.overrides;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    if (!absl::StartsWith(entry, "NCCL_")) continue;
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string name = entry.substr(0, eq);
    std::string value = entry.substr(eq + 1);
    if (config::SetByAdaptcomm(name, value)) continue;
    in.user_env[name] = value;
  }
  for (const EnvSetting& e : EnvSettings()) in.env[e.var] = Env(e.var);
  in.run = run;
  auto cfg = config::ResolveFromText(in, **registry);
  if (!cfg.ok()) return cfg.status();
  if (!size_origin.empty()) {
    cfg->notes.insert(cfg->notes.begin(), absl::StrCat("model size ", size, " from ", size_origin));
  }
  if (file_origin == "ADAPTCOMM_PROFILE") {
    cfg->notes.insert(cfg->notes.begin(), absl::StrCat("profile file from ADAPTCOMM_PROFILE"));
  }
  // The tuned table (its path merged like any setting): a relative path in a profile is taken
  // from the profile's directory. A refusal is one of cfg->warnings: creation logs it once.
  std::string table = cfg->tuning.table;
  if (!table.empty() && table[0] != '/' && !absl::StartsWith(cfg->tuning.source, "env ")) {
    table = DirName(in.file) + "/" + table;
  }
  config::AttachTunedTable(*cfg, table, cfg->tuning.source);
  return cfg;
}

}  // namespace config
}  // namespace adaptcomm
