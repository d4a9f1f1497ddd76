// sgd_update: one SGD-with-momentum step of a parameter, in place, as a graph
// node (see adamw_update). p and buf are leaves the kernel writes
// (OpDef::mutates); the output is a token of no elements.
//
//   inputs: p, g, buf (f32, one shape; g any layout), hyper f64 [3] =
//           {lr, momentum, weight_decay} (any strides), grad_scale f64, one
//           element (any shape, e.g. a view into clip_scale's output)
//   the arithmetic: optim::sgd_update (src/optim/update.h), shared with
//   optim::Sgd, so the node and the class give the same bits.
#include <cmath>
#include <vector>

#include "backend/cpu/kernel.h"
#include "core/op.h"
#include "ops/internal_ops.h"
#include "optim/update.h"

namespace nabla {
namespace ops {
namespace {

Meta sgd_update_infer(const std::vector<Tensor>& in, const Attrs&) {
  require_f32_like_first("sgd_update", in, {"p", "g", "buf"});
  require_f64("sgd_update", in[3], "hyper", "[3] {lr, momentum, weight_decay}", in[3].shape() == Shape{3});
  require_f64("sgd_update", in[4], "grad_scale", "with one element", in[4].numel() == 1);
  return {DType::f32, {0}};
}

void sgd_update_forward(const KernelArgs& a) {
  const double* hyper = a.in[3].ptr<double>();
  const int64_t step = a.in[3].strides[0];
  const double lr = hyper[0], momentum = hyper[step], weight_decay = hyper[2 * step];
  if (!(lr >= 0) || !std::isfinite(lr) || !std::isfinite(momentum) || !(weight_decay >= 0) ||
      !std::isfinite(weight_decay)) {
    throw UsageError("sgd_update: lr and weight decay must be finite and >= 0, momentum finite; got {" +
                     std::to_string(lr) + ", " + std::to_string(momentum) + ", " + std::to_string(weight_decay) + "}");
  }
  const optim::SgdConstants k = optim::sgd_constants(lr, momentum, weight_decay, a.in[4].ptr<double>()[0]);
  std::vector<float> gathered;
  const float* g = contiguous_f32(a, a.in[1], gathered);
  float *p = a.in[0].ptr<float>(), *buf = a.in[2].ptr<float>();
  // Every element's arithmetic is its own: chunks may start anywhere.
  a.parallel_for(a.in[0].numel(), int64_t{1} << 15,
                 [&](int64_t b, int64_t e) { optim::sgd_update(p + b, buf + b, g + b, e - b, k); });
}

}  // namespace

extern const OpDef op_sgd_update{
    .name = "sgd_update",
    .summary = "one SGD step (momentum, weight decay) of p and its buffer buf from gradient g, in place; a token out",
    .inputs = {{"p", Diff::no}, {"g", Diff::no}, {"buf", Diff::no}, {"hyper", Diff::no}, {"grad_scale", Diff::no}},
    .mutates = {0, 2},
    .infer = sgd_update_infer,
};
NABLA_CPU_KERNEL(op_sgd_update, sgd_update_forward);

}  // namespace ops

Tensor sgd_update(const Tensor& p, const Tensor& g, const Tensor& buf, const Tensor& hyper, const Tensor& grad_scale) {
  return apply(ops::op_sgd_update, {p, g, buf, hyper, grad_scale});
}

}  // namespace nabla
