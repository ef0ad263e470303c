// Which build of adaptcomm this process runs: the project version and the source revision the
// build was configured from. Processes of one job must run the same build: elastic grow refuses a
// replacement from another one (lib/core/elastic/elastic_grow.h), since the wire formats,
// algorithms and store keys of two builds need not match.
#ifndef ADAPTCOMM_LIB_BASE_BUILD_INFO_H_
#define ADAPTCOMM_LIB_BASE_BUILD_INFO_H_

#include <string>

namespace adaptcomm {

// "0.1.0 (git 01294610f5d4-dirty)": CMake's project version and `git describe --always --dirty`
// when CMake configured the build ("git unknown" outside a git checkout). Never contains '|'.
const std::string& BuildVersion();

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_BUILD_INFO_H_
