// conv_transpose_2d: PyTorch's ConvTranspose2d, the adjoint of conv_2d with
// respect to its input. Composed from a batched matmul over groups (each input
// pixel times the weights gives one window's worth of output) and col2im (the
// windows added into the output image); its backward comes from theirs.
//
// Legend: N batch, C input channels, O output channels, G groups,
// CG = C/G, OG = O/G, H x W input, KH x KW kernel, L = H*W,
// OH = (H-1)*SH - 2*PH + DH*(KH-1) + OPH + 1 (likewise OW), OPH output padding.
//   x    [N, C, H, W]
//   w    [C, OG, KH, KW]  (conv_2d's weight for the reverse direction)
//   bias [O] (optional)
//   y    [N, O, OH, OW]
#include "ops/conv.h"
#include "ops/internal_ops.h"

namespace nabla {

Tensor conv_transpose_2d(const Tensor& x, const Tensor& w, const Tensor& bias, Size2d stride,
                         Size2d padding, Size2d output_padding, Size2d dilation, int64_t groups) {
  const char* op = "conv_transpose_2d";
  if (!x.defined() || !w.defined()) {
    throw UsageError("conv_transpose_2d: x and w must be defined tensors");
  }
  require_floating(op, x, "x");
  require_same_dtype(op, x, w);
  ops::require_nchw(op, x, "x");
  if (w.rank() != 4) {
    throw ShapeError("conv_transpose_2d: w must be [C, O/groups, KH, KW], got " +
                     to_string(w.shape()));
  }
  if (groups < 1) {
    throw ShapeError("conv_transpose_2d: groups must be positive, got " + std::to_string(groups));
  }
  int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  int64_t OG = w.dim(1), KH = w.dim(2), KW = w.dim(3), G = groups, O = OG * G;
  if (w.dim(0) != C) {
    throw ShapeError("conv_transpose_2d: channels differ: x has " + std::to_string(C) +
                     ", w expects " + std::to_string(w.dim(0)) + " (groups " + std::to_string(G) +
                     ")");
  }
  if (C % G != 0) {
    throw ShapeError("conv_transpose_2d: input channels " + std::to_string(C) +
                     " are not divisible by groups " + std::to_string(G));
  }
  if (bias.defined()) {
    require_same_dtype(op, x, bias);
    if (bias.shape() != Shape{O}) {
      throw ShapeError("conv_transpose_2d: bias must be [" + std::to_string(O) + "], got " +
                       to_string(bias.shape()));
    }
  }
  ops::Window2d win = ops::Window2d::make({KH, KW}, stride, padding, dilation);
  if (win.kh < 1 || win.kw < 1 || win.sh < 1 || win.sw < 1 || win.dh < 1 || win.dw < 1 ||
      win.ph < 0 || win.pw < 0 || output_padding.h < 0 || output_padding.w < 0) {
    throw ShapeError(
        "conv_transpose_2d: kernel, stride and dilation must be positive and padding, "
        "output_padding non-negative");
  }
  // PyTorch's rule: otherwise the extra rows/columns would be out of reach of any window.
  if ((output_padding.h >= win.sh && output_padding.h >= win.dh) ||
      (output_padding.w >= win.sw && output_padding.w >= win.dw)) {
    throw ShapeError(
        "conv_transpose_2d: output_padding must be smaller than stride or dilation, got " +
        std::to_string(output_padding.h) + "x" + std::to_string(output_padding.w));
  }
  int64_t OH = (H - 1) * win.sh - 2 * win.ph + win.dh * (KH - 1) + output_padding.h + 1;
  int64_t OW = (W - 1) * win.sw - 2 * win.pw + win.dw * (KW - 1) + output_padding.w + 1;
  if (OH < 1 || OW < 1) {
    throw ShapeError("conv_transpose_2d: padding " + std::to_string(win.ph) + "x" +
                     std::to_string(win.pw) + " leaves an empty " + std::to_string(OH) + "x" +
                     std::to_string(OW) + " output");
  }
  // The output's im2col has H x W windows, or more when output_padding >=
  // stride (allowed when it is below the dilation): those extra windows see
  // input zeros.
  int64_t WH = win.out_h(OH), WW = win.out_w(OW);
  Tensor xp = x;
  if (WH > H) xp = scatter_slice(xp, {N, C, WH, W}, 2, 0, H, 1);
  if (WW > W) xp = scatter_slice(xp, {N, C, WH, WW}, 3, 0, W, 1);
  int64_t L = WH * WW, CG = C / G, K = OG * KH * KW;

  // Window l of the output gets, per group, x[:, group, l]^T times that
  // group's weights: [L, CG] x [CG, K]. The transposed view of x costs no copy.
  Tensor x_t = transpose(reshape(xp, {N, G, CG, L}));  // [N, G, L, CG]
  Tensor w_g = reshape(w, {G, CG, K});                 // [G, CG, K]
  Tensor cols = matmul(x_t, w_g);                      // [N, G, L, K]
  // To im2col's layout [N, L, O*KH*KW]: a view when G == 1, else a copy.
  cols = reshape(permute(cols, {0, 2, 1, 3}), {N, L, O * KH * KW});
  Tensor y = col2im(cols, O, {OH, OW}, {KH, KW}, stride, padding, dilation);
  if (bias.defined()) y = y + reshape(bias, {O, 1, 1});
  return y;
}

namespace ops {

std::vector<GradCase> conv_transpose_2d_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"conv_transpose_2d_bias",
       {normal({2, 3, 3, 4}), normal({3, 2, 3, 3}), normal({2})},
       [](X t) { return conv_transpose_2d(t[0], t[1], t[2]); }},
      {"conv_transpose_2d_stride2_pad",
       {normal({2, 2, 3, 3}), normal({2, 3, 3, 2}), normal({3})},
       [](X t) {
         return conv_transpose_2d(t[0], t[1], t[2], 2, 1, {1, 0});
       }},
      {"conv_transpose_2d_groups",
       {normal({2, 4, 3, 3}), normal({4, 3, 2, 3}), normal({6})},
       [](X t) {
         return conv_transpose_2d(t[0], t[1], t[2], {2, 1}, {0, 1}, 0, 1, 2);
       }},
      // Dilation; output_padding (2) at or above the stride (1) but below the
      // dilation (3), so the input is padded with zeros.
      {"conv_transpose_2d_dilation",
       {normal({1, 2, 3, 4}), normal({2, 2, 2, 2})},
       [](X t) {
         return conv_transpose_2d(t[0], t[1], Tensor(), 1, {0, 1}, {2, 0}, {3, 2});
       }},
  };
}

}  // namespace ops

}  // namespace nabla
