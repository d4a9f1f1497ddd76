// The low-memory step's ops on a weight gradient kept as its factors
// (src/ops/factored.h): dW [R, C] multiplied out into the call's scratch
// (each block of columns left^T right, then the add_rows term), then its
// squares summed or its AdamW step taken, as for a whole gradient.
#include "backend/cuda/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_adamw_update_factored, op_factored_squared_norm;
}  // namespace ops

namespace NABLA_GPU {
namespace {

// dW from a.in[first...] = left [T, R], values, indices, rights [T, width];
// attrs.ints = {R, C, bf16, each block's col}.
float* factored_gradient(const Operands& a, const Context& ctx, size_t first) {
  const std::vector<int64_t>& ints = a.attrs->ints;
  const int64_t rows = ints[0], cols = ints[1];
  const bool bf16 = ints[2] != 0;
  float* dw = static_cast<float*>(scratch(ctx, size_t(rows * cols > 0 ? rows * cols : 1) * sizeof(float)));
  fill(ctx, TensorView{dw, DType::f32, {rows, cols}, {cols, 1}, true}, 0.0);
  // left^T: [R, T], the same memory.
  TensorView left_t = a.in[first];
  std::swap(left_t.shape[0], left_t.shape[1]);
  std::swap(left_t.strides[0], left_t.strides[1]);
  for (size_t b = first + 3; b < a.in.size(); ++b) product_2d(ctx, left_t, a.in[b], dw + ints[b - first], cols, bf16);
  add_rows(ctx, a.in[first + 1], a.in[first + 2], dw, rows, cols, true);
  return dw;
}

void factored_squared_norm(const Operands& a, const Context& ctx) {
  const int64_t rows = a.attrs->ints[0], cols = a.attrs->ints[1];
  float* dw = factored_gradient(a, ctx, 0);
  squares_sum(ctx, {TensorView{dw, DType::f32, {rows * cols}, {1}, true}}, a.out.ptr<double>());
}

// p, m, v [R, C], hyper, grad_scale, then the factors.
void adamw_update_factored(const Operands& a, const Context& ctx) {
  const int64_t rows = a.attrs->ints[0], cols = a.attrs->ints[1];
  float* dw = factored_gradient(a, ctx, 5);
  adamw(ctx, a, 1, flat_view(TensorView{dw, DType::f32, {rows, cols}, {cols, 1}, true}));
}

}  // namespace

void register_factored_kernels() {
  register_kernel(ops::op_factored_squared_norm, factored_squared_norm);
  register_kernel(ops::op_adamw_update_factored, adamw_update_factored);
}

}  // namespace NABLA_GPU
}  // namespace nabla
