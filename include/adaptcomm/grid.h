// The tensor x pipeline x data grid of a 3D-parallel trainer, built from one communicator.
//
//   adaptcomm::GridOptions g;  g.tensor = 2;  g.pipeline = 2;            // data: the rest
//   absl::StatusOr<adaptcomm::Grid> grid = adaptcomm::CreateGrid(*world, g);  // a collective
//   (*grid).tensor->Allreduce(...);   // partial sums of a split layer
//   (*grid).pipeline->Send(...);      // activations to the next stage
//   (*grid).data->Allreduce(...);     // gradients (or a GradientBucketer on it)
//
// Layout. The parent's ranks are laid out with the first axis of GridOptions::order varying
// fastest. The default order {tensor, pipeline, data} is Megatron-LM's:
//   rank = (data * pipeline_size + pipeline) * tensor_size + tensor
// so the ranks of a tensor group are adjacent (one host, the fastest links). A tensor group holds
// the ranks with the same pipeline and data coordinates, ranked by their tensor coordinate; a
// pipeline group those with the same tensor and data coordinates, ranked by stage; a data group
// those with the same tensor and pipeline coordinates, ranked by replica.
//
// Compiles as C++17.
#ifndef ADAPTCOMM_GRID_H_
#define ADAPTCOMM_GRID_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "adaptcomm/communicator.h"
#include "adaptcomm/export.h"

namespace adaptcomm {

enum class GridAxis : uint8_t { kTensor, kPipeline, kData };

struct GridOptions {
  int tensor = 1;    // ranks per tensor-parallel group
  int pipeline = 1;  // pipeline stages
  // Data-parallel replicas. Unset: the parent's size / (tensor x pipeline).
  std::optional<int> data = std::nullopt;
  // The axes from fastest- to slowest-varying in the parent's rank order; each exactly once.
  std::array<GridAxis, 3> order = {GridAxis::kTensor, GridAxis::kPipeline, GridAxis::kData};
  // The children's backend (kAuto chooses per group: shared memory inside one host, ...).
  BackendChoice backend = BackendChoice::kAuto;
};

// This rank's place in the grid and its three groups. Each group is a Communicator of its own
// (Communicator::Split); a group of one rank is a communicator of size 1. The parent must outlive
// them when one of its ranks serves the store.
struct Grid {
  int tensor_rank = 0, pipeline_rank = 0, data_rank = 0;  // this rank's coordinates
  int tensor_size = 1, pipeline_size = 1, data_size = 1;
  std::unique_ptr<Communicator> tensor;
  std::unique_ptr<Communicator> pipeline;
  std::unique_ptr<Communicator> data;
};

// A collective over `parent` (three Splits, in the order tensor, pipeline, data). InvalidArgument
// when the sizes do not multiply to the parent's size or the order repeats an axis; otherwise
// Split's errors, naming the group.
[[nodiscard]] ADAPTCOMM_EXPORT absl::StatusOr<Grid> CreateGrid(Communicator& parent,
                                                               const GridOptions& options);

// The parent rank at these coordinates under `options` (the layout above), for placing data and
// peers without a lookup. -1 when a coordinate is out of range.
ADAPTCOMM_EXPORT int GridRank(const GridOptions& options, int world_size, int tensor, int pipeline,
                              int data);

}  // namespace adaptcomm

#endif  // ADAPTCOMM_GRID_H_
