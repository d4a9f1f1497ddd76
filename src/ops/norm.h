// Shared by layer_norm, rms_norm and their backward ops: normalisation over
// the last axis, a row being all other axes fixed. Each row is handled by one
// thread; the f32 layer norm kernels take rows kRowBlock at a time.
// attrs.reals = {eps}.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <type_traits>

#include "backend/cpu/kernel.h"
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

// Layer-norm statistics of a row: mean and rstd = 1 / sqrt(var + eps), with
// the biased variance.
template <class T>
struct RowStats {
  T mean, rstd;
};

// Rows a norm kernel handles together (for_each_row_block), so that their
// statistics' reduction chains interleave: one row of 96 or 192 values is a
// chain of dependent sums, horizontal reductions and a square root, about
// 100-170 cycles of latency around 12 vectors of work.
inline constexpr int kRowBlock = 4;
static_assert(kRowBlock == 4, "the blocks' per-row scalars are computed in cpu::Lanes4");

// The statistics of n <= kRowBlock contiguous f32 rows at once, by the
// corrected two-pass algorithm (Chan, Golub and LeVeque): a first mean m0 in
// f32 lanes, then sums of d = x - m0 and d^2 give mean = m0 + mean(d) and
// var = mean(d^2) - mean(d)^2, recovering what m0's rounding lost. With a
// large common offset the d are exact (x and m0 within a factor of 2), so
// nothing cancels that f64 would have kept.
inline void row_stats_two_pass_f32(const float* const* rows, int n, int64_t cols, double eps, RowStats<float>* out) {
  using cpu::VecF;
  constexpr int R = kRowBlock;
  std::array<const float*, R> x;
  for (int r = 0; r < R; ++r) x[r] = rows[r < n ? r : 0];  // missing rows repeat the first, unused
  const std::array<float, R> sum =
      cpu::sum_lanes_rows<R>(cols, [&](int r, int64_t i, int64_t m) { return VecF::load(x[r] + i, 1, m); });
  const float inv_cols = 1.0f / float(cols);
  std::array<float, R> m0;
  for (int r = 0; r < R; ++r) m0[r] = sum[r] * inv_cols;
  // Sums q < R: d of row q; q >= R: d^2 of row q - R.
  const std::array<float, 2 * R> dsum = cpu::sum_lanes_rows<2 * R>(cols, [&](int q, int64_t i, int64_t m) {
    const VecF d = VecF::load(x[q % R] + i, 1, m) - m0[q % R];
    return q < R ? d : d * d;
  });
  // The rows' square roots and divisions in one vector each: as scalars
  // they queued on the divider, about 40 cycles a row.
  cpu::Lanes4 var_eps = {1.0f, 1.0f, 1.0f, 1.0f};
  for (int r = 0; r < R; ++r) {
    const float md = dsum[r] * inv_cols;
    var_eps[r] = std::max(0.0f, dsum[R + r] * inv_cols - md * md) + float(eps);
    m0[r] += md;
  }
  const cpu::Lanes4 rstd = 1.0f / cpu::sqrt(var_eps);
  for (int r = 0; r < n; ++r) out[r] = {m0[r], rstd[r]};
}

