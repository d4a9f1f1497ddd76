// Every op nabla offers. Each is defined, with its shape rule, CPU kernel,
// backward rule and gradient cases, in src/ops/<name>.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "nabla/tensor.h"

namespace nabla {

enum class GgmlType : uint32_t;  // nabla/gguf.h

// ---- Elementwise, NumPy broadcasting. Gradients are summed back to each
// operand's shape.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
// 1 where a == b, else 0 (a's dtype). Not differentiable.
Tensor eq(const Tensor& a, const Tensor& b);
// cond ? a : b, broadcasting all three; cond is nonzero-is-true, any dtype.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);
Tensor scale(const Tensor& x, double factor);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor silu(const Tensor& x);
// 1 where x > 0, else 0. Not differentiable (its derivative is 0 almost everywhere).
Tensor step(const Tensor& x);
// -1, 0 or 1. Not differentiable.
Tensor sign(const Tensor& x);
// x with no gradient through it: a constant to the backward (PyTorch's detach). A view.
Tensor detach(const Tensor& x);
// x's values as `dtype`: f32 <-> f64 (rounded to nearest; the gradient is cast
// back), i32 -> f32 or f64 (not differentiated). x itself when already `dtype`.
Tensor cast(const Tensor& x, DType dtype);

// ---- Reductions over `axes` (all axes when empty).
Tensor sum(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
// Ties share the gradient equally.
Tensor max(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);

// ---- Linear algebra. [..., M, K] x [..., K, N] -> [..., M, N], batch
// dimensions broadcast; a 1-D operand is treated as NumPy does.
Tensor matmul(const Tensor& a, const Tensor& b);

// ---- Weights in ggml's storage types (GGUF's: GgmlType in nabla/gguf.h):
// w u8 [N, row bytes] holds N rows of K elements in F16, BF16, Q8_0, Q4_0,
// Q4_K or Q6_K, each row a whole number of blocks, as a GGUF file stores a
// weight matrix. Neither op differentiates w.
// w's values as dtype (f32 or f64) [N, K].
Tensor dequantize(const Tensor& w, GgmlType type, int64_t K, DType dtype = DType::f32);
// x [..., K] W^T -> [..., N] (a linear layer's forward), or with transposed
// x [..., N] W -> [..., K]; the weight dequantized a panel at a time, never
// whole (QLoRA's frozen base).
Tensor matmul_quantized(const Tensor& x, const Tensor& w, GgmlType type, int64_t K, bool transposed = false);

// ---- Layout. reshape, permute, transpose, slice and expand are views where
// the layout allows; contiguous() copies only when needed.
Tensor reshape(const Tensor& x, Shape shape);  // one dimension may be -1
Tensor permute(const Tensor& x, std::vector<int64_t> order);
Tensor transpose(const Tensor& x, int64_t axis0 = -2, int64_t axis1 = -1);
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1);
Tensor expand(const Tensor& x, Shape shape);
Tensor contiguous(const Tensor& x);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);

// ---- Indexing. table [R, ...], indices i32 of any shape -> [*indices, ...].
Tensor get_rows(const Tensor& table, const Tensor& indices);

// ---- Activations (elementwise).
Tensor erf(const Tensor& x);
// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Tensor gelu(const Tensor& x);
// GELU, exact: 0.5 x (1 + erf(x / sqrt(2))).
Tensor gelu_erf(const Tensor& x);
// GELU, sigmoid approximation: x * sigmoid(1.702 x).
Tensor gelu_quick(const Tensor& x);
// log(1 + e^(beta x)) / beta; x itself where beta x > threshold (PyTorch). beta > 0.
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
// x where x > 0, alpha (e^x - 1) elsewhere.
Tensor elu(const Tensor& x, double alpha = 1.0);
// x where x > 0, slope * x elsewhere.
Tensor leaky_relu(const Tensor& x, double slope = 0.01);
// x * relu6(x + 3) / 6.
Tensor hardswish(const Tensor& x);
// min(max(x, lo), hi); the gradient is 1 on [lo, hi] (boundaries included), 0 outside.
Tensor clamp(const Tensor& x, double lo, double hi);

