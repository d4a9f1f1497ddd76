// layer_norm_back: the gradient of layer_norm(x, eps) with respect to x.
//
//   x, dy, dx [..., C]   xhat = (x - mean) * rstd,  rstd = 1 / sqrt(var + eps)
//   dx = rstd * (dy - mean(dy) - xhat * mean(dy * xhat))      (means over C)
//
// It has no backward rule of its own: it differentiates through its
// composite, which gives layer_norm second derivatives.
#include <cmath>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernel.h"
#include "backend/cpu/simd.h"
#include "nabla/graph.h"
#include "ops/internal_ops.h"
#include "ops/norm.h"

namespace nabla {
namespace ops {
namespace {

// f32 rows a block at a time on cpu::VecF: the statistics and the other
// sums (backward_means_f32), then the output in f32 lanes.
void layer_norm_back_f32(const KernelArgs& a) {
  using cpu::VecF;
  const TensorView &x = a.in[0], &dy = a.in[1];
  float* out = a.out.ptr<float>();
  const int64_t cols = a.out.shape.back(), sx = x.strides.back(), sd = dy.strides.back();
  const double eps = norm_eps(*a.attrs);
  for_each_row_block<2>(a, [&](const RowBlock<2>& b) {
    std::array<const float*, kRowBlock> xr{}, dr{};
    std::array<RowStats<float>, kRowBlock> st;
    std::array<float, kRowBlock> mean_dy, mean_dy_xhat;
    for (int i = 0; i < b.n; ++i) {
      xr[i] = cpu::gather(x.ptr<float>() + b.offset[0][i], sx, cols, cpu::gather_buffer(i));
      dr[i] = cpu::gather(dy.ptr<float>() + b.offset[1][i], sd, cols, cpu::gather_buffer(kRowBlock + i));
    }
    backward_means_f32<false>(xr.data(), dr.data(), nullptr, b.n, cols, eps, st.data(), mean_dy.data(),
                              mean_dy_xhat.data());
    for (int i = 0; i < b.n; ++i) {
      const float mean = st[i].mean, rstd = st[i].rstd;
      cpu::map(out + (b.row0 + i) * cols, xr[i], 1, dr[i], 1, cols, [&](VecF xv, VecF g) {
        const VecF xhat = (xv - mean) * rstd;
        return rstd * (g - mean_dy[i] - xhat * mean_dy_xhat[i]);
      });
    }
  });
}

// One row per work item (f32 rows go to layer_norm_back_f32), statistics in
// double. x and dy may have any strides (dy is often a transposed or
// broadcast gradient).
template <class T>
void layer_norm_back_kernel(const KernelArgs& a) {
  if constexpr (std::is_same_v<T, float>) return layer_norm_back_f32(a);
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
    double mean = 0;
    for (int64_t j = 0; j < cols; ++j) mean += double(xr[j * sx]);
    mean /= n;
    double var = 0;
    for (int64_t j = 0; j < cols; ++j) {
      double d = double(xr[j * sx]) - mean;
      var += d * d;
    }
    double rstd = 1.0 / std::sqrt(var / n + eps);
    double mean_dy = 0, mean_dy_xhat = 0;
    for (int64_t j = 0; j < cols; ++j) {
      double g = double(dr[j * sd]);
      mean_dy += g;
      mean_dy_xhat += g * (double(xr[j * sx]) - mean) * rstd;
    }
    mean_dy /= n;
    mean_dy_xhat /= n;
    for (int64_t j = 0; j < cols; ++j) {
      double xhat = (double(xr[j * sx]) - mean) * rstd;
      dxr[j] = static_cast<T>(rstd * (double(dr[j * sd]) - mean_dy - xhat * mean_dy_xhat));
    }
  });
}

void layer_norm_back_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "layer_norm_back",
                    [&]<class T>() { layer_norm_back_kernel<T>(a); });
}

Tensor layer_norm_back_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &dy = in[1];
  Tensor xc = x - mean(x, {-1}, true);
  Tensor rstd = rsqrt(mean(square(xc), {-1}, true) + norm_eps(attrs));
  Tensor xhat = xc * rstd;
  return rstd * (dy - mean(dy, {-1}, true) - xhat * mean(dy * xhat, {-1}, true));
}

std::vector<GradCase> layer_norm_back_cases() {
  using V = std::vector<Tensor>;
  return {
      {"matrix",
       {normal({3, 5}), normal({3, 5})},
       [](const V& x) { return layer_norm_back(x[0], x[1], 1e-5); }},
      {"rank3",
       {normal({2, 3, 4}), normal({2, 3, 4})},
       [](const V& x) { return layer_norm_back(x[0], x[1], 1e-5); }},
      {"large_eps",
       {normal({4, 6}), normal({4, 6})},
       [](const V& x) { return layer_norm_back(x[0], x[1], 0.5); }},
      // Second order: d/dx of <v, d layer_norm(x) / dx>, through this op.
      {"second_order",
       {normal({3, 5})},
       [](const V& x) {
         Tensor y = layer_norm(x[0], 1e-5);
         return grad(sum(y * y * y), {x[0]})[0];
       }},
  };
}

}  // namespace

extern const OpDef op_layer_norm_back{
    .name = "layer_norm_back",
    .summary = "the gradient of layer_norm: rstd (dy - mean(dy) - xhat mean(dy xhat)); fused",
    .inputs = {{"x", Diff::yes}, {"dy", Diff::yes}},
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs& at) { return infer_norm("layer_norm_back", in, at); },
    .composite = layer_norm_back_composite,
    .cases = layer_norm_back_cases,
};
NABLA_CPU_KERNEL(op_layer_norm_back, layer_norm_back_forward);

}  // namespace ops

Tensor layer_norm_back(const Tensor& x, const Tensor& dy, double eps) {
  return apply(ops::op_layer_norm_back, {x, dy}, ops::norm_attrs(eps));
}

}  // namespace nabla
