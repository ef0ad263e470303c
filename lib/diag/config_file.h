// Finds the data files under configs/ (knowledge base, compatibility matrix, NCCL registry) in
// the directory profiles come from (adaptcomm::DefaultConfigDir()).
#ifndef ADAPTCOMM_LIB_DIAG_CONFIG_FILE_H_
#define ADAPTCOMM_LIB_DIAG_CONFIG_FILE_H_

#include <string>

namespace adaptcomm::diag {

// Full path of configs/<name>, or "" if no candidate directory holds it.
std::string FindConfigFile(const std::string& name);

}  // namespace adaptcomm::diag

#endif  // ADAPTCOMM_LIB_DIAG_CONFIG_FILE_H_
