// rms_norm_back: the gradient of rms_norm(x, eps) with respect to x.
//
//   x, dy, dx [..., C]   xhat = x * rstd,  rstd = 1 / sqrt(mean(x^2) + eps)
//   dx = rstd * (dy - xhat * mean(dy * xhat))      (means over C)
//
// It has no backward rule of its own: it differentiates through its
// composite, which gives rms_norm second derivatives.
#include <cmath>

#include "backend/cpu/kernel.h"
#include "nabla/graph.h"
#include "ops/internal_ops.h"
#include "ops/norm.h"

namespace nabla {
namespace ops {
namespace {

// One row per work item, sums in double; x and dy may have any strides.
// NOTE: reads only x and dy (never the forward output), so no buffer of the
// forward needs to outlive it; the planner keeps x and dy alive until here.
template <class T>
void rms_norm_back_kernel(const KernelArgs& a) {
  const TensorView &x = a.in[0], &dy = a.in[1];
  const T* xp = x.ptr<T>();
  const T* dyp = dy.ptr<T>();
  T* out = a.out.ptr<T>();
  const int64_t cols = a.out.shape.back();
  const int64_t sx = x.strides.back(), sd = dy.strides.back();
  const double eps = norm_eps(*a.attrs);
  const double n = double(cols);
  for_each_row<2>(a, [&](int64_t row, const std::array<int64_t, 2>& off) {
    const T* xr = xp + off[0];
    const T* dr = dyp + off[1];
    T* dxr = out + row * cols;
    double ms = 0, dot = 0;
    for (int64_t j = 0; j < cols; ++j) {
      double v = double(xr[j * sx]);
      ms += v * v;
      dot += double(dr[j * sd]) * v;
    }
    double rstd = 1.0 / std::sqrt(ms / n + eps);
    double mean_dy_xhat = dot * rstd / n;
    for (int64_t j = 0; j < cols; ++j) {
      double xhat = double(xr[j * sx]) * rstd;
      dxr[j] = static_cast<T>(rstd * (double(dr[j * sd]) - xhat * mean_dy_xhat));
    }
  });
}

void rms_norm_back_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "rms_norm_back", [&]<class T>() { rms_norm_back_kernel<T>(a); });
}

Tensor rms_norm_back_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &dy = in[1];
  Tensor rstd = rsqrt(mean(square(x), {-1}, true) + norm_eps(attrs));
  Tensor xhat = x * rstd;
  return rstd * (dy - xhat * mean(dy * xhat, {-1}, true));
}

std::vector<GradCase> rms_norm_back_cases() {
  using V = std::vector<Tensor>;
  return {
      {"matrix",
       {normal({3, 5}), normal({3, 5})},
       [](const V& x) { return rms_norm_back(x[0], x[1], 1e-5); }},
      {"rank3",
       {normal({2, 3, 4}), normal({2, 3, 4})},
       [](const V& x) { return rms_norm_back(x[0], x[1], 1e-5); }},
      {"large_eps",
       {normal({4, 6}), normal({4, 6})},
       [](const V& x) { return rms_norm_back(x[0], x[1], 0.5); }},
      // Second order: d/dx of <v, d rms_norm(x) / dx>, through this op.
      {"second_order",
       {normal({3, 5})},
       [](const V& x) {
         Tensor y = rms_norm(x[0], 1e-5);
         return grad(sum(y * y * y), {x[0]})[0];
       }},
  };
}

}  // namespace

extern const OpDef op_rms_norm_back{
    .name = "rms_norm_back",
    .summary = "the gradient of rms_norm: rstd (dy - xhat mean(dy xhat)); fused",
    .inputs = {{"x", Diff::yes}, {"dy", Diff::yes}},
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs& at) { return infer_norm("rms_norm_back", in, at); },
    .composite = rms_norm_back_composite,
    .cases = rms_norm_back_cases,
};
NABLA_CPU_KERNEL(op_rms_norm_back, rms_norm_back_forward);

}  // namespace ops

Tensor rms_norm_back(const Tensor& x, const Tensor& dy, double eps) {
  return apply(ops::op_rms_norm_back, {x, dy}, ops::norm_attrs(eps));
}

}  // namespace nabla
