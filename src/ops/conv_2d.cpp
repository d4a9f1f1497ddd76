// conv_2d: 2-D cross-correlation (PyTorch's Conv2d), composed from im2col and
// a batched matmul over groups, so its backward comes from theirs: dx is a
// col2im, dw and dbias are matmul and broadcast reductions. No step of it asks
// for a contiguous gradient (ggml's conv_2d ends in a CONT whose backward did).
//
// Legend: N batch, C input channels, O output channels, G groups,
// CG = C/G, OG = O/G, H x W input, KH x KW kernel, OH x OW output,
// L = OH*OW, K = CG*KH*KW (one group's window length).
//   x    [N, C, H, W]
//   w    [O, CG, KH, KW]
//   bias [O] (optional)
//   y    [N, O, OH, OW]
#include "ops/conv.h"

namespace nabla {

namespace {

std::string channel_error(const char* op, const Tensor& x, int64_t expected, int64_t groups) {
  return std::string(op) + ": channels differ: x has " + std::to_string(x.dim(1)) + ", w expects " +
         std::to_string(expected) + " (groups " + std::to_string(groups) + ")";
}

}  // namespace

Tensor conv_2d(const Tensor& x, const Tensor& w, const Tensor& bias, Size2d stride, Size2d padding,
               Size2d dilation, int64_t groups) {
  const char* op = "conv_2d";
  if (!x.defined() || !w.defined()) throw UsageError("conv_2d: x and w must be defined tensors");
  require_floating(op, x, "x");
  require_same_dtype(op, x, w);
  ops::require_nchw(op, x, "x");
  if (w.rank() != 4) {
    throw ShapeError("conv_2d: w must be [O, C/groups, KH, KW], got " + to_string(w.shape()));
  }
  if (groups < 1) {
    throw ShapeError("conv_2d: groups must be positive, got " + std::to_string(groups));
  }
  int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  int64_t O = w.dim(0), CG = w.dim(1), KH = w.dim(2), KW = w.dim(3);
  if (CG * groups != C) throw ShapeError(channel_error(op, x, CG * groups, groups));
  if (O % groups != 0) {
    throw ShapeError("conv_2d: output channels " + std::to_string(O) +
                     " are not divisible by groups " + std::to_string(groups));
  }
  if (bias.defined()) {
    require_same_dtype(op, x, bias);
    if (bias.shape() != Shape{O}) {
      throw ShapeError("conv_2d: bias must be [" + std::to_string(O) + "], got " +
                       to_string(bias.shape()));
    }
  }
  ops::Window2d win = ops::Window2d::make({KH, KW}, stride, padding, dilation);
  ops::check_window(op, win, H, W);
  int64_t OH = win.out_h(H), OW = win.out_w(W), L = OH * OW, G = groups, K = CG * KH * KW;

  Tensor cols = im2col(x, {KH, KW}, stride, padding, dilation);  // [N, L, C*KH*KW]
  // A group's columns are one contiguous range; read them as cols_g^T, a
  // transposed view that matmul multiplies without a copy.
  Tensor cols_t = permute(reshape(cols, {N, L, G, K}), {0, 2, 3, 1});  // [N, G, K, L]
  Tensor w_g = reshape(w, {G, O / G, K});                              // [G, OG, K]
  Tensor y = matmul(w_g, cols_t);                                      // [N, G, OG, L]
  y = reshape(y, {N, O, OH, OW});
  if (bias.defined()) y = y + reshape(bias, {O, 1, 1});
  return y;
}

namespace ops {

std::vector<GradCase> conv_2d_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"conv_2d_bias",
       {normal({2, 3, 5, 4}), normal({4, 3, 3, 3}), normal({4})},
       [](X t) { return conv_2d(t[0], t[1], t[2], 1, 1); }},
      {"conv_2d_stride2_pad",
       {normal({2, 2, 6, 5}), normal({3, 2, 3, 3}), normal({3})},
       [](X t) { return conv_2d(t[0], t[1], t[2], 2, 1); }},
      {"conv_2d_groups",
       {normal({2, 4, 5, 5}), normal({6, 2, 2, 3}), normal({6})},
       [](X t) {
         return conv_2d(t[0], t[1], t[2], {1, 2}, {1, 0}, 1, 2);
       }},
      // Non-square kernel, dilation and per-axis stride/padding; no bias.
      {"conv_2d_dilation",
       {normal({1, 2, 7, 6}), normal({2, 2, 2, 3})},
       [](X t) {
         return conv_2d(t[0], t[1], Tensor(), {2, 1}, {0, 2}, {2, 2});
       }},
      // Depthwise: one input channel per group.
      {"conv_2d_depthwise",
       {normal({2, 3, 4, 4}), normal({3, 1, 3, 2}), normal({3})},
       [](X t) { return conv_2d(t[0], t[1], t[2], 1, 1, 1, 3); }},
      // The ViT patch embedding: stride equal to the kernel.
      {"conv_2d_patches",
       {normal({2, 3, 4, 6}), normal({5, 3, 2, 2}), normal({5})},
       [](X t) { return conv_2d(t[0], t[1], t[2], 2); }},
  };
}

}  // namespace ops

}  // namespace nabla
