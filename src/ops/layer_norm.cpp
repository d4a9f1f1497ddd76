// layer_norm: normalisation over the last axis, no affine.
//
//   x, y [..., C]      y = (x - mean) * rstd,  rstd = 1 / sqrt(var + eps)
//
// var is the biased variance (divided by C), as in PyTorch. The affine form
// layer_norm(x, gamma, beta, eps) is built in layer_norm_affine.cpp.
#include <cmath>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernel.h"
#include "backend/cpu/simd.h"
#include "ops/internal_ops.h"
#include "ops/norm.h"

namespace nabla {
namespace ops {
namespace {

// f32 rows on cpu::VecF, statistics as row_stats_f32 computes them.
void layer_norm_f32(const KernelArgs& a) {
  float* out = a.out.ptr<float>();
  const int64_t cols = a.out.shape.back();
  for_each_row_stats_f32(a, norm_eps(*a.attrs), [&](int64_t row, const float* x, RowStats<float> st) {
    cpu::map(out + row * cols, x, 1, cols, [&](cpu::VecF v) { return (v - st.mean) * st.rstd; });
  });
}

// One row per work item (f32 rows go to layer_norm_f32), statistics in
// double: two passes, the mean, then the centred sum of squares.
template <class T>
void layer_norm_kernel(const KernelArgs& a) {
  if constexpr (std::is_same_v<T, float>) return layer_norm_f32(a);
  const TensorView& x = a.in[0];
  const T* xp = x.ptr<T>();
  T* out = a.out.ptr<T>();
  const int64_t cols = a.out.shape.back();
  const int64_t sx = x.strides.back();
  const double eps = norm_eps(*a.attrs);
  for_each_row<1>(a, [&](int64_t row, const std::array<int64_t, 1>& off) {
    const T* xr = xp + off[0];
    T* yr = out + row * cols;
    double mean = 0;
    for (int64_t j = 0; j < cols; ++j) mean += double(xr[j * sx]);
    mean /= double(cols);
    double var = 0;
    for (int64_t j = 0; j < cols; ++j) {
      double d = double(xr[j * sx]) - mean;
      var += d * d;
    }
    var /= double(cols);
    double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < cols; ++j) yr[j] = static_cast<T>((double(xr[j * sx]) - mean) * rstd);
  });
}

void layer_norm_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "layer_norm", [&]<class T>() { layer_norm_kernel<T>(a); });
}

Tensor layer_norm_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  Tensor xc = in[0] - mean(in[0], {-1}, true);
  Tensor var = mean(square(xc), {-1}, true);
  return xc * rsqrt(var + norm_eps(attrs));
}

// x, dy, dx [..., C]: dx = rstd (dy - mean(dy) - xhat mean(dy xhat)), a fused op of its own.
Grads layer_norm_backward(const BackwardArgs& g) {
  return {layer_norm_back(g.inputs[0], g.dout, norm_eps(g.attrs))};
}

std::vector<GradCase> layer_norm_cases() {
  using V = std::vector<Tensor>;
  return {
      {"matrix", {normal({3, 5})}, [](const V& x) { return layer_norm(x[0], 1e-5); }},
      {"rank3", {normal({2, 3, 4})}, [](const V& x) { return layer_norm(x[0], 1e-5); }},
      // Rows of 1: y is 0 and dx is 0 whatever x is.
      {"single_column", {normal({3, 1})}, [](const V& x) { return layer_norm(x[0], 1e-5); }},
      // A large eps so it visibly enters the gradient.
      {"large_eps", {normal({4, 6})}, [](const V& x) { return layer_norm(x[0], 0.5); }},
      // A large common offset: the two-pass variance must not cancel.
      {"offset_rows", {normal({3, 5})}, [](const V& x) { return layer_norm(x[0] + 100.0, 1e-5); }},
      {"affine",
       {normal({2, 3, 4}), normal({4}), normal({4})},
       [](const V& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }},
      {"affine_gamma_only",
       {normal({3, 5}), normal({5})},
       [](const V& x) { return layer_norm(x[0], x[1], Tensor(), 1e-5); }},
  };
}

}  // namespace

extern const OpDef op_layer_norm{
    .name = "layer_norm",
    .summary = "(x - mean) / sqrt(var + eps) over the last axis (biased var); fused",
    .inputs = {{"x", Diff::yes}},
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs& at) { return infer_norm("layer_norm", in, at); },
    .backward = layer_norm_backward,
    .composite = layer_norm_composite,
    .cases = layer_norm_cases,
};
NABLA_CPU_KERNEL(op_layer_norm, layer_norm_forward);

}  // namespace ops

Tensor layer_norm(const Tensor& x, double eps) {
  return apply(ops::op_layer_norm, {x}, ops::norm_attrs(eps));
}

}  // namespace nabla
