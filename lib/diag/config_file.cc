#include "lib/diag/config_file.h"

#include <unistd.h>

#include <string>

#include "adaptcomm/profile.h"

namespace adaptcomm::diag {

// The same directory the profiles come from (DefaultConfigDir: ADAPTCOMM_CONFIG_DIR, else the
// configs installed next to the loaded library, else the source tree for the build tree's own
// library), so an installed tree never reads the checkout it was built from.
std::string FindConfigFile(const std::string& name) {
  const std::string dir = DefaultConfigDir();
  if (dir.empty()) return "";
  std::string path = dir + "/" + name;
  return ::access(path.c_str(), R_OK) == 0 ? path : "";
}

}  // namespace adaptcomm::diag
