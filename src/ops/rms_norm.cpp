// rms_norm: root-mean-square normalisation over the last axis, no affine.
//
//   x, y [..., C]      y = x * rstd,  rstd = 1 / sqrt(mean(x^2) + eps)
//
// The affine form rms_norm(x, gamma, eps) is a composition, differentiated by mul.
#include <cmath>

#include "backend/cpu/kernel.h"
#include "ops/internal_ops.h"
#include "ops/norm.h"

namespace nabla {
namespace ops {
namespace {

// One row per work item; the mean square accumulates in double.
template <class T>
void rms_norm_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const T* xp = x.ptr<T>();
  T* out = a.out.ptr<T>();
  const int64_t cols = a.out.shape.back();
  const int64_t sx = x.strides.back();
  const double eps = norm_eps(*a.attrs);
  for_each_row<1>(a, [&](int64_t row, const std::array<int64_t, 1>& off) {
    const T* xr = xp + off[0];
    T* yr = out + row * cols;
    double ms = 0;
    for (int64_t j = 0; j < cols; ++j) ms += double(xr[j * sx]) * double(xr[j * sx]);
    double rstd = 1.0 / std::sqrt(ms / double(cols) + eps);
    for (int64_t j = 0; j < cols; ++j) yr[j] = static_cast<T>(double(xr[j * sx]) * rstd);
  });
}

void rms_norm_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "rms_norm", [&]<class T>() { rms_norm_kernel<T>(a); });
}

Tensor rms_norm_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  return in[0] * rsqrt(mean(square(in[0]), {-1}, true) + norm_eps(attrs));
}

// x, dy, dx [..., C]: dx = rstd (dy - xhat mean(dy xhat)), a fused op of its own.
Grads rms_norm_backward(const BackwardArgs& g) {
  return {rms_norm_back(g.inputs[0], g.dout, norm_eps(g.attrs))};
}

std::vector<GradCase> rms_norm_cases() {
  using V = std::vector<Tensor>;
  return {
      {"matrix", {normal({3, 5})}, [](const V& x) { return rms_norm(x[0], 1e-5); }},
      {"rank3", {normal({2, 3, 4})}, [](const V& x) { return rms_norm(x[0], 1e-5); }},
      {"single_column", {normal({3, 1})}, [](const V& x) { return rms_norm(x[0], 1e-5); }},
      // A large eps so it visibly enters the gradient.
      {"large_eps", {normal({4, 6})}, [](const V& x) { return rms_norm(x[0], 0.5); }},
      {"affine",
       {normal({2, 3, 4}), normal({4})},
       [](const V& x) { return rms_norm(x[0], x[1], 1e-5); }},
  };
}

}  // namespace

extern const OpDef op_rms_norm{
    .name = "rms_norm",
    .summary = "x / sqrt(mean(x^2) + eps) over the last axis; fused",
    .inputs = {{"x", Diff::yes}},
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs& at) { return infer_norm("rms_norm", in, at); },
    .backward = rms_norm_backward,
    .composite = rms_norm_composite,
    .cases = rms_norm_cases,
};
NABLA_CPU_KERNEL(op_rms_norm, rms_norm_forward);

}  // namespace ops

Tensor rms_norm(const Tensor& x, double eps) {
  return apply(ops::op_rms_norm, {x}, ops::norm_attrs(eps));
}

Tensor rms_norm(const Tensor& x, const Tensor& gamma, double eps) {
  if (x.defined()) ops::check_norm_param("rms_norm", "gamma", gamma, x);
  Tensor y = rms_norm(x, eps);
  return gamma.defined() ? y * gamma : y;
}

}  // namespace nabla
