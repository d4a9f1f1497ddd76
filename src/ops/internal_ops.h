// Ops that nabla emits for itself, not for users: autodiff's backward rules
// (the fused *_back kernels, the adjoints of slice and get_rows, in-place
// gradient sums) and the fused building blocks that library code (nn layers,
// the gradient accumulation's matmul fusion) puts in graphs. They are
// registered, gradient-checked and listed by `nabla ops` like every op
// (marked internal there: NABLA_INTERNAL_OP in src/ops/op_list.h), but are
// not part of the public API in include/nabla/ops.h: their signatures follow
// what the backward rules need and may change with them.
#pragma once

#include <cstdint>
#include <optional>

#include "nabla/ops.h"
#include "nabla/tensor.h"

namespace nabla {

namespace train {
struct FactoredGradient;
}  // namespace train

// ---- Linear algebra.
// [..., H, M, K] x [..., H, K, N] -> [..., M, H, N]: contiguous(permute(matmul(a, b)))
// with the last batch axis moved after the rows, written so directly. Attention's
// per-head products land token-major, ready for the output projection.
Tensor matmul_heads(const Tensor& a, const Tensor& b);
// matmul(a, b) + c with c broadcast to the product (a bias, or a tensor to add
// into), in one pass: the product accumulates onto c (BLAS beta = 1), in c's
// memory when c dies here, instead of a zeroed output and a separate add.
// A batch of rows against one matrix folds into one product, as in matmul.
Tensor matmul_add(const Tensor& a, const Tensor& b, const Tensor& c);

// ---- Order. x itself (a view), placed after dep in every schedule; dep is
// not read. Recomputation's gate (recompute() in nabla/graph.h).
Tensor after(const Tensor& x, const Tensor& dep);

// ---- Adjoints of slice and get_rows, and the in-place gradient sums.
// Places x into zeros of shape `full` at the positions
// slice(axis, start, stop, step) selects: the adjoint of slice.
Tensor scatter_slice(const Tensor& x, Shape full, int64_t axis, int64_t start, int64_t stop,
                     int64_t step);
// base with x added at the positions slice(axis, start, stop, step) selects
// (base + scatter_slice(x, ...), without the full-size zeros).
Tensor add_slice(const Tensor& base, const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1);
// out [rows, ...] = 0; out[indices[i]] += values[i]: the adjoint of get_rows
// (duplicate indices accumulate).
Tensor scatter_add_rows(const Tensor& values, const Tensor& indices, int64_t rows);
// base [rows, ...] with values[i] added to row indices[i]
// (base + scatter_add_rows(values, indices, rows), without the zeros).
Tensor add_rows(const Tensor& base, const Tensor& values, const Tensor& indices);

// ---- Fused backward ops: the gradients of the GELUs and norms in
// include/nabla/ops.h with respect to x, for incoming gradient dy.
// Differentiable themselves (second order).
Tensor gelu_back(const Tensor& x, const Tensor& dy);
Tensor gelu_erf_back(const Tensor& x, const Tensor& dy);
Tensor gelu_quick_back(const Tensor& x, const Tensor& dy);
// x, dy [..., C]: rstd (dy - mean(dy) - xhat mean(dy xhat)).
Tensor layer_norm_back(const Tensor& x, const Tensor& dy, double eps = 1e-5);
// The affine layer norm's gradients, flat: dx = layer_norm_back(x, dy *
// gamma) (x's elements), then dgamma and dbeta [C] (sums over rows of dy xhat
// and of dy). A defined addend (x's shape) is added to dx as it is written.
Tensor layer_norm_affine_back(const Tensor& x, const Tensor& dy, const Tensor& gamma, double eps = 1e-5,
                              const Tensor& addend = Tensor());
// x, dy [..., C]: rstd (dy - xhat mean(dy xhat)).
Tensor rms_norm_back(const Tensor& x, const Tensor& dy, double eps = 1e-5);

// ---- Pooling.
// values (x's shape) read at each window's argmax in x: max_pool_2d(x) is
// max_pool_2d_at(x, x). Differentiated in values only.
Tensor max_pool_2d_at(const Tensor& x, const Tensor& values, Size2d kernel, Size2d stride, Size2d padding = 0);
// Backward ops of the pools: dy [N, C, OH, OW] -> dx [N, C, H, W].
Tensor avg_pool_2d_back(const Tensor& dy, Size2d image, Size2d kernel, Size2d stride, Size2d padding = 0);
// dy added at each window's argmax in x (x not differentiated).
Tensor max_pool_2d_back(const Tensor& x, const Tensor& dy, Size2d kernel, Size2d stride, Size2d padding = 0);

// ---- Attention and classification.
// softmax's gradient from its output y: scale * y * (dy - sum(dy * y)).
Tensor softmax_back(const Tensor& y, const Tensor& dy, double scale = 1.0);
// Its gradient in logits: (softmax(logits) - onehot) * dloss / count; dloss scalar.
Tensor cross_entropy_back(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                          int64_t ignore_index = -100);
// attention's gradients in q, k and v for output gradient dout, packed flat
// (q's elements, then k's, then v's).
Tensor attention_back(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, bool causal,
                      double scale, const Tensor& segments = Tensor(), int64_t window = 0, double softcap = 0);
// The probabilities alone, softmax(scale q k^T, causal) per (batch, head):
// q [B, Tq, H, D], k [B, Tk, H, D] -> [B, H, Tq, Tk], fused (the scores are
// softmaxed while in cache), for attention that keeps its probabilities for
// the backward: matmul_heads(p, v seen heads-first) is then the output.
Tensor attention_probs(const Tensor& q, const Tensor& k, bool causal = false,
                       std::optional<double> scale = std::nullopt);
// attention_probs' gradients in q and k for probabilities p and their
// gradient dp [B, H, Tq, Tk], packed flat (q's elements, then k's).
Tensor attention_probs_back(const Tensor& q, const Tensor& k, const Tensor& p, const Tensor& dp, double scale);
// The same from p, the values v [B, Tk, H, Dv] and the gradient dout [B, Tq,
// H, Dv] of the output matmul_heads(p, v seen heads-first): dp = dout v^T is
// made per query block in cache and never stored (attention_probs'
// backward takes this form when its dp is that product).
Tensor attention_probs_values_back(const Tensor& q, const Tensor& k, const Tensor& p, const Tensor& v,
                                   const Tensor& dout, double scale);

// ---- A training step as one graph: the gradients' norm and clipping,
// then the updates.
// The sum of the squares of every element of xs (f32 or f64, one dtype, any
// shapes), f64 []: summed as optim::global_norm sums, so for f32 gradients
// global_norm == std::sqrt of it, bit for bit.
Tensor squared_norm(const std::vector<Tensor>& xs);
// settings f64 [2] = {average, clip}, squared_norm one f64 -> f64 [2] =
// {norm, scale}: norm = sqrt(squared_norm) * average, scale = average,
// times clip / norm where clip > 0 and norm > clip (optim::clip_scale).
Tensor clip_scale(const Tensor& squared_norm, const Tensor& settings);
// ||dW||^2, f64 [], of a rows x cols weight gradient kept as factors f
// (src/train/factored_gradient.h), with or without f's add_rows term
// (f.values undefined: none), its products rounding their operands to bf16
// where bf16 (ExecOptions::bf16_matmul): train::GradientRows' norm pieces
// summed in order, then max(sum, 0), as TrainStep's low_memory update sums
// them; within f32 rounding of squared_norm of dW.
Tensor factored_squared_norm(const train::FactoredGradient& f, int64_t rows, int64_t cols, bool bf16);

// ---- Updates: state changed in place (OpDef::mutates), a token out. The
// executor runs them after every other reader of the state they write.
// grad_scale is one f64 (any shape: e.g. a [1] slice of clip_scale's output)
// that multiplies every gradient first; hyper an f64 [3] (may be a view, a row
// of an f64 [P, 3] leaf).
// acc (an f32 leaf) = g where restart (one f64) is nonzero, else acc + g:
// a gradient summed over micro-batches (TrainStep).
Tensor accumulate_update(const Tensor& acc, const Tensor& g, const Tensor& restart);
// One SGD step of parameter p and its momentum buffer buf (f32 leaves) from
// gradient g, hyper = {lr, momentum, weight_decay}: optim::Sgd's bits.
Tensor sgd_update(const Tensor& p, const Tensor& g, const Tensor& buf, const Tensor& hyper, const Tensor& grad_scale);
// One AdamW step of parameter p and its moments m, v (f32 leaves) from
// gradient g, hyper = {lr, step t from 1, weight_decay (0 where p takes no
// decay)}: optim::AdamW's bits.
Tensor adamw_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& hyper,
                    const Tensor& grad_scale, double beta1, double beta2, double eps);
// The same, the gradient of p [R, C] kept as factors f (as for
// factored_squared_norm) and multiplied out a chunk at a time: the bits of
// optim::AdamW::step over a train::GradientRows range, TrainStep's
// low_memory update.
Tensor adamw_update_factored(const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& hyper,
                             const Tensor& grad_scale, const train::FactoredGradient& f, bool bf16, double beta1,
                             double beta2, double eps);

}  // namespace nabla
