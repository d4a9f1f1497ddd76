// avg_pool_2d_back: the backward of avg_pool_2d, dx = sum over the windows
// holding each pixel of dy / (KH*KW). Linear in dy; its own backward is
// avg_pool_2d. Legend in ops/conv.h.
//   dy [N, C, OH, OW] -> dx [N, C, H, W]
//
// Windows overlap when the stride is below the kernel, so this is a
// scatter-add: each (n, c) plane is summed by one task in window order, so
// results do not depend on the thread count.
#include "backend/cpu/kernel.h"
#include "backend/cpu/thread_pool.h"
#include "ops/conv.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

// attrs.ints = {H, W, window (8), dilation 1}
Window2d avg_back_window(const Attrs& attrs) { return Window2d::read(attrs.ints, 2); }

Meta avg_pool_2d_back_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& dy = in[0];
  require_floating("avg_pool_2d_back", dy, "dy");
  require_nchw("avg_pool_2d_back", dy, "dy");
  int64_t H = attrs.ints[0], W = attrs.ints[1];
  Window2d v = avg_back_window(attrs);
  check_pool_window("avg_pool_2d_back", v, H, W);
  if (dy.dim(2) != v.out_h(H) || dy.dim(3) != v.out_w(W)) {
    throw ShapeError("avg_pool_2d_back: dy must be [N, C, " + std::to_string(v.out_h(H)) + ", " +
                     std::to_string(v.out_w(W)) + "] for a " + std::to_string(H) + "x" +
                     std::to_string(W) + " image, got " + to_string(dy.shape()));
  }
  return {dy.dtype(), {dy.dim(0), dy.dim(1), H, W}};
}

template <class T>
void avg_pool_2d_back_kernel(const KernelArgs& a) {
  const TensorView& dy = a.in[0];
  Window2d v = avg_back_window(*a.attrs);
  int64_t C = a.out.shape[1], H = a.out.shape[2], W = a.out.shape[3];
  int64_t OH = dy.shape[2], OW = dy.shape[3];
  const Strides& ds = dy.strides;
  const T* dp = dy.ptr<T>();
  T* out = a.out.ptr<T>();
  T count = T(v.kh * v.kw);
  auto task = [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      T* plane = out + p * H * W;
      std::fill(plane, plane + H * W, T(0));
      const T* dplane = dp + (p / C) * ds[0] + (p % C) * ds[1];
      for (int64_t oh = 0; oh < OH; ++oh) {
        int64_t h0 = oh * v.sh - v.ph;
        for (int64_t ow = 0; ow < OW; ++ow) {
          int64_t w0 = ow * v.sw - v.pw;
          T share = dplane[oh * ds[2] + ow * ds[3]] / count;
          for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + v.kh, H); ++ih) {
            for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + v.kw, W); ++iw) {
              plane[ih * W + iw] += share;
            }
          }
        }
      }
    }
  };
  a.parallel_for(a.out.shape[0] * C,
                 cpu::grain_for(OH * OW * v.kh * v.kw), task);
}

void avg_pool_2d_back_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "avg_pool_2d_back",
                    [&]<class T>() { avg_pool_2d_back_kernel<T>(a); });
}

// Linear in dy, and the transpose of avg_pool_2d.
Grads avg_pool_2d_back_backward(const BackwardArgs& g) {
  Window2d v = avg_back_window(g.attrs);
  return {avg_pool_2d(g.dout, {v.kh, v.kw}, {v.sh, v.sw}, {v.ph, v.pw})};
}

std::vector<GradCase> avg_pool_2d_back_cases() {
  using X = const std::vector<Tensor>&;
  return {
      // 4x6 image, kernel 2, stride 2: dy 2x3.
      {"kernel_2x2",
       {normal({2, 3, 2, 3})},
       [](X t) {
         return avg_pool_2d_back(t[0], {4, 6}, 2, 2);
       }},
      // 5x4 image, kernel 3x2, stride 2x1, padding 1: dy 3x5.
      {"overlap_pad",
       {normal({2, 2, 3, 5})},
       [](X t) {
         return avg_pool_2d_back(t[0], {5, 4}, {3, 2}, {2, 1}, {1, 1});
       }},
  };
}

}  // namespace

extern const OpDef op_avg_pool_2d_back{
    .name = "avg_pool_2d_back",
    .summary =
        "backward of avg_pool_2d: dy [N, C, OH, OW] / (KH*KW) added over each window -> [N, C, H, "
        "W]",
    .inputs = {{"dy", Diff::yes}},
    .infer = avg_pool_2d_back_infer,
    .backward = avg_pool_2d_back_backward,
    .cases = avg_pool_2d_back_cases,
};
NABLA_CPU_KERNEL(op_avg_pool_2d_back, avg_pool_2d_back_forward);

}  // namespace ops

Tensor avg_pool_2d_back(const Tensor& dy, Size2d image, Size2d kernel, Size2d stride,
                        Size2d padding) {
  Attrs attrs{{image.h, image.w}, {}};
  ops::Window2d::make(kernel, stride, padding, 1).append_to(attrs.ints);
  return apply(ops::op_avg_pool_2d_back, {dy}, attrs);
}

}  // namespace nabla
