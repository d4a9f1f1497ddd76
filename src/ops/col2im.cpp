// col2im: the adjoint of im2col. Each row of cols is a window; its entries are
// added back to the image positions they were read from (padding dropped).
// cols [N, L, C*KH*KW], L = OH*OW -> image [N, C, H, W] (see ops/conv.h and
// im2col.cpp for the column layout).
//
// The backward is im2col. Overlapping windows make this a scatter-add: each
// (n, c) plane is summed by one task, windows in row-major order, so results
// do not depend on the thread count.
#include "backend/cpu/kernel.h"
#include "backend/cpu/thread_pool.h"
#include "ops/conv.h"

namespace nabla {
namespace ops {
namespace {

// attrs.ints = {C, H, W, window (8)}
Window2d col2im_window(const Attrs& attrs) { return Window2d::read(attrs.ints, 3); }

Meta col2im_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& cols = in[0];
  require_floating("col2im", cols, "cols");
  int64_t C = attrs.ints[0], H = attrs.ints[1], W = attrs.ints[2];
  if (C < 1 || H < 1 || W < 1) {
    throw ShapeError("col2im: channels and image size must be positive, got C " +
                     std::to_string(C) + ", " + std::to_string(H) + "x" + std::to_string(W));
  }
  Window2d v = col2im_window(attrs);
  check_window("col2im", v, H, W);
  int64_t L = v.out_h(H) * v.out_w(W), row = C * v.kh * v.kw;
  if (cols.rank() != 3 || cols.dim(1) != L || cols.dim(2) != row) {
    throw ShapeError("col2im: cols must be [N, " + std::to_string(L) + ", " + std::to_string(row) +
                     "] for C " + std::to_string(C) + " and a " + std::to_string(H) + "x" +
                     std::to_string(W) + " image, got " + to_string(cols.shape()));
  }
  return {cols.dtype(), {cols.dim(0), C, H, W}};
}

template <class T>
void col2im_kernel(const KernelArgs& a) {
  const TensorView& cols = a.in[0];
  Window2d v = col2im_window(*a.attrs);
  int64_t C = a.out.shape[1], H = a.out.shape[2], W = a.out.shape[3];
  int64_t OH = v.out_h(H), OW = v.out_w(W), KK = v.kh * v.kw;
  const Strides& cs = cols.strides;
  const T* cp = cols.ptr<T>();
  T* out = a.out.ptr<T>();
  int64_t plane_work = OH * OW * KK;
  auto task = [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      int64_t n = p / C, c = p % C;
      T* plane = out + p * H * W;
      std::fill(plane, plane + H * W, T(0));
      // Column (c, ki, kj) of every window row of image n.
      const T* src = cp + n * cs[0] + c * KK * cs[2];
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          const T* win = src + (oh * OW + ow) * cs[1];
          for (int64_t ki = 0; ki < v.kh; ++ki) {
            int64_t ih = oh * v.sh - v.ph + ki * v.dh;
            if (ih < 0 || ih >= H) continue;
            for (int64_t kj = 0; kj < v.kw; ++kj) {
              int64_t iw = ow * v.sw - v.pw + kj * v.dw;
              if (iw >= 0 && iw < W) plane[ih * W + iw] += win[(ki * v.kw + kj) * cs[2]];
            }
          }
        }
      }
    }
  };
  a.parallel_for(a.out.shape[0] * C, cpu::grain_for(plane_work),
                 task);
}

void col2im_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "col2im", [&]<class T>() { col2im_kernel<T>(a); });
}

// col2im is linear; its adjoint gathers the windows again.
Grads col2im_backward(const BackwardArgs& g) {
  Window2d v = col2im_window(g.attrs);
  return {im2col(g.dout, {v.kh, v.kw}, {v.sh, v.sw}, {v.ph, v.pw}, {v.dh, v.dw})};
}

std::vector<GradCase> col2im_cases() {
  // cols shapes follow im2col's: [N, OH*OW, C*KH*KW].
  std::vector<GradCase> cases = {
      // 4x5 image, kernel 2x3: OH 3, OW 3.
      {"kernel_2x3",
       {normal({2, 9, 18})},
       [](const std::vector<Tensor>& x) {
         return col2im(x[0], 3, {4, 5}, {2, 3});
       }},
      // 6x5 image, kernel 3x2, stride 2x1, padding 1x2, dilation 2x1: OH 2, OW 8.
      {"stride_pad_dilation",
       {normal({1, 16, 12})},
       [](const std::vector<Tensor>& x) {
         return col2im(x[0], 2, {6, 5}, {3, 2}, {2, 1}, {1, 2}, {2, 1});
       }},
      // Stride larger than the kernel: some pixels receive nothing.
      {"gaps",
       {normal({2, 4, 4})},
       [](const std::vector<Tensor>& x) {
         return col2im(x[0], 1, {5, 5}, {2, 2}, {3, 3});
       }},
  };
  for (GradCase& c : conv_transpose_2d_cases()) cases.push_back(std::move(c));
  return cases;
}

}  // namespace

extern const OpDef op_col2im{
    .name = "col2im",
    .summary = "adjoint of im2col: adds rows of cols [N, OH*OW, C*KH*KW] back into [N, C, H, W]",
    .inputs = {{"cols", Diff::yes}},
    .infer = col2im_infer,
    .backward = col2im_backward,
    .cases = col2im_cases,
};
NABLA_CPU_KERNEL(op_col2im, col2im_forward);

}  // namespace ops

Tensor col2im(const Tensor& cols, int64_t channels, Size2d image, Size2d kernel, Size2d stride,
              Size2d padding, Size2d dilation) {
  Attrs attrs{{channels, image.h, image.w}, {}};
  ops::Window2d::make(kernel, stride, padding, dilation).append_to(attrs.ints);
  return apply(ops::op_col2im, {cols}, attrs);
}

}  // namespace nabla
