// adamw_update: one AdamW step of a parameter, in place, as a graph node, so
// that a training step (forward, backward, update) is one graph on any
// backend. p, m and v are leaves the kernel writes (OpDef::mutates); the
// output is a token of no elements.
//
//   inputs: p, g, m, v (f32, one shape; g any layout), hyper f64 [3] =
//           {learning rate, step t from 1, weight decay (0 where p takes
//           none)}, any strides (a row of an f64 [P, 3] leaf), grad_scale
//           f64, one element, any shape (clipping, averaging), attrs reals
//           {beta1, beta2, eps}
//   the arithmetic: optim::adamw_update (src/optim/update.h), shared with
//   optim::AdamW, so the node and the class give the same bits.
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/kernel.h"
#include "core/op.h"
#include "ops/adamw_update.h"
#include "ops/internal_ops.h"
#include "optim/update.h"

namespace nabla {
namespace ops {
namespace {

Meta adamw_update_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  require_f32_like_first("adamw_update", in, {"p", "g", "m", "v"});
  require_f64("adamw_update", in[4], "hyper", "[3] {lr, step, weight_decay}", in[4].shape() == Shape{3});
  require_f64("adamw_update", in[5], "grad_scale", "with one element", in[5].numel() == 1);
  check_adamw_settings("adamw_update", attrs);
  return {DType::f32, {0}};
}

}  // namespace

void check_adamw_settings(const char* op, const Attrs& attrs) {
  const double b1 = attrs.reals[0], b2 = attrs.reals[1], eps = attrs.reals[2];
  if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1) || !(eps >= 0 && std::isfinite(eps))) {
    throw UsageError(std::string(op) + ": betas must be in [0, 1), eps finite and >= 0");
  }
}

optim::AdamWConstants adamw_node_constants(const char* op, const TensorView& hyper_view, const TensorView& grad_scale,
                                           const Attrs& attrs) {
  const double* hyper = hyper_view.ptr<double>();
  const int64_t step = hyper_view.strides[0];
  const double lr = hyper[0], t = hyper[step], wd = hyper[2 * step];
  const std::string name = op;
  if (!(lr >= 0) || !std::isfinite(lr)) {
    throw UsageError(name + ": learning rate must be finite and >= 0, got " + std::to_string(lr));
  }
  if (!(t >= 1) || t != std::floor(t)) throw UsageError(name + ": step must be 1, 2, ..., got " + std::to_string(t));
  if (!(wd >= 0) || !std::isfinite(wd)) {
    throw UsageError(name + ": weight decay must be finite and >= 0, got " + std::to_string(wd));
  }
  const optim::AdamWConfig config{.beta1 = attrs.reals[0], .beta2 = attrs.reals[1], .eps = attrs.reals[2],
                                  .weight_decay = wd};
  return optim::adamw_constants(config, int64_t(t), lr, grad_scale.ptr<double>()[0], true);
}

namespace {

void adamw_update_forward(const KernelArgs& a) {
  const optim::AdamWConstants k = adamw_node_constants("adamw_update", a.in[4], a.in[5], *a.attrs);
  std::vector<float> gathered;
  const float* g = contiguous_f32(a, a.in[1], gathered);
  float *p = a.in[0].ptr<float>(), *m = a.in[2].ptr<float>(), *v = a.in[3].ptr<float>();
  // Every element's arithmetic is lane-wise: chunks may start anywhere.
  a.parallel_for(a.in[0].numel(), int64_t{1} << 15, [&](int64_t b, int64_t e) {
    optim::adamw_update(p + b, m + b, v + b, g + b, e - b, k);
  });
}

}  // namespace

extern const OpDef op_adamw_update{
    .name = "adamw_update",
    .summary = "one AdamW step of p and its moments m, v from gradient g, in place; a token out",
    .inputs = {{"p", Diff::no}, {"g", Diff::no}, {"m", Diff::no}, {"v", Diff::no}, {"hyper", Diff::no},
               {"grad_scale", Diff::no}},
    .mutates = {0, 2, 3},
    .infer = adamw_update_infer,
};
NABLA_CPU_KERNEL(op_adamw_update, adamw_update_forward);

}  // namespace ops

Tensor adamw_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& hyper,
                    const Tensor& grad_scale, double beta1, double beta2, double eps) {
  return apply(ops::op_adamw_update, {p, g, m, v, hyper, grad_scale}, Attrs{{}, {beta1, beta2, eps}});
}

}  // namespace nabla
