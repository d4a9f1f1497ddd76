// Shared by factored_squared_norm and adamw_update_factored: a factored
// gradient (train::FactoredGradient, src/train/factored_gradient.h) as a
// node's operands, and on the CPU a train::GradientRows over them.
//
//   operands, from the op's first factor input on: left f32 [T, R], values
//   f32 [..., C] and indices i32 [...] (the add_rows term; absent: f32 [0, C]
//   and i32 [0]), then each block's right f32 [T, width], any layouts
//   attrs.ints: {R, C, bf16 (the products round their operands to bf16, as
//   ExecOptions::bf16_matmul makes the graph's matmul), each block's col}
#pragma once

#include <optional>
#include <vector>

#include "backend/cpu/kernel.h"
#include "core/op.h"
#include "train/factored_gradient.h"

namespace nabla::ops {

// The operands and attrs.ints above for f, a gradient of rows x cols.
std::vector<Tensor> factor_operands(const train::FactoredGradient& f, int64_t cols);
std::vector<int64_t> factor_attrs(const train::FactoredGradient& f, int64_t rows, int64_t cols, bool bf16);

// The shape rule of the operands in[first...] and attrs.ints: ShapeError or
// DTypeError naming op, what was expected and what came.
void check_factors(const char* op, const std::vector<Tensor>& in, size_t first, const Attrs& attrs);

// The factors of a.in[first...] as a GradientRows on the CPU: strided
// operands gathered to row-major memory first.
class CpuFactors {
 public:
  CpuFactors(const KernelArgs& a, size_t first);
  train::GradientRows& rows() { return *rows_; }

 private:
  const float* floats(const KernelArgs& a, const TensorView& x);
  std::vector<std::vector<float>> gathered_;
  std::vector<int32_t> indices_;
  std::optional<train::GradientRows> rows_;
};

}  // namespace nabla::ops
