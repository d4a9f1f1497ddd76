// Shared by layer_norm, rms_norm and their backward ops: normalisation over
// the last axis, one row (all other axes fixed) per work item.
// attrs.reals = {eps}.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>

#include "backend/cpu/simd.h"
#include "backend/cpu/strided.h"
#include "core/op.h"

namespace nabla::ops {

Attrs norm_attrs(double eps);
inline double norm_eps(const Attrs& attrs) { return attrs.reals[0]; }

// x [..., C] (rank >= 1, floating); for the backward ops a second operand dy
// with x's shape and dtype. eps must be finite and >= 0.
Meta infer_norm(const char* op, const std::vector<Tensor>& in, const Attrs& attrs);

// Checks an affine parameter (gamma or beta) is [C] for x [..., C]; undefined is allowed.
void check_norm_param(const char* op, const char* what, const Tensor& p, const Tensor& x);

// A contiguous row's layer-norm statistics, two passes: the mean summed in
// f64 (a large common offset would cancel in f32), then the centred squares
// in T lanes; rstd = 1 / sqrt(var + eps) with the biased variance.
template <class T>
struct RowStats {
  T mean, rstd;
};

template <class T>
RowStats<T> row_stats(const T* x, int64_t cols, double eps) {
  if constexpr (std::is_same_v<T, float>) {
    using cpu::VecF;
    const float mean = float(cpu::sum_f64(x, cols) / double(cols));
    const float sq = cpu::sum_lanes(cols, [&](int64_t i, int64_t n) {
      const VecF d = VecF::load(x + i, 1, n) - mean;
      return d * d;
    });
    return {mean, float(1.0 / std::sqrt(double(sq / float(cols)) + eps))};
  } else {
    double mean = 0;
    for (int64_t j = 0; j < cols; ++j) mean += double(x[j]);
    mean /= double(cols);
    double var = 0;
    for (int64_t j = 0; j < cols; ++j) var += (double(x[j]) - mean) * (double(x[j]) - mean);
    return {T(mean), T(1.0 / std::sqrt(var / double(cols) + eps))};
  }
}

// Rows per parallel chunk (about 16k elements): fixed, so results never depend
// on the thread count.
inline int64_t norm_grain(int64_t cols) {
  return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, cols));
}

// Calls fn(row, offsets) for every row of the K operands, which all have the
// output's shape with any strides: offsets[k] is the element offset of the
// row's first element in operand k; along the row operand k steps by its last
// stride. Each row is handled by one thread, start to end.
template <size_t K, class F>
void for_each_row(const KernelArgs& a, F&& fn) {
  const Shape& shape = a.out.shape;
  Shape outer(shape.begin(), shape.end() - 1);
  std::array<Strides, K> strides;
  std::array<const Strides*, K> ptrs;
  for (size_t k = 0; k < K; ++k) {
    strides[k] = Strides(a.in[k].strides.begin(), a.in[k].strides.end() - 1);
    ptrs[k] = &strides[k];
  }
  cpu::Walker<K> rows(outer, ptrs);
  a.parallel_for(numel(outer), norm_grain(shape.back()), [&](int64_t b, int64_t e) {
    int64_t row = b;  // runs arrive in row-major order
    rows.run(b, e,
             [&](const std::array<int64_t, K>& o, int64_t n, const std::array<int64_t, K>& s) {
               for (int64_t i = 0; i < n; ++i, ++row) {
                 std::array<int64_t, K> off;
                 for (size_t k = 0; k < K; ++k) off[k] = o[k] + i * s[k];
                 fn(row, off);
               }
             });
  });
}

}  // namespace nabla::ops