// One sweep over n <= kRowBlock contiguous f32 rows for their statistics
// and, with dy (Backward), the two means a layer norm's backward needs:
// sums of x and x^2, and of g = dy gamma (dy without gamma) and g x, so
// var = mean(x^2) - mean^2 and mean(g xhat) = rstd (mean(g x) - mean
// mean(g)). Those subtractions cancel by about 1 + mean^2 / var, so the
// sweep's results are kept only for rows with mean^2 <= var (at most one bit
// lost, about what the two passes' own roundings cost); it returns the
// others (a large common offset, a constant row, NaN or inf: bit r for row
// r), for the caller to take the exact passes. A row's results never depend
// on the other rows of its block. Activations are mostly near zero mean
// against their spread, and the sweep shortens each row's chain of
// dependent work from two or three sweeps with a horizontal sum after each
// to one: on a training step's rows from memory the layer norms were bound
// by that chain (docs/performance.md).
template <bool Backward, bool WithGamma = false>
unsigned one_sweep_f32(const float* const* x, const float* const* dy, const float* gamma, int n, int64_t cols, double eps,
                   RowStats<float>* st, float* mean_g = nullptr, float* mean_gx = nullptr) {
  using cpu::VecF;
  constexpr int R = kRowBlock, S = Backward ? 4 : 2;
  std::array<const float*, R> xr{}, dr{};
  for (int r = 0; r < R; ++r) {
    const int k = r < n ? r : 0;  // missing rows repeat the first, unused
    xr[r] = x[k];
    if constexpr (Backward) dr[r] = dy[k];
  }
  // Sum q / R of row q % R: 0 x, 1 x^2, 2 g, 3 g x.
  const std::array<float, S * R> sum = cpu::sum_lanes_rows<S * R>(cols, [&](int q, int64_t i, int64_t m) {
    const int r = q % R;
    const VecF xv = VecF::load(xr[r] + i, 1, m);
    if (q < R) return xv;
    if (q < 2 * R) return xv * xv;
    VecF g = VecF::load(dr[r] + i, 1, m);
    if constexpr (WithGamma) g = g * VecF::load(gamma + i, 1, m);
    return q < 3 * R ? g : g * xv;
  });
  const float inv_cols = 1.0f / float(cols);
  cpu::Lanes4 var_eps = {1.0f, 1.0f, 1.0f, 1.0f};
  std::array<float, R> mean;
  unsigned redo = 0;
  for (int r = 0; r < n; ++r) {
    mean[r] = sum[r] * inv_cols;
    const float var = sum[R + r] * inv_cols - mean[r] * mean[r];
    if (!(mean[r] * mean[r] <= var)) redo |= 1u << r;  // NaN included
    var_eps[r] = var + float(eps);
  }
  const cpu::Lanes4 rstd = 1.0f / cpu::sqrt(var_eps);  // NaN where var < 0: redone
  for (int r = 0; r < n; ++r) {
    st[r] = {mean[r], rstd[r]};
    if constexpr (Backward) {
      mean_g[r] = sum[2 * R + r] * inv_cols;
      mean_gx[r] = rstd[r] * (sum[3 * R + r] * inv_cols - mean[r] * mean_g[r]);
    }
  }
  return redo;
}

// The statistics of n <= kRowBlock contiguous f32 rows: one sweep where it
// keeps their accuracy, else the two passes.
inline void row_stats_f32(const float* const* rows, int n, int64_t cols, double eps, RowStats<float>* out) {
  const unsigned redo = one_sweep_f32<false>(rows, nullptr, nullptr, n, cols, eps, out);
  if (redo == 0) return;
  std::array<RowStats<float>, kRowBlock> exact{};
  row_stats_two_pass_f32(rows, n, cols, eps, exact.data());
  for (int r = 0; r < n; ++r) {
    if (redo >> r & 1) out[r] = exact[r];
  }
}

// For n <= kRowBlock contiguous f32 rows with their statistics: the means
// over C of g = dy * gamma (dy itself without gamma) and of g * xhat, the two
// sums a layer norm's backward needs, their chains interleaved.
template <bool WithGamma>
void gradient_means_f32(const float* const* x, const float* const* dy, const float* gamma, const RowStats<float>* st,
                        int n, int64_t cols, float* mean_g, float* mean_gx) {
  using cpu::VecF;
  constexpr int R = kRowBlock;
  std::array<const float*, R> xr, dr;
  std::array<RowStats<float>, R> s;
  for (int r = 0; r < R; ++r) {
    const int k = r < n ? r : 0;  // missing rows repeat the first, unused
    xr[r] = x[k], dr[r] = dy[k], s[r] = st[k];
  }
  // Sums q < R: g of row q; q >= R: g xhat of row q - R.
  const std::array<float, 2 * R> sum = cpu::sum_lanes_rows<2 * R>(cols, [&](int q, int64_t i, int64_t m) {
    const int r = q % R;
    VecF g = VecF::load(dr[r] + i, 1, m);
    if constexpr (WithGamma) g = g * VecF::load(gamma + i, 1, m);
    return q < R ? g : g * ((VecF::load(xr[r] + i, 1, m) - s[r].mean) * s[r].rstd);
  });
  const float inv_cols = 1.0f / float(cols);
  for (int r = 0; r < n; ++r) {
    mean_g[r] = sum[r] * inv_cols;
    mean_gx[r] = sum[R + r] * inv_cols;
  }
}