// ---- Normalisation over the last axis of x [..., C]; fused kernels.
// (x - mean) / sqrt(var + eps), var biased.
Tensor layer_norm(const Tensor& x, double eps = 1e-5);
// layer_norm(x, eps) * gamma + beta; gamma, beta [C], either may be Tensor() for none.
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5);
// x / sqrt(mean(x^2) + eps).
Tensor rms_norm(const Tensor& x, double eps = 1e-5);
// rms_norm(x, eps) * gamma; gamma [C] or Tensor() for none.
Tensor rms_norm(const Tensor& x, const Tensor& gamma, double eps = 1e-5);

// ---- Convolution and pooling, NCHW: x [N, C, H, W]. Window sizes, strides,
// padding and dilation are (h, w) pairs; a single number means both.
struct Size2d {
  constexpr Size2d(int64_t both) : h(both), w(both) {}
  constexpr Size2d(int64_t h, int64_t w) : h(h), w(w) {}
  int64_t h, w;
};
// Every KH x KW window as a row: [N, OH*OW, C*KH*KW], row index oh*OW + ow,
// column index (c*KH + ki)*KW + kj; zero padding. OH = (H + 2*PH - DH*(KH-1) - 1) / SH + 1.
Tensor im2col(const Tensor& x, Size2d kernel, Size2d stride = 1, Size2d padding = 0, Size2d dilation = 1);
// The adjoint of im2col: adds the rows of cols [N, OH*OW, channels*KH*KW] back
// into an image [N, channels, image.h, image.w] (overlaps accumulate).
Tensor col2im(const Tensor& cols, int64_t channels, Size2d image, Size2d kernel, Size2d stride = 1,
              Size2d padding = 0, Size2d dilation = 1);
// Cross-correlation, as PyTorch's conv2d: w [O, C/groups, KH, KW], bias [O] or
// Tensor() for none -> [N, O, OH, OW]. Composed from im2col and matmul.
Tensor conv_2d(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(), Size2d stride = 1,
               Size2d padding = 0, Size2d dilation = 1, int64_t groups = 1);
// The adjoint of conv_2d in x, as PyTorch's conv_transpose2d: w [C, O/groups,
// KH, KW], bias [O] or Tensor() -> [N, O, OH, OW] with
// OH = (H-1)*SH - 2*PH + DH*(KH-1) + output_padding.h + 1.
Tensor conv_transpose_2d(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(), Size2d stride = 1,
                         Size2d padding = 0, Size2d output_padding = 0, Size2d dilation = 1,
                         int64_t groups = 1);
// Window means; padding counts as zeros (PyTorch's count_include_pad=True).
// padding <= kernel / 2. OH = (H + 2*PH - KH) / SH + 1.
Tensor avg_pool_2d(const Tensor& x, Size2d kernel, Size2d stride, Size2d padding = 0);
// Window maxima; padding never wins. The gradient goes to the first maximum in
// row-major window order (as PyTorch). padding <= kernel / 2.
Tensor max_pool_2d(const Tensor& x, Size2d kernel, Size2d stride, Size2d padding = 0);

// ---- Attention and classification, over the last axis.
// softmax(scale * x + mask): mask additive (-inf hides), broadcastable to x,
// or Tensor() for none; causal hides j > i + (Tk - Tq) on x [..., Tq, Tk].
// A row with every position hidden is NaN. The mask is not differentiated.
Tensor softmax(const Tensor& x, double scale = 1.0, const Tensor& mask = Tensor(), bool causal = false);
Tensor log_softmax(const Tensor& x);
// Mean over rows of -log softmax(logits)[label]: logits [..., C], labels i32
// [...]. Rows labelled ignore_index are skipped; with all rows ignored the
// loss is 0 (PyTorch: NaN). Any other label outside [0, C) throws at run time.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100);
// Mean over rows of -sum(probs * log_softmax(logits)); logits, probs [..., C].
Tensor cross_entropy_soft(const Tensor& logits, const Tensor& probs);
// softmax(scale * q k^T + mask, causal) v: q [..., Tq, D], k [..., Tk, D],
// v [..., Tk, Dv] -> [..., Tq, Dv]; scale defaults to 1/sqrt(D). Composed.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask = Tensor(), bool causal = false,
                                    std::optional<double> scale = std::nullopt);
