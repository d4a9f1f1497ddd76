// Strided iteration shared by every kernel: one walker over an N-d index space
// for several operands with their own strides (0 for broadcast), with adjacent
// dimensions coalesced so contiguous data runs as one flat loop.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "nabla/shape.h"

namespace nabla::cpu {

inline constexpr int kMaxRank = 8;

// Strides of a view of `shape` read as if broadcast to `out` (right-aligned,
// 0 where the view has size 1 or no dimension).
inline Strides broadcast_strides(const Shape& shape, const Strides& strides, const Shape& out) {
  Strides s(out.size(), 0);
  size_t lead = out.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) s[lead + i] = shape[i] == 1 ? 0 : strides[i];
  return s;
}

// Walks the row-major positions [begin, end) of `shape` for K operands and
// calls fn(offsets, n, inner) for each run of n positions along the innermost
// (coalesced) dimension: offsets[k] is operand k's element offset at the run
// start, inner[k] its stride along the run.
template <size_t K>
class Walker {
 public:
  Walker(const Shape& shape, const std::array<const Strides*, K>& strides) {
    // Drop size-1 dimensions, then merge dimension d into d+1 where every
    // operand's layout is contiguous across the two.
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      if (rank_ > 0) {
        bool merge = true;
        for (size_t k = 0; k < K; ++k) {
          merge = merge && (*strides[k])[d] * shape[d] == stride_[k][rank_ - 1];
        }
        if (merge) {
          // The merged dimension keeps the inner stride and grows in size.
          shape_[rank_ - 1] *= shape[d];
          for (size_t k = 0; k < K; ++k) stride_[k][rank_ - 1] = (*strides[k])[d];
          continue;
        }
      }
      shape_[rank_] = shape[d];
      for (size_t k = 0; k < K; ++k) stride_[k][rank_] = (*strides[k])[d];
      ++rank_;
    }
  }

  // True when the walk is a single run with unit stride for every operand.
  bool flat() const {
    if (rank_ == 0) return true;
    if (rank_ > 1) return false;
    for (size_t k = 0; k < K; ++k) {
      if (stride_[k][0] != 1) return false;
    }
    return true;
  }

  // True when the walk is at most one run: position p of operand k is then at
  // p * stride[k].
  bool single_run(std::array<int64_t, K>* stride) const {
    if (rank_ > 1) return false;
    for (size_t k = 0; k < K; ++k) (*stride)[k] = rank_ == 0 ? 0 : stride_[k][0];
    return true;
  }

  template <class F>
  void run(int64_t begin, int64_t end, F&& fn) const {
    // An empty range has no multi-index; with a zero extent, finding one
    // would divide by it.
    if (begin >= end) return;
    std::array<int64_t, K> inner{};
    if (rank_ == 0) {
      std::array<int64_t, K> offs{};
      fn(offs, int64_t{1}, inner);
      return;
    }
    int last = rank_ - 1;
    for (size_t k = 0; k < K; ++k) inner[k] = stride_[k][last];
    // Multi-index of `begin`.
    std::array<int64_t, kMaxRank> idx{};
    int64_t rem = begin;
    for (int d = last; d >= 0; --d) {
      idx[d] = rem % shape_[d];
      rem /= shape_[d];
    }
    std::array<int64_t, K> offs{};
    for (size_t k = 0; k < K; ++k) {
      for (int d = 0; d <= last; ++d) offs[k] += idx[d] * stride_[k][d];
    }
    // Offsets follow the multi-index incrementally: short runs (a transpose,
    // a permute) cost a few adds each, not a dot product per operand.
    int64_t pos = begin;
    while (pos < end) {
      int64_t n = std::min(shape_[last] - idx[last], end - pos);
      fn(static_cast<const std::array<int64_t, K>&>(offs), n, inner);
      pos += n;
      idx[last] += n;
      for (size_t k = 0; k < K; ++k) offs[k] += n * inner[k];
      for (int d = last; d > 0 && idx[d] == shape_[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
        for (size_t k = 0; k < K; ++k) offs[k] += stride_[k][d - 1] - shape_[d] * stride_[k][d];
      }
    }
  }

 private:
  int rank_ = 0;
  std::array<int64_t, kMaxRank> shape_{};
  std::array<std::array<int64_t, kMaxRank>, K> stride_{};
};

// The element offset of every position of `shape`, in row-major order, under
// one set of strides (the start of each row, slice or batch item of an
// operand, for kernels that visit them out of order or more than once).
inline std::vector<int64_t> position_offsets(const Shape& shape, const Strides& strides) {
  std::vector<int64_t> off(static_cast<size_t>(numel(shape)));
  Walker<1> w(shape, {&strides});
  size_t p = 0;
  w.run(0, numel(shape), [&](const std::array<int64_t, 1>& o, int64_t n, const std::array<int64_t, 1>& s) {
    for (int64_t i = 0; i < n; ++i) off[p++] = o[0] + i * s[0];
  });
  return off;
}

// Copies n elements of elem bytes, src_stride elements apart, to contiguous
// dst: one memcpy where the source is contiguous too.
inline void copy_run(char* dst, const char* src, int64_t n, int64_t src_stride, size_t elem) {
  if (src_stride == 1) {
    std::memcpy(dst, src, size_t(n) * elem);
    return;
  }
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * int64_t(elem), src + i * src_stride * int64_t(elem), elem);
}

// Copies a strided view into contiguous row-major memory. elem: element size.
void copy_strided(const void* src, const Shape& shape, const Strides& strides, size_t elem, void* dst);

}  // namespace nabla::cpu
