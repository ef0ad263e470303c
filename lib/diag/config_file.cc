#include "lib/diag/config_file.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace adaptcomm::diag {
namespace {

bool Readable(const std::string& path) { return ::access(path.c_str(), R_OK) == 0; }

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

}  // namespace

std::string FindConfigFile(const std::string& name) {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("ADAPTCOMM_CONFIG_DIR"); env != nullptr && *env != '\0') {
    dirs.push_back(env);
  }
  // Both set for the whole library by lib/config/CMakeLists.txt.
#ifdef ADAPTCOMM_SOURCE_CONFIG_DIR
  dirs.push_back(ADAPTCOMM_SOURCE_CONFIG_DIR);
#endif
#ifdef ADAPTCOMM_INSTALL_CONFIG_DIR
  dirs.push_back(ADAPTCOMM_INSTALL_CONFIG_DIR);
#endif
  if (std::string exe = ExecutableDir(); !exe.empty()) {
    dirs.push_back(exe + "/../share/adaptcomm/configs");  // a relocated install
  }
  for (const std::string& dir : dirs) {
    std::string path = dir + "/" + name;
    if (Readable(path)) return path;
  }
  return "";
}

}  // namespace adaptcomm::diag
