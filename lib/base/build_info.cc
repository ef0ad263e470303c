#include "lib/base/build_info.h"

#ifndef ADAPTCOMM_VERSION_STRING
#define ADAPTCOMM_VERSION_STRING "unknown"
#endif
#ifndef ADAPTCOMM_SOURCE_REVISION
#define ADAPTCOMM_SOURCE_REVISION "unknown"
#endif

namespace adaptcomm {

const std::string& BuildVersion() {
  static const std::string* const version =
      new std::string(ADAPTCOMM_VERSION_STRING " (git " ADAPTCOMM_SOURCE_REVISION ")");
  return *version;
}

}  // namespace adaptcomm
