// avg_pool_2d: the mean of each window, padding counted as zeros in the divisor
// (PyTorch's count_include_pad=True, its default): every window divides by
// KH*KW. Legend in ops/conv.h.
//   x [N, C, H, W] -> y [N, C, OH, OW], OH = (H + 2*PH - KH) / SH + 1
//
// The backward is avg_pool_2d_back (dy / (KH*KW) spread over each window).
#include "backend/cpu/kernel.h"
#include "backend/cpu/thread_pool.h"
#include "ops/conv.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

// attrs.ints = {window (8), dilation 1}
Meta avg_pool_2d_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  require_floating("avg_pool_2d", x, "x");
  require_nchw("avg_pool_2d", x, "x");
  Window2d v = Window2d::read(attrs.ints);
  check_pool_window("avg_pool_2d", v, x.dim(2), x.dim(3));
  return {x.dtype(), {x.dim(0), x.dim(1), v.out_h(x.dim(2)), v.out_w(x.dim(3))}};
}

template <class T>
void avg_pool_2d_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  Window2d v = Window2d::read(a.attrs->ints);
  int64_t C = x.shape[1], H = x.shape[2], W = x.shape[3];
  int64_t OH = a.out.shape[2], OW = a.out.shape[3];
  const Strides& xs = x.strides;
  const T* xp = x.ptr<T>();
  T* out = a.out.ptr<T>();
  T count = T(v.kh * v.kw);
  // One task per output row (n, c, oh).
  auto task = [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t p = r / OH, oh = r % OH;
      const T* plane = xp + (p / C) * xs[0] + (p % C) * xs[1];
      int64_t h0 = oh * v.sh - v.ph;
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t w0 = ow * v.sw - v.pw;
        T acc = 0;
        for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + v.kh, H); ++ih) {
          for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + v.kw, W); ++iw) {
            acc += plane[ih * xs[2] + iw * xs[3]];
          }
        }
        out[r * OW + ow] = acc / count;
      }
    }
  };
  a.parallel_for(a.out.shape[0] * C * OH,
                 cpu::grain_for(OW * v.kh * v.kw), task);
}

void avg_pool_2d_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "avg_pool_2d", [&]<class T>() { avg_pool_2d_kernel<T>(a); });
}

Grads avg_pool_2d_backward(const BackwardArgs& g) {
  const Shape& xs = g.inputs[0].shape();
  Window2d v = Window2d::read(g.attrs.ints);
  return {avg_pool_2d_back(g.dout, {xs[2], xs[3]}, {v.kh, v.kw}, {v.sh, v.sw}, {v.ph, v.pw})};
}

std::vector<GradCase> avg_pool_2d_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"kernel_2x2", {normal({2, 3, 4, 6})}, [](X t) { return avg_pool_2d(t[0], 2, 2); }},
      // Overlapping 3x2 windows, padding included in the divisor.
      {"overlap_pad",
       {normal({2, 2, 5, 4})},
       [](X t) {
         return avg_pool_2d(t[0], {3, 2}, {2, 1}, {1, 1});
       }},
  };
}

}  // namespace

extern const OpDef op_avg_pool_2d{
    .name = "avg_pool_2d",
    .summary =
        "mean over KH x KW windows of x [N, C, H, W]; padding counts as zeros (count_include_pad)",
    .inputs = {{"x", Diff::yes}},
    .infer = avg_pool_2d_infer,
    .backward = avg_pool_2d_backward,
    .cases = avg_pool_2d_cases,
};
NABLA_CPU_KERNEL(op_avg_pool_2d, avg_pool_2d_forward);

}  // namespace ops

Tensor avg_pool_2d(const Tensor& x, Size2d kernel, Size2d stride, Size2d padding) {
  Attrs attrs;
  ops::Window2d::make(kernel, stride, padding, 1).append_to(attrs.ints);
  return apply(ops::op_avg_pool_2d, {x}, attrs);
}

}  // namespace nabla
