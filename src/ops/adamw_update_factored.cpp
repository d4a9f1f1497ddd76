// adamw_update_factored: one AdamW step of a weight whose gradient is kept as
// its factors (train::FactoredGradient), in place, as a graph node: low_memory
// training's update, the gradient multiplied out a chunk at a time and never
// held whole. p, m and v are leaves the kernel writes (OpDef::mutates); the
// output is a token of no elements.
//
//   inputs: p, m, v (f32 [R, C]), hyper f64 [3] = {learning rate, step t from
//           1, weight decay (0 where p takes none)}, any strides, grad_scale
//           f64, one element, any shape, then the factors (src/ops/factored.h:
//           left, values, indices, rights); attrs reals {beta1, beta2, eps},
//           ints {R, C, bf16, each block's col}
//   the arithmetic: each chunk's gradient from train::GradientRows::range,
//   then optim::adamw_update (src/optim/update.h): TrainStep's low_memory
//   update, bit for bit.
#include <vector>

#include "backend/cpu/kernel.h"
#include "core/op.h"
#include "ops/adamw_update.h"
#include "ops/factored.h"
#include "ops/internal_ops.h"
#include "optim/update.h"

namespace nabla {
namespace ops {
namespace {

constexpr size_t kFirstFactor = 5;  // p, m, v, hyper, grad_scale, then the factors

Meta adamw_update_factored_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  require_f32_like_first("adamw_update_factored", in, {"p", "m", "v"});
  if (in[0].rank() != 2) throw ShapeError("adamw_update_factored: p must be [R, C], got " + to_string(in[0].shape()));
  require_f64("adamw_update_factored", in[3], "hyper", "[3] {lr, step, weight_decay}", in[3].shape() == Shape{3});
  require_f64("adamw_update_factored", in[4], "grad_scale", "with one element", in[4].numel() == 1);
  check_adamw_settings("adamw_update_factored", attrs);
  check_factors("adamw_update_factored", in, kFirstFactor, attrs);
  const Shape factored{attrs.ints[0], attrs.ints[1]};
  if (in[0].shape() != factored) {
    throw ShapeError("adamw_update_factored: the factors make a gradient of " + to_string(factored) + ", p is " +
                     to_string(in[0].shape()));
  }
  return {DType::f32, {0}};
}

void adamw_update_factored_forward(const KernelArgs& a) {
  const optim::AdamWConstants k = adamw_node_constants("adamw_update_factored", a.in[3], a.in[4], *a.attrs);
  CpuFactors factors(a, kFirstFactor);
  train::GradientRows& rows = factors.rows();
  rows.check_indices();
  rows.new_run();
  float *p = a.in[0].ptr<float>(), *m = a.in[1].ptr<float>(), *v = a.in[2].ptr<float>();
  // optim::AdamW's chunk size. A chunk's gradient elements do not depend on
  // where it starts (range() computes each as the graph's matmul would), and
  // the update is lane-wise.
  a.parallel_for(a.in[0].numel(), int64_t{1} << 15, [&](int64_t b, int64_t e) {
    optim::adamw_update(p + b, m + b, v + b, rows.range(b, e), e - b, k);
  });
}

}  // namespace

extern const OpDef op_adamw_update_factored{
    .name = "adamw_update_factored",
    .summary = "one AdamW step of p and its moments m, v from a gradient kept as factors (multiplied out a chunk at "
               "a time), in place; a token out",
    .inputs = {{"p", Diff::no}, {"m", Diff::no}, {"v", Diff::no}, {"hyper", Diff::no}, {"grad_scale", Diff::no},
               {"left", Diff::no}, {"values", Diff::no}, {"indices", Diff::no}, {"rights", Diff::no}},
    .variadic = true,
    .mutates = {0, 1, 2},
    .infer = adamw_update_factored_infer,
};
NABLA_CPU_KERNEL(op_adamw_update_factored, adamw_update_factored_forward);

}  // namespace ops

Tensor adamw_update_factored(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& hyper,
                             const Tensor& grad_scale, const train::FactoredGradient& f, bool bf16, double beta1,
                             double beta2, double eps) {
  std::vector<Tensor> in{p, m, v, hyper, grad_scale};
  const std::vector<Tensor> factors = ops::factor_operands(f, p.rank() == 2 ? p.dim(1) : 0);
  in.insert(in.end(), factors.begin(), factors.end());
  return apply(ops::op_adamw_update_factored, std::move(in),
               Attrs{ops::factor_attrs(f, p.rank() == 2 ? p.dim(0) : 0, p.rank() == 2 ? p.dim(1) : 0, bf16),
                     {beta1, beta2, eps}});
}

}  // namespace nabla
