#include "ops/rows.h"

namespace nabla::ops {

std::vector<int32_t> read_row_indices(const char* op, const TensorView& idx, int64_t rows) {
  std::vector<int32_t> v(static_cast<size_t>(idx.numel()));
  cpu::copy_strided(idx.data, idx.shape, idx.strides, sizeof(int32_t), v.data());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0 || v[i] >= rows) {
      throw ShapeError(std::string(op) + ": index " + std::to_string(v[i]) + " at position " + std::to_string(i) +
                       " is out of range for " + std::to_string(rows) + " rows");
    }
  }
  return v;
}

}  // namespace nabla::ops
