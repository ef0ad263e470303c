// The answer of Store::MultiGet when keys are missing, shared by the default and the stores that
// override it.
#ifndef ADAPTCOMM_LIB_BASE_STORE_MULTI_GET_H_
#define ADAPTCOMM_LIB_BASE_STORE_MULTI_GET_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace adaptcomm {

// NotFound naming `missing` after a zero timeout (one check), else DeadlineExceeded naming them
// and the bound.
absl::Status MultiGetMissing(const std::vector<std::string>& missing, absl::Duration timeout);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_LIB_BASE_STORE_MULTI_GET_H_
