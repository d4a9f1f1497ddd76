// Shapes are in NumPy order: the first dimension is the outermost. Strides
// count elements, not bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace nabla {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t numel(const Shape& shape);
// ShapeError naming `op` unless every dimension is >= 0 and the tensor's
// bytes (elements x elem_size, zero dimensions counted as 1) stay below 2^62,
// so that numel, strides and byte counts of the shape cannot overflow.
void check_shape(const Shape& shape, size_t elem_size, const char* op);
// Row-major strides of a contiguous tensor of this shape.
Strides contiguous_strides(const Shape& shape);
// "[4, 5]"
std::string to_string(const Shape& shape);

// Maps a possibly negative axis into [0, rank); throws ShapeError naming `op`.
int normalize_axis(int64_t axis, int rank, const char* op);

// NumPy broadcasting of two shapes; throws ShapeError naming `op`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace nabla
