// factored_squared_norm: ||dW||^2 of a weight gradient kept as its factors
// (train::FactoredGradient), as a node of a training graph: low_memory's
// share of the global norm that squared_norm takes of a whole gradient.
//
//   inputs: left [T, R], values [..., C], indices i32 [...], rights [T, width]
//           (src/ops/factored.h; no add_rows term: values f32 [0, C], indices
//           i32 [0]); attrs ints {R, C, bf16, each block's col}
//   output: f64 [] = the GradientRows norm pieces (Gram matrices, no dW)
//           summed in piece order, then max(sum, 0): TrainStep's bits for
//           this gradient; within f32 rounding (~1e-6 relative) of dW's
//           squares summed.
#include <algorithm>
#include <vector>

#include "backend/cpu/kernel.h"
#include "core/op.h"
#include "ops/factored.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

Meta factored_squared_norm_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  check_factors("factored_squared_norm", in, 0, attrs);
  return {DType::f64, {}};
}

void factored_squared_norm_forward(const KernelArgs& a) {
  CpuFactors factors(a, 0);
  train::GradientRows& rows = factors.rows();
  rows.check_indices();
  rows.new_run();
  std::vector<double> parts(size_t(rows.norm_pieces()));
  a.parallel_for(int64_t(parts.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) parts[size_t(k)] = rows.norm_piece(k);
  });
  double sum = 0;
  for (double p : parts) sum += p;
  // Rounding can take an all-but-zero gradient's sum below 0.
  a.out.ptr<double>()[0] = std::max(sum, 0.0);
}

// The factors hold small integers (left +-1, the sign of a constant input;
// the rest integers in [-3, 4)): the kernel's f32 Gram sums are then exact,
// so the reference backend, which sums dW's squares in double, agrees to
// its f64 tolerance. Views taken after the cast reach the kernel strided
// (left transposed, a right sliced with a step), and so do the indices.
Tensor plus_minus_one(const Tensor& x) { return cast(sign(x), DType::f32); }
Tensor small_ints(const Tensor& x) { return cast(x, DType::f32); }

std::vector<GradCase> factored_squared_norm_cases() {
  return {
      // 70 tokens: Gram tiles of 64 and 6 rows, the one left of the diagonal counted twice.
      {"one_block", {constant(normal({6, 70})), integers({70, 4}, -3, 4)},
       [](const std::vector<Tensor>& x) {
         train::FactoredGradient f{.left = transpose(plus_minus_one(x[0])), .blocks = {{small_ints(x[1]), 0}}};
         return cast(factored_squared_norm(f, 6, 4, false), x[0].dtype());
       }},
      // Columns 0, 4, 5, 8 and 9 of 10 in no block; bf16 products (exact on these values).
      {"blocks_bf16", {constant(normal({9, 5})), integers({9, 6}, -3, 4), integers({9, 2}, -3, 4)},
       [](const std::vector<Tensor>& x) {
         train::FactoredGradient f{.left = plus_minus_one(x[0]),
                                   .blocks = {{slice(small_ints(x[1]), 1, 0, 6, 2), 1}, {small_ints(x[2]), 6}}};
         return cast(factored_squared_norm(f, 5, 10, true), x[0].dtype());
       }},
      // Six rows added to four: indices repeat; column 2 only in the added rows.
      {"add_rows",
       {constant(normal({8, 4})), integers({8, 2}, -3, 4), integers({8, 2}, -3, 4), integers({2, 3, 5}, -3, 4),
        integers({2, 3}, 0, 4)},
       [](const std::vector<Tensor>& x) {
         train::FactoredGradient f{.left = plus_minus_one(x[0]),
                                   .blocks = {{small_ints(x[1]), 0}, {small_ints(x[2]), 3}},
                                   .values = small_ints(x[3]),
                                   .indices = x[4]};
         return cast(factored_squared_norm(f, 4, 5, false), x[0].dtype());
       }},
  };
}

}  // namespace

extern const OpDef op_factored_squared_norm{
    .name = "factored_squared_norm",
    .summary = "||dW||^2 in f64 of a weight gradient kept as factors (left^T right per column block, rows added "
               "at indices), from Gram matrices; not differentiated",
    .inputs = {{"left", Diff::no}, {"values", Diff::no}, {"indices", Diff::no}, {"rights", Diff::no}},
    .variadic = true,
    .infer = factored_squared_norm_infer,
    .cases = factored_squared_norm_cases,
};
NABLA_CPU_KERNEL(op_factored_squared_norm, factored_squared_norm_forward);

}  // namespace ops

Tensor factored_squared_norm(const train::FactoredGradient& f, int64_t rows, int64_t cols, bool bf16) {
  return apply(ops::op_factored_squared_norm, ops::factor_operands(f, cols),
               Attrs{ops::factor_attrs(f, rows, cols, bf16), {}});
}

}  // namespace nabla
