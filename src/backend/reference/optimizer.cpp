// Reference kernels of a training step's optimizer ops: the clipping and the
// updates as their formulas, in double, rounded once per stored value.
#include <cmath>

#include "backend/reference/kernel.h"
#include "nabla/error.h"

namespace nabla {
namespace ops {
extern const OpDef op_adamw_update, op_clip_scale, op_sgd_update;
}  // namespace ops

namespace reference {
namespace {

// Element k of a rank-1 view (settings, hyper) with any stride.
double hyper_at(const TensorView& hyper, int64_t k) { return get_at(hyper, k * hyper.strides[0]); }

// squared_norm (one element), settings {average, clip} -> {norm, scale}.
void clip_scale_kernel(const Operands& a) {
  const double average = hyper_at(a.in[1], 0), clip = hyper_at(a.in[1], 1);
  const double norm = std::sqrt(get_at(a.in[0], 0)) * average;
  const double scale = clip > 0 && norm > clip ? average * (clip / norm) : average;
  set_at(a.out, 0, norm);
  set_at(a.out, 1, scale);
}

// p, g, buf, hyper {lr, momentum, weight_decay}, grad_scale.
void sgd_update_kernel(const Operands& a) {
  const TensorView &p = a.in[0], &g = a.in[1], &buf = a.in[2];
  const double lr = hyper_at(a.in[3], 0), mu = hyper_at(a.in[3], 1), wd = hyper_at(a.in[3], 2);
  const double scale = get_at(a.in[4], 0);
  if (!(lr >= 0) || !std::isfinite(lr) || !std::isfinite(mu) || !(wd >= 0) || !std::isfinite(wd)) {
    throw UsageError("sgd_update: lr and weight decay must be finite and >= 0, momentum finite");
  }
  for_each_index(p.shape, [&](const Index& i) {
    const double b = mu * get(buf, i) + get(g, i) * scale + wd * get(p, i);
    set(buf, i, b);
    set(p, i, get(p, i) - lr * b);
  });
}

// p, g, m, v, hyper {lr, t, weight_decay}, grad_scale; attrs reals {beta1,
// beta2, eps}.
void adamw_update_kernel(const Operands& a) {
  const TensorView &p = a.in[0], &g = a.in[1], &m = a.in[2], &v = a.in[3];
  const double lr = hyper_at(a.in[4], 0), t = hyper_at(a.in[4], 1), wd = hyper_at(a.in[4], 2);
  const double scale = get_at(a.in[5], 0);
  if (!(lr >= 0) || !std::isfinite(lr)) throw UsageError("adamw_update: learning rate must be finite and >= 0");
  if (!(t >= 1) || t != std::floor(t)) throw UsageError("adamw_update: step must be 1, 2, ...");
  if (!(wd >= 0) || !std::isfinite(wd)) throw UsageError("adamw_update: weight decay must be finite and >= 0");
  const double b1 = a.attrs->reals[0], b2 = a.attrs->reals[1], eps = a.attrs->reals[2];
  const double decay = 1 - lr * wd;
  const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
  for_each_index(p.shape, [&](const Index& i) {
    const double gi = get(g, i) * scale;
    const double mi = b1 * get(m, i) + (1 - b1) * gi;
    const double vi = b2 * get(v, i) + (1 - b2) * gi * gi;
    set(m, i, mi);
    set(v, i, vi);
    set(p, i, get(p, i) * decay - lr / bc1 * mi / (std::sqrt(vi / bc2) + eps));
  });
}

}  // namespace

void register_optimizer_kernels() {
  register_kernel(ops::op_clip_scale, clip_scale_kernel);
  register_kernel(ops::op_sgd_update, sgd_update_kernel);
  register_kernel(ops::op_adamw_update, adamw_update_kernel);
}

}  // namespace reference
}  // namespace nabla
