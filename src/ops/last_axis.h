// Shared by ops that work on whole rows of the last axis (softmax,
// log_softmax, cross-entropy, rope): a walk over the rows of a shape for
// several operands, each with its own strides (0 where broadcast).
#pragma once

#include <algorithm>
#include <optional>

#include "backend/cpu/strided.h"
#include "core/op.h"

namespace nabla::ops {

// Keys that query `row` (0 <= row < tq) of a [..., Tq, Tk] score matrix sees
// under the causal rule j <= i + (Tk - Tq), so the last query sees every key
// (the KV-cache convention); 0 when Tq > Tk leaves it none.
inline int64_t causal_visible(int64_t row, int64_t tq, int64_t tk) {
  return std::clamp<int64_t>(row + (tk - tq) + 1, 0, tk);
}

// Rows per parallel chunk: about 32K elements, fixed by the row length alone
// so results never depend on the thread count.
inline int64_t row_grain(int64_t len) {
  return std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, len));
}

template <size_t K>
class RowWalker {
 public:
  // shape: the rows' common shape (rank >= 1; a scalar is one row of one).
  // strides[k]: operand k's strides in that shape.
  RowWalker(const Shape& shape, const std::array<Strides, K>& strides) {
    size_t r = shape.size();
    len_ = r ? shape[r - 1] : 1;
    Shape outer = r ? Shape(shape.begin(), shape.end() - 1) : Shape{};
    for (size_t k = 0; k < K; ++k) {
      inner_[k] = r ? strides[k][r - 1] : 0;
      outer_strides_[k] = r ? Strides(strides[k].begin(), strides[k].end() - 1) : Strides{};
    }
    rows_ = numel(outer);
    std::array<const Strides*, K> ptrs;
    for (size_t k = 0; k < K; ++k) ptrs[k] = &outer_strides_[k];
    walker_.emplace(outer, ptrs);
  }

  int64_t rows() const { return rows_; }
  int64_t len() const { return len_; }
  // Operand k's stride along a row.
  int64_t inner(size_t k) const { return inner_[k]; }

  // fn(row, offsets) for rows [b, e) in order; offsets[k] is operand k's
  // element offset at the row's start.
  template <class F>
  void run(int64_t b, int64_t e, F&& fn) const {
    int64_t row = b;
    walker_->run(b, e,
                 [&](const std::array<int64_t, K>& o, int64_t n, const std::array<int64_t, K>& s) {
                   for (int64_t i = 0; i < n; ++i) {
                     std::array<int64_t, K> offs;
                     for (size_t k = 0; k < K; ++k) offs[k] = o[k] + i * s[k];
                     fn(row++, offs);
                   }
                 });
  }

 private:
  int64_t len_ = 1, rows_ = 1;
  std::array<int64_t, K> inner_{};
  std::array<Strides, K> outer_strides_;
  std::optional<cpu::Walker<K>> walker_;
};

}  // namespace nabla::ops
