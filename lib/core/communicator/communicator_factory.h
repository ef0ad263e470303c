// The internal factories of Communicator: what Communicator::Create and CreateWithBackend do, with
// the CUDA runtime and NCCL seams injected instead of loaded. The public functions call these with
// the defaults (the real loaders). Tests that run ranks as threads, each with its own fake CUDA
// runtime and NCCL (tests/fake_nccl_api.h), and benches reach them through the static
// adaptcomm_internal; libadaptcomm.so does not export them (lib/exports.map, tests/exports.cmake).
#ifndef ADAPTCOMM_LIB_CORE_COMMUNICATOR_COMMUNICATOR_FACTORY_H_
#define ADAPTCOMM_LIB_CORE_COMMUNICATOR_COMMUNICATOR_FACTORY_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/ext/backend.h"
#include "lib/cuda/cuda_api.h"

namespace adaptcomm::nccl {
class NcclApi;  // lib/nccl/nccl_api.h: only the composition root (backend_selection.*) calls it
class NcclSplitComm;  // lib/nccl/nccl_backend.h
}  // namespace adaptcomm::nccl

namespace adaptcomm::internal {

// The seams one rank's communicator uses: for backend selection at creation (every attempt), for
// every backend rebuild of a coordinated retry, and (cuda) for the device mixed-precision path.
struct CommunicatorDeps {
  // False: the real loaders (cuda::LoadCudaApi, nccl::LoadNcclApi), as Communicator::Create.
  // True: `cuda` and `nccl` as given; a null one means this rank has no CUDA runtime, or that
  // NCCL did not load.
  bool use_given_apis = false;
  std::shared_ptr<cuda::CudaApi> cuda;
  std::shared_ptr<nccl::NcclApi> nccl;
  // At creation only (Communicator::Split): the communicator ncclCommSplit made for this child
  // from its parent's; the backend is built on it where NCCL is chosen (SelectionDeps::nccl_split).
  std::shared_ptr<nccl::NcclSplitComm> nccl_split;
};

// Communicator::Create, with `deps`.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicatorWith(
    const CommunicatorOptions& options, const CommunicatorDeps& deps);

// Communicator::CreateWithBackend, with `deps` (the backend is the caller's; deps.cuda serves the
// device mixed-precision path).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicatorWithBackend(
    std::unique_ptr<Backend> backend, const CommunicatorOptions& options,
    const CommunicatorDeps& deps);

// Queues `desc` on `comm` exactly as its public collectives do (timeout: as the *Options'
// timeout, unset for the default; validation, order): for ops the public API has no words for,
// such as the OpDesc::wire allreduce of the mixed-precision collectives (lib/precision). kind,
// views and the op's own fields are the caller's; seq and timeout are assigned here.
Work SubmitOp(Communicator& comm, OpDesc desc, std::optional<absl::Duration> timeout);

// The CUDA runtime `comm` was built with: the one given, else the process's (cuda::LoadCudaApi).
// FailedPrecondition when there is none.
[[nodiscard]] absl::StatusOr<std::shared_ptr<cuda::CudaApi>> CommunicatorCudaApi(
    const Communicator& comm);

// The hook of a straggler detector: sets the adaptcomm_slowness_score gauge of `comm`'s rank (0:
// not slow) and its state record's slowness. Returns false when the profile turned metrics off.
bool SetSlownessScore(Communicator& comm, double score);

}  // namespace adaptcomm::internal

#endif  // ADAPTCOMM_LIB_CORE_COMMUNICATOR_COMMUNICATOR_FACTORY_H_
