// The sliding-window ops (legend and attrs in src/ops/conv.h) and rope on
// the GPU, one thread per output element. The adjoints (col2im, the pools'
// backwards) gather: each image pixel's thread sums the windows that read
// it, in row-major window order, so no two threads add to one element.
#include "backend/cuda/kernel.h"
#include "ops/conv.h"

namespace nabla {
namespace ops {
extern const OpDef op_avg_pool_2d, op_avg_pool_2d_back, op_col2im, op_im2col, op_max_pool_2d, op_max_pool_2d_back,
    op_rope;
}  // namespace ops

namespace NABLA_GPU {
namespace {

using ops::Window2d;

// The window positions o along one axis (out of `outs`) whose element k
// reads image position x: o*s - p + k*d == x, k in [0, kernel). The first
// and last o that can.
__device__ __forceinline__ int64_t first_reader(int64_t x, int64_t k, int64_t s, int64_t p, int64_t d) {
  const int64_t num = x + p - (k - 1) * d;  // o*s >= num
  const int64_t o = num <= 0 ? 0 : (num + s - 1) / s;
  return o;
}
__device__ __forceinline__ int64_t last_reader(int64_t x, int64_t s, int64_t p, int64_t outs) {
  const int64_t num = x + p;  // o*s <= num
  if (num < 0) return -1;
  const int64_t o = num / s;
  return o < outs - 1 ? o : outs - 1;
}

// Calls fn(oh, ow, ki, kj) for each window element that reads pixel (h, w),
// windows in row-major order.
template <class F>
__device__ __forceinline__ void for_each_reader(const Window2d& v, int64_t OH, int64_t OW, int64_t h, int64_t w, F fn) {
  const int64_t oh_end = last_reader(h, v.sh, v.ph, OH), ow_end = last_reader(w, v.sw, v.pw, OW);
  for (int64_t oh = first_reader(h, v.kh, v.sh, v.ph, v.dh); oh <= oh_end; ++oh) {
    const int64_t dh = h - (oh * v.sh - v.ph);
    if (dh < 0 || dh >= v.kh * v.dh || dh % v.dh != 0) continue;
    for (int64_t ow = first_reader(w, v.kw, v.sw, v.pw, v.dw); ow <= ow_end; ++ow) {
      const int64_t dw = w - (ow * v.sw - v.pw);
      if (dw < 0 || dw >= v.kw * v.dw || dw % v.dw != 0) continue;
      fn(oh, ow, dh / v.dh, dw / v.dw);
    }
  }
}

__device__ __forceinline__ int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  const int64_t room = in + 2 * p - d * (k - 1) - 1;
  return room < 0 ? 0 : room / s + 1;
}

// x [N, C, H, W] -> [N, OH*OW, C*KH*KW].
template <class T>
__global__ void im2col_kernel(int64_t n, View x, Window2d v, int64_t L, int64_t OW, int64_t CK, T* out) {
  NABLA_GRID_STRIDE(i, n) {
    const int64_t col = i % CK, l = i / CK % L, b = i / (CK * L);
    const int64_t oh = l / OW, ow = l % OW;
    const int64_t c = col / (v.kh * v.kw), ki = col / v.kw % v.kh, kj = col % v.kw;
    const int64_t h = oh * v.sh - v.ph + ki * v.dh, w = ow * v.sw - v.pw + kj * v.dw;
    const bool inside = h >= 0 && h < x.shape[2] && w >= 0 && w < x.shape[3];
    out[i] = inside ? static_cast<const T*>(x.data)[b * x.strides[0] + c * x.strides[1] + h * x.strides[2] +
                                                   w * x.strides[3]]
                    : T(0);
  }
}

void im2col(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  const Window2d v = Window2d::read(a.attrs->ints);
  const int64_t OW = v.out_w(a.in[0].shape[3]);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), im2col_kernel<T>, n, make_view(a.in[0]), v, a.out.shape[1], OW, a.out.shape[2],
           a.out.ptr<T>());
  });
}

// cols [N, OH*OW, C*KH*KW] -> [N, C, H, W].
template <class T>
__global__ void col2im_kernel(int64_t n, View cols, Window2d v, int64_t C, int64_t H, int64_t W, T* out) {
  const int64_t OH = out_size(H, v.kh, v.sh, v.ph, v.dh), OW = out_size(W, v.kw, v.sw, v.pw, v.dw);
  NABLA_GRID_STRIDE(i, n) {
    const int64_t w = i % W, h = i / W % H, c = i / (W * H) % C, b = i / (W * H * C);
    const T* p = static_cast<const T*>(cols.data);
    T acc = T(0);
    for_each_reader(v, OH, OW, h, w, [&](int64_t oh, int64_t ow, int64_t ki, int64_t kj) {
      acc += p[b * cols.strides[0] + (oh * OW + ow) * cols.strides[1] + ((c * v.kh + ki) * v.kw + kj) * cols.strides[2]];
    });
    out[i] = acc;
  }
}