// The same per (batch, head) on token-major operands, fused: q [B, Tq, H, D],
// k [B, Tk, Hk, D], v [B, Tk, Hk, Dv] -> [B, Tq, H, Dv], the layout of a qkv
// projection reshaped to heads (no permutes or copies). Hk < H is
// grouped-query attention: Hk divides H, and query head h reads key/value
// head h / (H / Hk) where it lies, never a per-head copy. Scores stay in a
// per-thread scratch; the backward recomputes them. Causal needs Tq <= Tk.
// segments (i32 [B, T], Tq = Tk = T): query i sees key j only where their
// ids are equal (documents packed into one row; give padding an id of its own).
// window > 0 (causal only): a sliding window, query i sees the `window` keys
// j with 0 <= i + (Tk - Tq) - j < window (Mistral's, Gemma's; llama.cpp's
// SWA); the keys before it are skipped, not just hidden.
// softcap > 0: each score s = scale q.k is capped to softcap tanh(s / softcap)
// before the softmax (Gemma 2's attn_logit_softcapping); 0: none.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                 std::optional<double> scale = std::nullopt, const Tensor& segments = Tensor(),
                 int64_t window = 0, double softcap = 0);
// Rotary position embedding of x [..., T, D] at positions i32 [T] (or
// offset, offset + 1, ...): the first R = dims elements of each row (0: all
// D; R even) rotate, the rest pass through (Phi-3's partial_rotary_factor,
// llama.cpp's n_rot). Pair i turns by pos * base^(-2i/R) / freq_factors[i]
// and is multiplied by scale (longrope's attention factor on cos and sin).
// neox pairs (x[i], x[i + R/2]) (GPT-NeoX, Hugging Face Llama); original
// pairs (x[2i], x[2i+1]) (GPT-J, Meta). freq_factors: empty (all 1), or R/2
// positive factors (Llama 3's scaled frequencies, longrope's; llama.cpp's
// rope_freqs).
enum class RopeMode : int64_t { neox = 0, original = 1 };
Tensor rope(const Tensor& x, const Tensor& positions, double base = 10000.0, RopeMode mode = RopeMode::neox,
            const std::vector<double>& freq_factors = {}, int64_t dims = 0, double scale = 1);
Tensor rope(const Tensor& x, int64_t offset, double base = 10000.0, RopeMode mode = RopeMode::neox,
            const std::vector<double>& freq_factors = {}, int64_t dims = 0, double scale = 1);
// Zeroes elements with probability p and scales the rest by 1/(1-p); the mask
// is a hash of seed (i32, one element) and the element's position. train =
// false or p = 0 returns x.
Tensor dropout(const Tensor& x, double p, const Tensor& seed, bool train = true, int64_t salt = 0);

// ---- Shaping and indexing.
// Constant padding: one (before, after) pair per axis of x.
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, double value = 0.0);
// Tiles x repeats[d] times along each axis (torch.Tensor.repeat); extra
// leading repeats add axes.
Tensor repeat(const Tensor& x, std::vector<int64_t> repeats);
// dst [R, ...] with rows indices[p] replaced by values [*indices, ...]; with
// duplicate indices the last write wins (and alone gets a gradient).
Tensor set_rows(const Tensor& dst, const Tensor& indices, const Tensor& values);
// i32 position of the maximum along axis (first on ties). Not differentiable.
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim = false);
// indices i32 [...] -> [..., classes] of dtype: 1 at the index, all 0 when
// the index is outside [0, classes). Not differentiable.
Tensor one_hot(const Tensor& indices, int64_t classes, DType dtype = DType::f32);

// ---- Helpers built from the ops above.
// A scalar constant of x's dtype.
Tensor scalar_like(double value, const Tensor& x);
Tensor zeros_like(const Tensor& x);
// Sums a broadcast result back to `shape` (the gradient of expand).
Tensor sum_to(const Tensor& x, const Shape& shape);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator*(const Tensor& x, double s) { return scale(x, s); }
inline Tensor operator*(double s, const Tensor& x) { return scale(x, s); }
inline Tensor operator+(const Tensor& x, double s) { return add(x, scalar_like(s, x)); }
inline Tensor operator-(const Tensor& x, double s) { return add(x, scalar_like(-s, x)); }
inline Tensor operator+(double s, const Tensor& x) { return add(scalar_like(s, x), x); }
inline Tensor operator-(double s, const Tensor& x) { return sub(scalar_like(s, x), x); }

}  // namespace nabla
