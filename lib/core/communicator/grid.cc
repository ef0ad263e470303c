// CreateGrid (adaptcomm/grid.h): three Splits of the parent, colored by the other two coordinates.
#include "adaptcomm/grid.h"

#include <array>
#include <string>

#include "absl/strings/str_cat.h"

namespace adaptcomm {
namespace {

const char* AxisName(GridAxis a) {
  switch (a) {
    case GridAxis::kTensor:
      return "tensor";
    case GridAxis::kPipeline:
      return "pipeline";
    case GridAxis::kData:
      return "data";
  }
  return "?";
}

struct Shape {
  std::array<int, 3> size;  // indexed by GridAxis
  std::array<GridAxis, 3> order;
};

absl::StatusOr<Shape> ShapeOf(const GridOptions& o, int world) {
  if (o.tensor < 1 || o.pipeline < 1 || o.data.value_or(1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("grid: sizes must be positive (tensor ", o.tensor, ", pipeline ", o.pipeline,
                     ", data ", o.data.has_value() ? absl::StrCat(*o.data) : "unset", ")"));
  }
  Shape s{{o.tensor, o.pipeline, o.data.value_or(world / (o.tensor * o.pipeline))}, o.order};
  if (s.size[0] * s.size[1] * s.size[2] != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("grid: tensor ", s.size[0], " x pipeline ", s.size[1], " x data ", s.size[2],
                     " does not make the communicator's ", world, " ranks"));
  }
  std::array<bool, 3> seen{};
  for (GridAxis a : o.order) {
    if (seen[static_cast<int>(a)]) {
      return absl::InvalidArgumentError(
          absl::StrCat("grid: the order names the ", AxisName(a), " axis twice"));
    }
    seen[static_cast<int>(a)] = true;
  }
  return s;
}

// Coordinates of `rank`, indexed by GridAxis.
std::array<int, 3> Coordinates(const Shape& s, int rank) {
  std::array<int, 3> c{};
  for (GridAxis a : s.order) {
    const int i = static_cast<int>(a);
    c[i] = rank % s.size[i];
    rank /= s.size[i];
  }
  return c;
}

}  // namespace

int GridRank(const GridOptions& options, int world_size, int tensor, int pipeline, int data) {
  absl::StatusOr<Shape> s = ShapeOf(options, world_size);
  if (!s.ok()) return -1;
  const std::array<int, 3> c = {tensor, pipeline, data};
  int rank = 0;
  for (int k = 2; k >= 0; --k) {
    const int i = static_cast<int>(s->order[k]);
    if (c[i] < 0 || c[i] >= s->size[i]) return -1;
    rank = rank * s->size[i] + c[i];
  }
  return rank;
}

absl::StatusOr<Grid> CreateGrid(Communicator& parent, const GridOptions& options) {
  absl::StatusOr<Shape> shape = ShapeOf(options, parent.size());
  if (!shape.ok()) return shape.status();
  const std::array<int, 3> c = Coordinates(*shape, parent.rank());
  const std::array<int, 3>& n = shape->size;
  Grid g;
  g.tensor_rank = c[0];
  g.pipeline_rank = c[1];
  g.data_rank = c[2];
  g.tensor_size = n[0];
  g.pipeline_size = n[1];
  g.data_size = n[2];
  SplitOptions split;
  split.backend = options.backend;
  // One Split per axis: the color is the other two coordinates, the key the coordinate itself.
  std::array<std::unique_ptr<Communicator>*, 3> out = {&g.tensor, &g.pipeline, &g.data};
  for (int axis = 0; axis < 3; ++axis) {
    const int u = (axis + 1) % 3, v = (axis + 2) % 3;
    const int color = c[u] * n[v] + c[v];
    absl::StatusOr<std::unique_ptr<Communicator>> child = parent.Split(color, c[axis], split);
    if (!child.ok()) {
      return absl::Status(child.status().code(),
                          absl::StrCat("grid: creating the ", AxisName(static_cast<GridAxis>(axis)),
                                       " group: ", child.status().message()));
    }
    *out[axis] = *std::move(child);
  }
  return g;
}

}  // namespace adaptcomm
