#include "nabla/shape.h"

#include "nabla/error.h"

namespace nabla {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void check_shape(const Shape& shape, size_t elem_size, const char* op) {
  constexpr uint64_t kMaxBytes = uint64_t(1) << 62;
  for (int64_t d : shape) {
    if (d < 0) throw ShapeError(std::string(op) + ": negative dimension in shape " + to_string(shape));
  }
  // Zero dimensions count as 1: an empty tensor's strides are still products
  // of the other dimensions.
  uint64_t bytes = elem_size;
  for (int64_t d : shape) {
    if (d > 0 && bytes > kMaxBytes / uint64_t(d)) {
      throw ShapeError(std::string(op) + ": shape " + to_string(shape) + " is too large (2^62 bytes or more)");
    }
    bytes *= d > 0 ? uint64_t(d) : 1;
  }
}

Strides contiguous_strides(const Shape& shape) {
  Strides s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int normalize_axis(int64_t axis, int rank, const char* op) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) {
    throw ShapeError(std::string(op) + ": axis " + std::to_string(axis) + " is out of range for rank " +
                     std::to_string(rank));
  }
  return static_cast<int>(a);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw ShapeError(std::string(op) + ": shapes do not broadcast: " + to_string(a) + " and " +
                       to_string(b));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace nabla
