// Reference kernels of the sliding-window ops (legend and attrs layout in
// src/ops/conv.h) and rope. Windows are walked as written: window (oh, ow)
// element (ki, kj) is image position (oh*SH - PH + ki*DH, ow*SW - PW + kj*DW),
// outside the image the padding. Scatter-adds sum in double.
#include <cmath>
#include <limits>

#include "backend/reference/kernel.h"
#include "ops/conv.h"

namespace nabla {
namespace ops {
extern const OpDef op_avg_pool_2d, op_avg_pool_2d_back, op_col2im, op_im2col, op_max_pool_2d, op_max_pool_2d_back,
    op_rope;
}  // namespace ops

namespace reference {
namespace {

using ops::Window2d;

// The image position of window (oh, ow)'s element (ki, kj); `inside` whether
// it lies in the H x W image rather than the padding.
struct Pixel {
  int64_t h, w;
  bool inside;
};
Pixel pixel(const Window2d& v, int64_t H, int64_t W, int64_t oh, int64_t ow, int64_t ki, int64_t kj) {
  const int64_t h = oh * v.sh - v.ph + ki * v.dh, w = ow * v.sw - v.pw + kj * v.dw;
  return {h, w, h >= 0 && h < H && w >= 0 && w < W};
}

// Writes a double buffer holding the whole output.
void store(const TensorView& out, const std::vector<double>& acc) {
  for (size_t j = 0; j < acc.size(); ++j) set_at(out, int64_t(j), acc[j]);
}

// x [N, C, H, W] -> [N, OH*OW, C*KH*KW]; attrs.ints = {window}.
// cols[n, oh*OW + ow, (c*KH + ki)*KW + kj] = x[n, c, pixel], 0 in the padding.
void im2col_kernel(const Operands& a) {
  const TensorView& x = a.in[0];
  const Window2d v = Window2d::read(a.attrs->ints);
  const int64_t H = x.shape[2], W = x.shape[3], OW = v.out_w(W);
  for_each_index(a.out.shape, [&](const Index& o) {
    const int64_t n = o[0], oh = o[1] / OW, ow = o[1] % OW;
    const int64_t c = o[2] / (v.kh * v.kw), ki = o[2] / v.kw % v.kh, kj = o[2] % v.kw;
    const Pixel p = pixel(v, H, W, oh, ow, ki, kj);
    set(a.out, o, p.inside ? get(x, {n, c, p.h, p.w}) : 0.0);
  });
}

// The adjoint of im2col: cols [N, OH*OW, C*KH*KW] -> [N, C, H, W], each
// entry added to the pixel im2col read it from; attrs.ints = {C, H, W, window}.
void col2im_kernel(const Operands& a) {
  const TensorView& cols = a.in[0];
  const Window2d v = Window2d::read(a.attrs->ints, 3);
  const int64_t C = a.out.shape[1], H = a.out.shape[2], W = a.out.shape[3], OW = v.out_w(W);
  std::vector<double> acc(size_t(a.out.numel()), 0.0);
  for_each_index(cols.shape, [&](const Index& i) {
    const int64_t n = i[0], oh = i[1] / OW, ow = i[1] % OW;
    const int64_t c = i[2] / (v.kh * v.kw), ki = i[2] / v.kw % v.kh, kj = i[2] % v.kw;
    const Pixel p = pixel(v, H, W, oh, ow, ki, kj);
    if (p.inside) acc[size_t(((n * C + c) * H + p.h) * W + p.w)] += get(cols, i);
  });
  store(a.out, acc);
}

// x [N, C, H, W] -> [N, C, OH, OW]: the window's image values summed, divided
// by KH*KW (the padding counts as zeros); attrs.ints = {window}.
void avg_pool_2d_kernel(const Operands& a) {
  const TensorView& x = a.in[0];
  const Window2d v = Window2d::read(a.attrs->ints);
  const int64_t H = x.shape[2], W = x.shape[3];
  for_each_index(a.out.shape, [&](const Index& o) {
    double acc = 0;
    for (int64_t ki = 0; ki < v.kh; ++ki) {
      for (int64_t kj = 0; kj < v.kw; ++kj) {
        const Pixel p = pixel(v, H, W, o[2], o[3], ki, kj);
        if (p.inside) acc += get(x, {o[0], o[1], p.h, p.w});
      }
    }
    set(a.out, o, acc / double(v.kh * v.kw));
  });
}

// The adjoint of avg_pool_2d: dy [N, C, OH, OW] -> [N, C, H, W], each dy /
// (KH*KW) added to its window's image pixels; attrs.ints = {H, W, window}.
void avg_pool_2d_back_kernel(const Operands& a) {
  const TensorView& dy = a.in[0];
  const Window2d v = Window2d::read(a.attrs->ints, 2);
  const int64_t C = a.out.shape[1], H = a.out.shape[2], W = a.out.shape[3];
  std::vector<double> acc(size_t(a.out.numel()), 0.0);
  for_each_index(dy.shape, [&](const Index& i) {
    const double share = get(dy, i) / double(v.kh * v.kw);
    for (int64_t ki = 0; ki < v.kh; ++ki) {
      for (int64_t kj = 0; kj < v.kw; ++kj) {
        const Pixel p = pixel(v, H, W, i[2], i[3], ki, kj);
        if (p.inside) acc[size_t(((i[0] * C + i[1]) * H + p.h) * W + p.w)] += share;
      }
    }
  });
  store(a.out, acc);
}

// The image pixel that wins window (oh, ow) of plane (n, c) of the key x:
// the first strictly larger value in row-major window order, a NaN always
// winning (PyTorch's rule). Padding never wins (check_pool_window keeps an
// image pixel in every window); the first image pixel stands if none beats -inf.
Pixel window_argmax(const TensorView& x, const Window2d& v, int64_t n, int64_t c, int64_t oh, int64_t ow) {
  const int64_t H = x.shape[2], W = x.shape[3];
  Pixel best{-1, -1, false};
  double best_value = -std::numeric_limits<double>::infinity();
  for (int64_t ki = 0; ki < v.kh; ++ki) {
    for (int64_t kj = 0; kj < v.kw; ++kj) {
      const Pixel p = pixel(v, H, W, oh, ow, ki, kj);
      if (!p.inside) continue;
      if (!best.inside) best = p;  // stands unless a value beats -inf
      const double value = get(x, {n, c, p.h, p.w});
      if (value > best_value || std::isnan(value)) {
        best = p;
        best_value = value;
      }
    }
  }
  return best;
}

// max_pool_2d(x, values) -> [N, C, OH, OW]: values read at the key x's
// argmax of each window; attrs.ints = {window}.
void max_pool_2d_kernel(const Operands& a) {
  const TensorView &x = a.in[0], &values = a.in[1];
  const Window2d v = Window2d::read(a.attrs->ints);
  for_each_index(a.out.shape, [&](const Index& o) {
    const Pixel p = window_argmax(x, v, o[0], o[1], o[2], o[3]);
    set(a.out, o, get(values, {o[0], o[1], p.h, p.w}));
  });
}

// max_pool_2d_back(x, dy) -> [N, C, H, W]: each dy added at its window's
// argmax in x; attrs.ints = {window}.
void max_pool_2d_back_kernel(const Operands& a) {
  const TensorView &x = a.in[0], &dy = a.in[1];
  const Window2d v = Window2d::read(a.attrs->ints);
  const int64_t C = x.shape[1], H = x.shape[2], W = x.shape[3];
  std::vector<double> acc(size_t(a.out.numel()), 0.0);
  for_each_index(dy.shape, [&](const Index& i) {
    const Pixel p = window_argmax(x, v, i[0], i[1], i[2], i[3]);
    acc[size_t(((i[0] * C + i[1]) * H + p.h) * W + p.w)] += get(dy, i);
  });
  store(a.out, acc);
}

// rope(x [..., T, D], positions [T]); attrs.ints = {mode, inverse, R},
// reals = {base, m, factor_0, ...} (no factors: all 1). The first R
// elements of a row rotate, the rest are copied. Pair i of the row at
// position pos turns by theta = pos * base^(-2i/R) / factor_i (by -theta
// when inverse): (a, b) -> m (a cos - b sin, a sin + b cos).
// The pair is (x[i], x[i + R/2]) in neox mode, (x[2i], x[2i+1]) in original.
void rope_kernel(const Operands& a) {
  const TensorView &x = a.in[0], &positions = a.in[1];
  const bool neox = a.attrs->ints[0] == int64_t(RopeMode::neox);
  const double sign = a.attrs->ints[1] ? -1.0 : 1.0, base = a.attrs->reals[0], m = a.attrs->reals[1];
  const size_t r = a.out.shape.size();
  const int64_t R = a.attrs->ints[2], half = R / 2;
  for_each_index(a.out.shape, [&](const Index& o) {
    const int64_t j = o[r - 1];
    if (j >= R) {
      set(a.out, o, get(x, o));
      return;
    }
    // This element's pair, whether it is the pair's first member, and its partner.
    const int64_t pair = neox ? j % half : j / 2;
    const bool first = neox ? j < half : j % 2 == 0;
    const int64_t partner = neox ? (first ? j + half : j - half) : (first ? j + 1 : j - 1);
    const double factor = a.attrs->reals.size() > 2 ? a.attrs->reals[2 + size_t(pair)] : 1.0;
    const double theta = get(positions, {o[r - 2]}) * std::pow(base, -2.0 * double(pair) / double(R)) / factor;
    const double cs = m * std::cos(theta), sn = m * sign * std::sin(theta);
    Index ip = o;
    ip[r - 1] = partner;
    const double self = get(x, o), other = get(x, ip);
    set(a.out, o, first ? self * cs - other * sn : other * sn + self * cs);
  });
}

}  // namespace

void register_image_kernels() {
  register_kernel(ops::op_im2col, im2col_kernel);
  register_kernel(ops::op_col2im, col2im_kernel);
  register_kernel(ops::op_avg_pool_2d, avg_pool_2d_kernel);
  register_kernel(ops::op_avg_pool_2d_back, avg_pool_2d_back_kernel);
  register_kernel(ops::op_max_pool_2d, max_pool_2d_kernel);
  register_kernel(ops::op_max_pool_2d_back, max_pool_2d_back_kernel);
  register_kernel(ops::op_rope, rope_kernel);
}

}  // namespace reference
}  // namespace nabla
