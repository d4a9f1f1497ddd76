// Reference kernels of a training step's optimizer ops: the clipping and the
// updates as their formulas, in double, rounded once per stored value.
#include <cmath>
#include <string>

#include "backend/reference/kernel.h"
#include "nabla/error.h"

namespace nabla {
namespace ops {
extern const OpDef op_accumulate_update, op_adamw_update, op_adamw_update_factored, op_clip_scale, op_sgd_update;
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

// acc, g, restart.
void accumulate_update_kernel(const Operands& a) {
  const TensorView &acc = a.in[0], &g = a.in[1];
  const bool restart = get_at(a.in[2], 0) != 0;
  for_each_index(acc.shape, [&](const Index& i) { set(acc, i, restart ? get(g, i) : get(acc, i) + get(g, i)); });
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

// One AdamW step of p, m, v from gradient element grad(i), hyper {lr, t,
// weight_decay}, grad_scale; attrs reals {beta1, beta2, eps}.
template <class Grad>
void adamw_step(const Operands& a, const std::string& op, const TensorView& p, const TensorView& m,
                const TensorView& v, const TensorView& hyper, const TensorView& grad_scale, Grad grad) {
  const double lr = hyper_at(hyper, 0), t = hyper_at(hyper, 1), wd = hyper_at(hyper, 2);
  const double scale = get_at(grad_scale, 0);
  if (!(lr >= 0) || !std::isfinite(lr)) throw UsageError(op + ": learning rate must be finite and >= 0");
  if (!(t >= 1) || t != std::floor(t)) throw UsageError(op + ": step must be 1, 2, ...");
  if (!(wd >= 0) || !std::isfinite(wd)) throw UsageError(op + ": weight decay must be finite and >= 0");
  const double b1 = a.attrs->reals[0], b2 = a.attrs->reals[1], eps = a.attrs->reals[2];
  const double decay = 1 - lr * wd;
  const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
  for_each_index(p.shape, [&](const Index& i) {
    const double gi = grad(i) * scale;
    const double mi = b1 * get(m, i) + (1 - b1) * gi;
    const double vi = b2 * get(v, i) + (1 - b2) * gi * gi;
    set(m, i, mi);
    set(v, i, vi);
    set(p, i, get(p, i) * decay - lr / bc1 * mi / (std::sqrt(vi / bc2) + eps));
  });
}

// p, g, m, v, hyper, grad_scale.
void adamw_update_kernel(const Operands& a) {
  const TensorView& g = a.in[1];
  adamw_step(a, "adamw_update", a.in[0], a.in[2], a.in[3], a.in[4], a.in[5],
             [&](const Index& i) { return get(g, i); });
}

// p, m, v [R, C], hyper, grad_scale, then the factors: dW in double first.
void adamw_update_factored_kernel(const Operands& a) {
  const std::vector<double> dw = factored_gradient(a, 5);
  const int64_t cols = a.in[0].shape[1];
  adamw_step(a, "adamw_update_factored", a.in[0], a.in[1], a.in[2], a.in[3], a.in[4],
             [&](const Index& i) { return dw[size_t(i[0] * cols + i[1])]; });
}

}  // namespace

void register_optimizer_kernels() {
  register_kernel(ops::op_clip_scale, clip_scale_kernel);
  register_kernel(ops::op_accumulate_update, accumulate_update_kernel);
  register_kernel(ops::op_sgd_update, sgd_update_kernel);
  register_kernel(ops::op_adamw_update, adamw_update_kernel);
  register_kernel(ops::op_adamw_update_factored, adamw_update_factored_kernel);
}

}  // namespace reference
}  // namespace nabla
