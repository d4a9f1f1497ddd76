// im2col: every sliding window of an image, one row per window position.
// x [N, C, H, W] -> cols [N, L, C*KH*KW], L = OH*OW (see ops/conv.h).
//
// Layout: cols[n, oh*OW + ow, (c*KH + ki)*KW + kj] = x[n, c, oh*SH - PH + ki*DH,
// ow*SW - PW + kj*DW], 0 in the padding. A row's column index runs over
// (c, ki, kj) exactly as a weight [O, C, KH, KW] flattens to [O, C*KH*KW], so a
// convolution is the plain matmul w[O, C*KH*KW] x cols^T, and a group's
// channels are one contiguous column range.
//
// The backward is col2im (the adjoint: scatter-add of the windows).
#include <algorithm>

#include "backend/cpu/kernel.h"
#include "backend/cpu/thread_pool.h"
#include "ops/conv.h"

namespace nabla {
namespace ops {

void check_window(const char* op, const Window2d& v, int64_t h, int64_t w) {
  auto pair = [](int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); };
  if (v.kh < 1 || v.kw < 1) {
    throw ShapeError(std::string(op) + ": kernel must be positive, got " + pair(v.kh, v.kw));
  }
  if (v.sh < 1 || v.sw < 1) {
    throw ShapeError(std::string(op) + ": stride must be positive, got " + pair(v.sh, v.sw));
  }
  if (v.dh < 1 || v.dw < 1) {
    throw ShapeError(std::string(op) + ": dilation must be positive, got " + pair(v.dh, v.dw));
  }
  if (v.ph < 0 || v.pw < 0) {
    throw ShapeError(std::string(op) + ": padding must be non-negative, got " + pair(v.ph, v.pw));
  }
  if (v.out_h(h) < 1 || v.out_w(w) < 1) {
    throw ShapeError(std::string(op) + ": kernel " + pair(v.kh, v.kw) + " (dilation " +
                     pair(v.dh, v.dw) + ") does not fit the " + pair(h, w) + " image padded by " +
                     pair(v.ph, v.pw));
  }
}

void check_pool_window(const char* op, const Window2d& v, int64_t h, int64_t w) {
  check_window(op, v, h, w);
  // Padding alone would still make windows, with nothing to pool.
  if (h < 1 || w < 1) {
    throw ShapeError(std::string(op) + ": the image must not be empty, got " + std::to_string(h) + "x" +
                     std::to_string(w));
  }
  if (2 * v.ph > v.kh || 2 * v.pw > v.kw) {
    throw ShapeError(std::string(op) + ": padding must be at most half the kernel, got padding " +
                     std::to_string(v.ph) + "x" + std::to_string(v.pw) + " for kernel " +
                     std::to_string(v.kh) + "x" + std::to_string(v.kw));
  }
}

void require_nchw(const char* op, const Tensor& x, const char* what) {
  if (x.rank() != 4) {
    throw ShapeError(std::string(op) + ": " + what + " must be [N, C, H, W], got " +
                     to_string(x.shape()));
  }
}

namespace {

// attrs.ints = {window (8)}
Meta im2col_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  require_floating("im2col", x, "x");
  require_nchw("im2col", x, "x");
  Window2d v = Window2d::read(attrs.ints);
  int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  check_window("im2col", v, H, W);
  return {x.dtype(), {N, v.out_h(H) * v.out_w(W), C * v.kh * v.kw}};
}

template <class T>
void im2col_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  Window2d v = Window2d::read(a.attrs->ints);
  int64_t C = x.shape[1], H = x.shape[2], W = x.shape[3];
  int64_t OW = v.out_w(W), L = a.out.shape[1], row = a.out.shape[2];
  const Strides& xs = x.strides;
  const T* xp = x.ptr<T>();
  T* out = a.out.ptr<T>();
  // One task per output row (n, l): each element is written exactly once.
  auto task = [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t n = r / L, oh = (r % L) / OW, ow = (r % L) % OW;
      T* o = out + r * row;
      for (int64_t c = 0; c < C; ++c) {
        const T* plane = xp + n * xs[0] + c * xs[1];
        for (int64_t ki = 0; ki < v.kh; ++ki) {
          int64_t ih = oh * v.sh - v.ph + ki * v.dh;
          bool row_in = ih >= 0 && ih < H;
          const int64_t iw0 = ow * v.sw - v.pw;
          if (row_in && v.dw == 1 && xs[3] == 1 && iw0 >= 0 && iw0 + v.kw <= W) {
            // The window's row lies inside the image and is contiguous (a
            // patch embedding's every row): a plain copy.
            o = std::copy_n(plane + ih * xs[2] + iw0, v.kw, o);
            continue;
          }
          for (int64_t kj = 0; kj < v.kw; ++kj) {
            int64_t iw = ow * v.sw - v.pw + kj * v.dw;
            *o++ = row_in && iw >= 0 && iw < W ? plane[ih * xs[2] + iw * xs[3]] : T(0);
          }
        }
      }
    }
  };
  a.parallel_for(a.out.shape[0] * L, cpu::grain_for(row), task);
}

void im2col_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "im2col", [&]<class T>() { im2col_kernel<T>(a); });
}

// The adjoint of gathering windows is adding each window back where it came from.
Grads im2col_backward(const BackwardArgs& g) {
  const Shape& xs = g.inputs[0].shape();
  Window2d v = Window2d::read(g.attrs.ints);
  return {col2im(g.dout, xs[1], {xs[2], xs[3]}, {v.kh, v.kw}, {v.sh, v.sw}, {v.ph, v.pw},
                 {v.dh, v.dw})};
}

std::vector<GradCase> im2col_cases() {
  std::vector<GradCase> cases = {
      {"kernel_2x3",
       {normal({2, 3, 4, 5})},
       [](const std::vector<Tensor>& x) {
         return im2col(x[0], {2, 3});
       }},
      // Overlapping windows with padding, stride and dilation differing per axis.
      {"stride_pad_dilation",
       {normal({1, 2, 6, 5})},
       [](const std::vector<Tensor>& x) {
         return im2col(x[0], {3, 2}, {2, 1}, {1, 2}, {2, 1});
       }},
      {"non_overlapping",
       {normal({2, 2, 4, 6})},
       [](const std::vector<Tensor>& x) {
         return im2col(x[0], {2, 3}, {2, 3});
       }},
  };
  for (GradCase& c : conv_2d_cases()) cases.push_back(std::move(c));
  return cases;
}

}  // namespace

extern const OpDef op_im2col{
    .name = "im2col",
    .summary = "sliding windows of x [N, C, H, W] as rows: [N, OH*OW, C*KH*KW], zero padding",
    .inputs = {{"x", Diff::yes}},
    .infer = im2col_infer,
    .backward = im2col_backward,
    .cases = im2col_cases,
};
NABLA_CPU_KERNEL(op_im2col, im2col_forward);

}  // namespace ops

Tensor im2col(const Tensor& x, Size2d kernel, Size2d stride, Size2d padding, Size2d dilation) {
  Attrs attrs;
  ops::Window2d::make(kernel, stride, padding, dilation).append_to(attrs.ints);
  return apply(ops::op_im2col, {x}, attrs);
}

}  // namespace nabla
