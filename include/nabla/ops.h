// Every op nabla offers. Each is defined, with its shape rule, CPU kernel,
// backward rule and gradient cases, in src/ops/<name>.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "nabla/tensor.h"

namespace nabla {

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

// ---- Reductions over `axes` (all axes when empty).
Tensor sum(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
// Ties share the gradient equally.
Tensor max(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);

// ---- Linear algebra. [..., M, K] x [..., K, N] -> [..., M, N], batch
// dimensions broadcast; a 1-D operand is treated as NumPy does.
Tensor matmul(const Tensor& a, const Tensor& b);

// ---- Layout. reshape, permute, transpose, slice and expand are views where
// the layout allows; contiguous() copies only when needed.
Tensor reshape(const Tensor& x, Shape shape);  // one dimension may be -1
Tensor permute(const Tensor& x, std::vector<int64_t> order);
Tensor transpose(const Tensor& x, int64_t axis0 = -2, int64_t axis1 = -1);
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1);
Tensor expand(const Tensor& x, Shape shape);
Tensor contiguous(const Tensor& x);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
// Places x into zeros of shape `full` at the positions
// slice(axis, start, stop, step) selects: the adjoint of slice.
Tensor scatter_slice(const Tensor& x, Shape full, int64_t axis, int64_t start, int64_t stop,
                     int64_t step);

// ---- Indexing. table [R, ...], indices i32 of any shape -> [*indices, ...].
Tensor get_rows(const Tensor& table, const Tensor& indices);
// out [rows, ...] = 0; out[indices[i]] += values[i]: the adjoint of get_rows
// (duplicate indices accumulate).
Tensor scatter_add_rows(const Tensor& values, const Tensor& indices, int64_t rows);

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
