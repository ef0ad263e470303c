#include "lib/diag/compat_matrix.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lib/config/yaml_util.h"
#include "yaml-cpp/yaml.h"

namespace adaptcomm::diag {

int CompareVersions(const std::string& a, const std::string& b) {
  std::vector<std::string> pa = absl::StrSplit(a, '.');
  std::vector<std::string> pb = absl::StrSplit(b, '.');
  for (size_t i = 0; i < std::max(pa.size(), pb.size()); ++i) {
    const long x = i < pa.size() ? std::strtol(pa[i].c_str(), nullptr, 10) : 0;
    const long y = i < pb.size() ? std::strtol(pb[i].c_str(), nullptr, 10) : 0;
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

absl::StatusOr<CompatMatrix> CompatMatrix::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

absl::StatusOr<CompatMatrix> CompatMatrix::Parse(const std::string& yaml_text,
                                                 const std::string& name) {
  CompatMatrix m;
  // The shared parser: syntax errors with positions, duplicate keys refused.
  absl::StatusOr<YAML::Node> parsed = config::ParseYaml(yaml_text, name);
  if (!parsed.ok()) return parsed.status();
  try {
    const YAML::Node& root = *parsed;
    for (const auto& kv : root["cuda_toolkit_min_driver"]) {
      m.toolkit_min_driver[kv.first.as<std::string>()] = kv.second.as<std::string>();
    }
    for (const auto& kv : root["minor_version_compat_min_driver"]) {
      m.minor_compat_min_driver[kv.first.as<std::string>()] = kv.second.as<std::string>();
    }
    YAML::Node nccl = root["nccl"];
    if (!nccl || !nccl["minimum"] || !nccl["recommended"]) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": nccl.minimum/recommended missing"));
    }
    m.nccl_minimum = nccl["minimum"].as<std::string>();
    m.nccl_recommended = nccl["recommended"].as<std::string>();
    for (const auto& note : nccl["notes"]) {
      m.nccl_notes.emplace_back(note["below"].as<std::string>(), note["text"].as<std::string>());
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", e.what()));
  }
  return m;
}

std::vector<CheckResult> CheckVersions(const CompatMatrix& matrix, const LibraryVersion& driver,
                                       const std::string& driver_version,
                                       const LibraryVersion& runtime, const LibraryVersion& nccl,
                                       bool expect_gpu) {
  std::vector<CheckResult> out;
  auto add = [&](std::string check, CheckStatus st, std::string detail, std::string fix = "") {
    out.push_back({std::move(check), st, std::move(detail), std::move(fix)});
  };
  const CheckStatus missing = expect_gpu ? CheckStatus::kFail : CheckStatus::kPass;

  if (driver.found) {
    add("version.cuda_driver", CheckStatus::kPass,
        absl::StrCat("supports CUDA ", driver.version,
                     driver_version.empty() ? "" : absl::StrCat(" (driver ", driver_version, ")"),
                     ", ", driver.path));
  } else {
    add("version.cuda_driver", missing, absl::StrCat("no CUDA driver: libcuda.so.1 ", driver.error),
        expect_gpu ? "install the NVIDIA driver (or run on a GPU node)" : "");
  }
  if (runtime.found) {
    add("version.cuda_runtime", CheckStatus::kPass,
        absl::StrCat("CUDA runtime ", runtime.version, ", ", runtime.path));
  } else {
    add("version.cuda_runtime", expect_gpu ? CheckStatus::kFail : CheckStatus::kPass,
        absl::StrCat("no CUDA runtime: ", runtime.error),
        expect_gpu ? "install the CUDA runtime matching the trainer's build" : "");
  }
  if (!nccl.found) {
    add("version.nccl", expect_gpu ? CheckStatus::kFail : CheckStatus::kWarn,
        absl::StrCat("NCCL not loadable: ", nccl.error, "; adaptcomm uses Gloo"),
        "install NCCL (libnccl2) or add its directory to LD_LIBRARY_PATH");
  } else if (CompareVersions(nccl.version, matrix.nccl_minimum) < 0) {
    add("version.nccl", CheckStatus::kFail,
        absl::StrCat("NCCL ", nccl.version, " at ", nccl.path, " is older than the minimum ",
                     matrix.nccl_minimum),
        absl::StrCat("upgrade NCCL to ", matrix.nccl_recommended, " or newer"));
  } else {
    std::string notes;
    for (const auto& [below, text] : matrix.nccl_notes) {
      if (CompareVersions(nccl.version, below) < 0) absl::StrAppend(&notes, "; ", text);
    }
    const bool old = CompareVersions(nccl.version, matrix.nccl_recommended) < 0;
    add("version.nccl", old ? CheckStatus::kWarn : CheckStatus::kPass,
        absl::StrCat("NCCL ", nccl.version, " loaded from ", nccl.path, notes),
        old ? absl::StrCat("upgrade NCCL to ", matrix.nccl_recommended, " or newer") : "");
  }

  if (driver.found && runtime.found) {
    const std::string major = std::to_string(runtime.code / 1000);
    if (runtime.code <= driver.code) {
      add("compat.driver_runtime", CheckStatus::kPass,
          absl::StrCat("runtime ", runtime.version, " <= driver's CUDA ", driver.version));
    } else if (runtime.code / 1000 == driver.code / 1000 && !driver_version.empty() &&
               matrix.minor_compat_min_driver.count(major) > 0 &&
               CompareVersions(driver_version, matrix.minor_compat_min_driver.at(major)) >= 0) {
      add("compat.driver_runtime", CheckStatus::kWarn,
          absl::StrCat("runtime ", runtime.version, " is newer than the driver's CUDA ",
                       driver.version, ": runs by minor-version compatibility only"),
          absl::StrCat("upgrade the driver to >= ",
                       matrix.toolkit_min_driver.count(runtime.version)
                           ? matrix.toolkit_min_driver.at(runtime.version)
                           : "the toolkit's release driver",
                       " (PTX JIT and newer features need it)"));
    } else {
      add("compat.driver_runtime", CheckStatus::kFail,
          absl::StrCat("runtime ", runtime.version, " needs a newer driver than CUDA ",
                       driver.version, driver_version.empty() ? "" : " (" + driver_version + ")"),
          absl::StrCat("upgrade the driver to >= ",
                       matrix.toolkit_min_driver.count(runtime.version)
                           ? matrix.toolkit_min_driver.at(runtime.version)
                           : "the toolkit's release driver",
                       ", or use the cuda-compat forward-compatibility package"));
    }
  } else {
    add("compat.driver_runtime", CheckStatus::kPass,
        driver.found ? "no CUDA runtime to compare" : "no CUDA driver: nothing to compare");
  }
  return out;
}

}  // namespace adaptcomm::diag
