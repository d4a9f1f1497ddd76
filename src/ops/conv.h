// Shared by the sliding-window ops (im2col, col2im, avg/max pooling) and the
// convolutions composed from them: the window geometry, its attrs and checks.
//
// Legend (NCHW, NumPy order):
//   N batch, C channels, H x W image, KH x KW kernel,
//   OH x OW output positions (L = OH * OW), S stride, P padding, D dilation.
// Window (oh, ow) covers image rows oh*SH - PH + ki*DH for ki in [0, KH), and
// likewise columns; positions outside the image are the padding.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/op.h"

namespace nabla::ops {

struct Window2d {
  int64_t kh = 1, kw = 1;  // kernel
  int64_t sh = 1, sw = 1;  // stride
  int64_t ph = 0, pw = 0;  // padding (both sides)
  int64_t dh = 1, dw = 1;  // dilation

  static Window2d make(Size2d kernel, Size2d stride, Size2d padding, Size2d dilation) {
    return {kernel.h, kernel.w, stride.h, stride.w, padding.h, padding.w, dilation.h, dilation.w};
  }
  // Output positions along one axis; 0 when the window does not fit.
  static int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    int64_t room = in + 2 * p - d * (k - 1) - 1;  // NOTE: `/` truncates, so test the sign first
    return room < 0 ? 0 : room / s + 1;
  }
  int64_t out_h(int64_t h) const { return out_size(h, kh, sh, ph, dh); }
  int64_t out_w(int64_t w) const { return out_size(w, kw, sw, pw, dw); }

  // Attrs layout: the 8 numbers in the order of the fields, starting at `at`.
  void append_to(std::vector<int64_t>& ints) const {
    ints.insert(ints.end(), {kh, kw, sh, sw, ph, pw, dh, dw});
  }
  static Window2d read(const std::vector<int64_t>& ints, size_t at = 0) {
    const int64_t* p = ints.data() + at;
    return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]};
  }
};

// Throws ShapeError naming `op` unless kernel, stride and dilation are
// positive, padding non-negative, and at least one window fits the padded
// h x w image.
void check_window(const char* op, const Window2d& win, int64_t h, int64_t w);

// Pooling windows: also a non-empty image and PyTorch's rule padding <=
// kernel / 2, so every window holds at least one image position (max
// pooling never sees only padding).
void check_pool_window(const char* op, const Window2d& win, int64_t h, int64_t w);

// Throws ShapeError unless x is 4-D: "op: what must be [N, C, H, W], got [3, 4]".
void require_nchw(const char* op, const Tensor& x, const char* what);

// Max pooling's choice in window (oh, ow) of one plane with row/column strides
// rs/cs: the position ih*W + iw of the window's maximum, the first in
// row-major window order on ties. Only image positions are scanned, so padding
// never wins (check_pool_window keeps one in every window). Pools have no
// dilation: v.dh, v.dw are 1.
template <class T>
int64_t window_argmax(const T* plane, int64_t rs, int64_t cs, int64_t H, int64_t W,
                      const Window2d& v, int64_t oh, int64_t ow) {
  int64_t h0 = oh * v.sh - v.ph, w0 = ow * v.sw - v.pw;
  int64_t best_at = std::max<int64_t>(h0, 0) * W + std::max<int64_t>(w0, 0);
  T best = -std::numeric_limits<T>::infinity();
  for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + v.kh, H); ++ih) {
    for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + v.kw, W); ++iw) {
      T val = plane[ih * rs + iw * cs];
      // PyTorch's rule: a strictly larger value wins (ties keep the first), and a NaN always wins.
      if (val > best || std::isnan(val)) {
        best = val;
        best_at = ih * W + iw;
      }
    }
  }
  return best_at;
}

// conv_2d and conv_transpose_2d are compositions, not registered ops. Their
// gradient cases run under the op that carries them through the registry's
// gradient tests: conv_2d's under im2col, conv_transpose_2d's under col2im.
std::vector<GradCase> conv_2d_cases();
std::vector<GradCase> conv_transpose_2d_cases();

}  // namespace nabla::ops
