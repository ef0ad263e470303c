// Shared by the profile tests: paths into the source tree and a clean environment.
#ifndef ADAPTCOMM_TESTS_PROFILE_TEST_UTIL_H_
#define ADAPTCOMM_TESTS_PROFILE_TEST_UTIL_H_

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/config/nccl_registry.h"

extern char** environ;

namespace adaptcomm::testing {

inline std::string SourceDir() {
  const char* env = std::getenv("ADAPTCOMM_SOURCE_DIR");
  if (env != nullptr && *env != '\0') return env;
#ifdef ADAPTCOMM_TEST_SOURCE_DIR
  return ADAPTCOMM_TEST_SOURCE_DIR;
#else
  return ".";
#endif
}
inline std::string ConfigPath(const std::string& name) { return SourceDir() + "/configs/" + name; }

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Removes every NCCL_* variable and adaptcomm's selection variables, so results do not depend
// on the shell the test runs in.
inline void ClearProfileEnvironment() {
  std::vector<std::string> names;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    if (name.rfind("NCCL_", 0) == 0) names.push_back(name);
  }
  for (const std::string& n : names) unsetenv(n.c_str());
  for (const char* n : {"ADAPTCOMM_MODEL_SIZE", "ADAPTCOMM_PROFILE", "ADAPTCOMM_PROFILE_STRICT",
                        "ADAPTCOMM_CONFIG_DIR", "ADAPTCOMM_STORE"}) {
    unsetenv(n);
  }
}

inline const config::NcclRegistry& Registry() {
  static const config::NcclRegistry* reg = [] {
    auto r = config::NcclRegistry::Load(ConfigPath("nccl_params.yaml"));
    EXPECT_TRUE(r.ok()) << r.status();
    return new config::NcclRegistry(r.ok() ? *r : config::NcclRegistry());
  }();
  return *reg;
}

}  // namespace adaptcomm::testing

#endif  // ADAPTCOMM_TESTS_PROFILE_TEST_UTIL_H_