// A layer norm backward's per-row values for n <= kRowBlock contiguous f32
// rows: statistics and the means of g and g xhat (g = dy gamma, or dy
// without gamma), in one sweep where it keeps their accuracy, else the exact
// passes.
template <bool WithGamma>
void backward_means_f32(const float* const* x, const float* const* dy, const float* gamma, int n, int64_t cols,
                        double eps, RowStats<float>* st, float* mean_g, float* mean_gx) {
  const unsigned redo = one_sweep_f32<true, WithGamma>(x, dy, gamma, n, cols, eps, st, mean_g, mean_gx);
  if (redo == 0) return;
  std::array<RowStats<float>, kRowBlock> exact{};
  std::array<float, kRowBlock> g, gx;
  row_stats_two_pass_f32(x, n, cols, eps, exact.data());
  gradient_means_f32<WithGamma>(x, dy, gamma, exact.data(), n, cols, g.data(), gx.data());
  for (int r = 0; r < n; ++r) {
    if (redo >> r & 1) st[r] = exact[r], mean_g[r] = g[r], mean_gx[r] = gx[r];
  }
}

// One contiguous row's statistics in T: f32 as row_stats_f32; f64 by the
// plain two passes in f64.
template <class T>
RowStats<T> row_stats(const T* x, int64_t cols, double eps) {
  if constexpr (std::is_same_v<T, float>) {
    RowStats<float> st;
    row_stats_f32(&x, 1, cols, eps, &st);
    return st;
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

// Up to kRowBlock consecutive rows: rows row0 .. row0 + n - 1, whose first
// elements sit at offset[k][i] in operand k.
template <size_t K>
struct RowBlock {
  int64_t row0 = 0;
  int n = 0;
  std::array<std::array<int64_t, kRowBlock>, K> offset{};
};

// How far ahead of its work a norm kernel requests its input rows. In a
// training step a norm's rows come from memory, not cache (the arena is far
// larger than L3), and a row's statistics are a chain of dependent work that
// keeps the core from running ahead into the next rows' misses on its own.
// About 4 KiB ahead measures best; further ahead, or the output's rows
// requested for writing too, does not help (docs/performance.md).
inline constexpr int64_t kPrefetchBytes = 4096;

// Calls fn(block) for every row of the K operands, kRowBlock rows at a time
// (fewer at the end of a parallel chunk); the operands all have the output's
// shape with any strides, and along a row operand k steps by its last
// stride; the output is written row by row. Each row is handled by one
// thread, start to end.
template <size_t K, class F>
void for_each_row_block(const KernelArgs& a, F&& fn) {
  const Shape& shape = a.out.shape;
  const int64_t cols = shape.back();
  Shape outer(shape.begin(), shape.end() - 1);
  std::array<Strides, K> strides;
  std::array<const Strides*, K> ptrs;
  for (size_t k = 0; k < K; ++k) {
    strides[k] = Strides(a.in[k].strides.begin(), a.in[k].strides.end() - 1);
    ptrs[k] = &strides[k];
  }
  const cpu::Walker<K> rows(outer, ptrs);
  const int64_t grain = norm_grain(cols);
  std::array<int64_t, K> row_stride;
  if (rows.single_run(&row_stride)) {
    // Rows at one stride in every operand (contiguous, broadcast, or with a
    // strided last axis): the common case, a plain loop that requests the
    // operands' contiguous rows kPrefetchBytes ahead.
    const int64_t out_size = int64_t(dtype_size(a.out.dtype)), row_bytes = cols * out_size;
    const int64_t ahead = std::max<int64_t>(kRowBlock, kPrefetchBytes / std::max<int64_t>(1, row_bytes));
    const auto prefetch = [&](int64_t r0, int64_t r1) {
      for (size_t k = 0; k < K; ++k) {
        const TensorView& in = a.in[k];
        if (in.strides.back() != 1 || row_stride[k] == 0) continue;  // gathered or broadcast rows
        const int64_t size = int64_t(dtype_size(in.dtype));
        for (int64_t r = r0; r < r1; ++r) {
          const char* row = static_cast<const char*>(in.data) + r * row_stride[k] * size;
          for (int64_t byte = 0; byte < cols * size; byte += 64) __builtin_prefetch(row + byte);
        }
      }
    };
    a.parallel_for(numel(outer), grain, [&](int64_t b, int64_t e) {
      prefetch(b, std::min(e, b + ahead));
      for (RowBlock<K> block{.row0 = b}; block.row0 < e; block.row0 += block.n) {
        block.n = int(std::min<int64_t>(kRowBlock, e - block.row0));
        prefetch(std::min(e, block.row0 + ahead), std::min(e, block.row0 + ahead + block.n));
        for (size_t k = 0; k < K; ++k) {
          for (int i = 0; i < block.n; ++i) block.offset[k][i] = (block.row0 + i) * row_stride[k];
        }
        fn(static_cast<const RowBlock<K>&>(block));
      }
    });
    return;
  }
  a.parallel_for(numel(outer), grain, [&](int64_t b, int64_t e) {
    RowBlock<K> block{.row0 = b};  // runs arrive in row-major order
    rows.run(b, e, [&](const std::array<int64_t, K>& o, int64_t n, const std::array<int64_t, K>& s) {
      for (int64_t i = 0; i < n; ++i) {
        for (size_t k = 0; k < K; ++k) block.offset[k][block.n] = o[k] + i * s[k];
        if (++block.n == kRowBlock) {
          fn(static_cast<const RowBlock<K>&>(block));
          block.row0 += block.n;
          block.n = 0;
        }
      }
    });
    if (block.n > 0) fn(static_cast<const RowBlock<K>&>(block));
  });
}

// For layer norm's f32 forward kernels: fn(row, x, stats) for every row of
// operand 0 (x contiguous: gathered when strided), each block's statistics
// computed together first.
template <class F>
void for_each_row_stats_f32(const KernelArgs& a, double eps, F&& fn) {
  const float* xp = a.in[0].ptr<float>();
  const int64_t cols = a.out.shape.back(), sx = a.in[0].strides.back();
  for_each_row_block<1>(a, [&](const RowBlock<1>& b) {
    std::array<const float*, kRowBlock> x{};
    std::array<RowStats<float>, kRowBlock> st;
    for (int i = 0; i < b.n; ++i) x[i] = cpu::gather(xp + b.offset[0][i], sx, cols, cpu::gather_buffer(i));
    row_stats_f32(x.data(), b.n, cols, eps, st.data());
    for (int i = 0; i < b.n; ++i) fn(b.row0 + i, x[i], st[i]);
  });
}

// Calls fn(row, offsets) for every row, as for_each_row_block does in blocks.
template <size_t K, class F>
void for_each_row(const KernelArgs& a, F&& fn) {
  for_each_row_block<K>(a, [&](const RowBlock<K>& block) {
    for (int i = 0; i < block.n; ++i) {
      std::array<int64_t, K> off;
      for (size_t k = 0; k < K; ++k) off[k] = block.offset[k][i];
      fn(block.row0 + i, off);
    }
  });
}

}  // namespace nabla::ops