void col2im(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  const Window2d v = Window2d::read(a.attrs->ints, 3);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), col2im_kernel<T>, n, make_view(a.in[0]), v, a.out.shape[1], a.out.shape[2],
           a.out.shape[3], a.out.ptr<T>());
  });
}

// x [N, C, H, W] -> [N, C, OH, OW]: the window's sum / (KH*KW).
template <class T>
__global__ void avg_pool_kernel(int64_t n, View x, Window2d v, int64_t OH, int64_t OW, T* out) {
  NABLA_GRID_STRIDE(i, n) {
    const int64_t ow = i % OW, oh = i / OW % OH, c = i / (OW * OH) % x.shape[1], b = i / (OW * OH * x.shape[1]);
    const T* p = static_cast<const T*>(x.data) + b * x.strides[0] + c * x.strides[1];
    T acc = T(0);
    for (int64_t ki = 0; ki < v.kh; ++ki) {
      for (int64_t kj = 0; kj < v.kw; ++kj) {
        const int64_t h = oh * v.sh - v.ph + ki * v.dh, w = ow * v.sw - v.pw + kj * v.dw;
        if (h >= 0 && h < x.shape[2] && w >= 0 && w < x.shape[3]) acc += p[h * x.strides[2] + w * x.strides[3]];
      }
    }
    out[i] = acc / T(v.kh * v.kw);
  }
}

void avg_pool(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  const Window2d v = Window2d::read(a.attrs->ints);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), avg_pool_kernel<T>, n, make_view(a.in[0]), v, a.out.shape[2], a.out.shape[3],
           a.out.ptr<T>());
  });
}

// dy [N, C, OH, OW] -> [N, C, H, W]: each pixel gathers dy / (KH*KW) of
// the windows holding it; attrs.ints = {H, W, window}.
template <class T>
__global__ void avg_pool_back_kernel(int64_t n, View dy, Window2d v, int64_t C, int64_t H, int64_t W, T* out) {
  const int64_t OH = dy.shape[2], OW = dy.shape[3];
  NABLA_GRID_STRIDE(i, n) {
    const int64_t w = i % W, h = i / W % H, c = i / (W * H) % C, b = i / (W * H * C);
    const T* p = static_cast<const T*>(dy.data) + b * dy.strides[0] + c * dy.strides[1];
    T acc = T(0);
    for_each_reader(v, OH, OW, h, w, [&](int64_t oh, int64_t ow, int64_t, int64_t) {
      acc += p[oh * dy.strides[2] + ow * dy.strides[3]] / T(v.kh * v.kw);
    });
    out[i] = acc;
  }
}

void avg_pool_back(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  const Window2d v = Window2d::read(a.attrs->ints, 2);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), avg_pool_back_kernel<T>, n, make_view(a.in[0]), v, a.out.shape[1],
           a.out.shape[2], a.out.shape[3], a.out.ptr<T>());
  });
}

// The image position h*W + w that wins window (oh, ow) of plane p (strides
// rs, cs): the first strictly larger value in row-major window order, a NaN
// always winning; padding never wins, and the first image pixel stands if
// none beats -inf.
template <class T>
__device__ int64_t pool_argmax(const T* p, int64_t rs, int64_t cs, int64_t H, int64_t W, const Window2d& v,
                                int64_t oh, int64_t ow) {
  int64_t best = -1;
  T best_value = -T(INFINITY);
  for (int64_t ki = 0; ki < v.kh; ++ki) {
    for (int64_t kj = 0; kj < v.kw; ++kj) {
      const int64_t h = oh * v.sh - v.ph + ki * v.dh, w = ow * v.sw - v.pw + kj * v.dw;
      if (h < 0 || h >= H || w < 0 || w >= W) continue;
      if (best < 0) best = h * W + w;
      const T value = p[h * rs + w * cs];
      if (value > best_value || gpu_math::isnan(double(value))) {
        best = h * W + w;
        best_value = value;
      }
    }
  }
  return best;
}

// max_pool_2d(x, values) -> [N, C, OH, OW]: values at x's window argmax.
template <class T>
__global__ void max_pool_kernel(int64_t n, View x, View values, Window2d v, int64_t OH, int64_t OW, T* out) {
  const int64_t C = x.shape[1], H = x.shape[2], W = x.shape[3];
  NABLA_GRID_STRIDE(i, n) {
    const int64_t ow = i % OW, oh = i / OW % OH, c = i / (OW * OH) % C, b = i / (OW * OH * C);
    const T* p = static_cast<const T*>(x.data) + b * x.strides[0] + c * x.strides[1];
    const int64_t at = pool_argmax(p, x.strides[2], x.strides[3], H, W, v, oh, ow);
    out[i] = static_cast<const T*>(values.data)[b * values.strides[0] + c * values.strides[1] +
                                                 (at / W) * values.strides[2] + (at % W) * values.strides[3]];
  }
}

void max_pool(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  const Window2d v = Window2d::read(a.attrs->ints);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), max_pool_kernel<T>, n, make_view(a.in[0]), make_view(a.in[1]), v,
           a.out.shape[2], a.out.shape[3], a.out.ptr<T>());
  });
}

