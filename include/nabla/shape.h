// Shapes are in NumPy order: the first dimension is the outermost. Strides
// count elements, not bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nabla {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t numel(const Shape& shape);
// Row-major strides of a contiguous tensor of this shape.
Strides contiguous_strides(const Shape& shape);
// "[4, 5]"
std::string to_string(const Shape& shape);

// Maps a possibly negative axis into [0, rank); throws ShapeError naming `op`.
int normalize_axis(int64_t axis, int rank, const char* op);

// NumPy broadcasting of two shapes; throws ShapeError naming `op`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace nabla
