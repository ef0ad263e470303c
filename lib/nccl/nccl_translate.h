// Our dtypes and reduce ops in NCCL's words (the values of ncclDataType_t and ncclRedOp_t); the
// config translation and result mapping are declared in nccl_backend.h.
#ifndef ADAPTCOMM_LIB_NCCL_NCCL_TRANSLATE_H_
#define ADAPTCOMM_LIB_NCCL_NCCL_TRANSLATE_H_

#include "adaptcomm/types.h"
#include "lib/nccl/nccl_api.h"

namespace adaptcomm::nccl {

NcclDataType ToNccl(DType t);
NcclRedOp ToNccl(ReduceOp op);

}  // namespace adaptcomm::nccl

#endif  // ADAPTCOMM_LIB_NCCL_NCCL_TRANSLATE_H_