// max_pool_2d_back(x, dy) -> [N, C, H, W]: each pixel gathers the dy of the
// windows whose argmax it is.
template <class T>
__global__ void max_pool_back_kernel(int64_t n, View x, View dy, Window2d v, T* out) {
  const int64_t C = x.shape[1], H = x.shape[2], W = x.shape[3], OH = dy.shape[2], OW = dy.shape[3];
  NABLA_GRID_STRIDE(i, n) {
    const int64_t w = i % W, h = i / W % H, c = i / (W * H) % C, b = i / (W * H * C);
    const T* p = static_cast<const T*>(x.data) + b * x.strides[0] + c * x.strides[1];
    const T* g = static_cast<const T*>(dy.data) + b * dy.strides[0] + c * dy.strides[1];
    T acc = T(0);
    for_each_reader(v, OH, OW, h, w, [&](int64_t oh, int64_t ow, int64_t, int64_t) {
      if (pool_argmax(p, x.strides[2], x.strides[3], H, W, v, oh, ow) == h * W + w) {
        acc += g[oh * dy.strides[2] + ow * dy.strides[3]];
      }
    });
    out[i] = acc;
  }
}

void max_pool_back(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  const Window2d v = Window2d::read(a.attrs->ints);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), max_pool_back_kernel<T>, n, make_view(a.in[0]), make_view(a.in[1]), v,
           a.out.ptr<T>());
  });
}

// rope(x [..., T, D], positions [T]); attrs.ints = {mode, inverse, R},
// reals = {base, m, factor_0, ...}: the first R elements of a row rotate
// (the rest are copied), pair i at position pos turning by pos *
// base^(-2i/R) / factor_i, scaled by m; neox pairs (i, i + R/2), original
// (2i, 2i + 1).
constexpr int kMaxRopeFactors = 256;
struct RopeParams {
  bool neox;
  int64_t rotated;
  double sign, base, m;
  int factors;
  double factor[kMaxRopeFactors];
};

template <class T>
__global__ void rope_kernel(int64_t n, View x, View positions, View out_shape, RopeParams rp, T* out) {
  const int r = out_shape.rank;
  const int64_t D = out_shape.shape[r - 1], Tn = out_shape.shape[r - 2], half = rp.rotated / 2;
  NABLA_GRID_STRIDE(i, n) {
    const int64_t j = i % D, t = i / D % Tn;
    const int64_t at = offset_of(x, i);
    if (j >= rp.rotated) {
      out[i] = static_cast<const T*>(x.data)[at];
      continue;
    }
    const int64_t pair = rp.neox ? j % half : j / 2;
    const bool first = rp.neox ? j < half : j % 2 == 0;
    const int64_t partner = rp.neox ? (first ? j + half : j - half) : (first ? j + 1 : j - 1);
    const double factor = rp.factors > 0 ? rp.factor[pair] : 1.0;
    const double pos = load<double>(positions, t * positions.strides[0]);
    const double theta = pos * gpu_math::pow(rp.base, -2.0 * double(pair) / double(rp.rotated)) / factor;
    const double cs = rp.m * gpu_math::cos(theta), sn = rp.m * rp.sign * gpu_math::sin(theta);
    const int64_t partner_at = at + (partner - j) * x.strides[r - 1];
    const double self = double(static_cast<const T*>(x.data)[at]), other = double(static_cast<const T*>(x.data)[partner_at]);
    out[i] = T(first ? self * cs - other * sn : other * sn + self * cs);
  }
}

void rope(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  RopeParams rp{};
  rp.neox = a.attrs->ints[0] == int64_t(RopeMode::neox);
  rp.sign = a.attrs->ints[1] ? -1.0 : 1.0;
  rp.rotated = a.attrs->ints[2];
  rp.base = a.attrs->reals[0];
  rp.m = a.attrs->reals[1];
  rp.factors = int(a.attrs->reals.size()) - 2;
  if (rp.factors > kMaxRopeFactors) {
    throw ShapeError("rope: the cuda kernel takes at most " + std::to_string(kMaxRopeFactors) + " frequency factors");
  }
  for (int k = 0; k < rp.factors; ++k) rp.factor[k] = a.attrs->reals[size_t(k) + 2];
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), rope_kernel<T>, n, make_view(a.in[0]), make_view(a.in[1]), make_view(a.out),
           rp, a.out.ptr<T>());
  });
}

}  // namespace

void register_image_kernels() {
  register_kernel(ops::op_im2col, im2col);
  register_kernel(ops::op_col2im, col2im);
  register_kernel(ops::op_avg_pool_2d, avg_pool);
  register_kernel(ops::op_avg_pool_2d_back, avg_pool_back);
  register_kernel(ops::op_max_pool_2d, max_pool);
  register_kernel(ops::op_max_pool_2d_back, max_pool_back);
  register_kernel(ops::op_rope, rope);
}

}  // namespace NABLA_GPU
}  // namespace nabla
