// adamw_update: one AdamW step of a parameter, in place, as a graph node, so
// that a training step (forward, backward, update) is one graph on any
// backend. p, m and v are leaves the kernel writes (OpDef::mutates); the
// output is a token of no elements.
//
//   inputs: p, g, m, v (f32, one shape; g any layout), schedule f64 [2] =
//           {learning rate, step t from 1}, grad_scale f64 [] (clipping,
//           averaging), attrs reals {beta1, beta2, eps, weight_decay},
//           ints {decay: 1 where weight decay applies}
//   the arithmetic: optim::adamw_update (src/optim/update.h), shared with
//   optim::AdamW, so the node and the class give the same bits.
#include <cmath>
#include <vector>

#include "backend/cpu/kernel.h"
#include "core/op.h"
#include "ops/internal_ops.h"
#include "optim/update.h"

namespace nabla {
namespace ops {
namespace {

Meta adamw_update_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const char* names[] = {"p", "g", "m", "v"};
  for (size_t i = 0; i < 4; ++i) {
    if (in[i].dtype() != DType::f32) {
      throw DTypeError(std::string("adamw_update: ") + names[i] + " must be f32, got " + dtype_name(in[i].dtype()));
    }
    if (in[i].shape() != in[0].shape()) {
      throw ShapeError(std::string("adamw_update: ") + names[i] + " is " + to_string(in[i].shape()) + ", p is " +
                       to_string(in[0].shape()));
    }
  }
  if (in[4].dtype() != DType::f64 || in[4].shape() != Shape{2}) {
    throw ShapeError("adamw_update: schedule must be f64 [2] {lr, step}, got " + to_string(in[4]));
  }
  if (in[5].dtype() != DType::f64 || in[5].numel() != 1) {
    throw ShapeError("adamw_update: grad_scale must be one f64, got " + to_string(in[5]));
  }
  const double b1 = attrs.reals[0], b2 = attrs.reals[1], eps = attrs.reals[2], wd = attrs.reals[3];
  if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1) || !(eps >= 0 && std::isfinite(eps)) ||
      !(wd >= 0 && std::isfinite(wd))) {
    throw UsageError("adamw_update: betas must be in [0, 1), eps and weight decay finite and >= 0");
  }
  return {DType::f32, {0}};
}

optim::AdamWConfig config_of(const Attrs& a) {
  return {.beta1 = a.reals[0], .beta2 = a.reals[1], .eps = a.reals[2], .weight_decay = a.reals[3]};
}

void adamw_update_forward(const KernelArgs& a) {
  const double* schedule = a.in[4].ptr<double>();
  const double lr = schedule[0], t = schedule[1], grad_scale = a.in[5].ptr<double>()[0];
  if (!(lr >= 0) || !std::isfinite(lr)) {
    throw UsageError("adamw_update: learning rate must be finite and >= 0, got " + std::to_string(lr));
  }
  if (!(t >= 1) || t != std::floor(t)) throw UsageError("adamw_update: step must be 1, 2, ..., got " + std::to_string(t));
  const optim::AdamWConstants k =
      optim::adamw_constants(config_of(*a.attrs), int64_t(t), lr, grad_scale, a.attrs->ints[0] != 0);
  std::vector<float> gathered;
  const float* g = a.in[1].ptr<float>();
  if (!a.in[1].contiguous) {
    gathered.resize(size_t(a.in[1].numel()));
    copy_to_contiguous(a, a.in[1], gathered.data());
    g = gathered.data();
  }
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
    .inputs = {{"p", Diff::no}, {"g", Diff::no}, {"m", Diff::no}, {"v", Diff::no}, {"schedule", Diff::no},
               {"grad_scale", Diff::no}},
    .mutates = {0, 2, 3},
    .infer = adamw_update_infer,
};
NABLA_CPU_KERNEL(op_adamw_update, adamw_update_forward);

}  // namespace ops

Tensor adamw_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& schedule,
                    const Tensor& grad_scale, const optim::AdamWConfig& config, bool decay) {
  return apply(ops::op_adamw_update, {p, g, m, v, schedule, grad_scale},
               Attrs{{decay ? 1 : 0}, {config.beta1, config.beta2, config.eps, config.weight_decay}});
}

}  // namespace nabla
