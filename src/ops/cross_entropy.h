// Shared by cross_entropy and cross_entropy_back: reading the labels, and
// the one-hot targets their composites use.
#pragma once

#include <algorithm>
#include <limits>

#include "backend/cpu/simd.h"
#include "backend/cpu/strided.h"
#include "core/op.h"

namespace nabla::ops {

// An f32 row's max and sum of e^(x - max), on cpu::VecF (x contiguous):
// f32 lanes summed in blocks of 1024 elements, the blocks added in f64, so a
// 50K-class row keeps f32's accuracy. A NaN in x makes the sum NaN.
struct ExpSum {
  float max;
  double total;
};
inline ExpSum exp_sum_f32(const float* x, int64_t n) {
  using cpu::VecF;
  constexpr int W = VecF::kWidth;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  VecF vmax = kNegInf;
  for (int64_t j = 0; j < n; j += W) {
    const int64_t m = std::min<int64_t>(W, n - j);
    vmax = cpu::max(vmax, cpu::select(cpu::first_lanes(m), VecF::load(x + j, 1, m), kNegInf));
  }
  const float mx = cpu::reduce_max(vmax);
  double total = 0;
  for (int64_t b = 0; b < n; b += 1024) {
    const float* xb = x + b;
    total += cpu::sum_lanes(std::min<int64_t>(1024, n - b), [&](int64_t i, int64_t m) {
      return cpu::exp_nonpositive(VecF::load(xb + i, 1, m) - mx);
    });
  }
  return {mx, total};
}

// The i32 labels, one per row in row-major order. A label must be
// ignore_index or in [0, classes): anything else is a user error naming the
// op, the label and its row (flat position in labels).
inline std::vector<int32_t> read_labels(const char* op, const TensorView& labels, int64_t classes,
                                        int64_t ignore_index) {
  std::vector<int32_t> v(static_cast<size_t>(labels.numel()));
  cpu::copy_strided(labels.data, labels.shape, labels.strides, sizeof(int32_t), v.data());
  for (size_t n = 0; n < v.size(); ++n) {
    if (v[n] != ignore_index && (v[n] < 0 || v[n] >= classes)) {
      throw ShapeError(std::string(op) + ": label " + std::to_string(v[n]) + " at row " +
                       std::to_string(n) + " is out of range for " + std::to_string(classes) +
                       " classes (ignore_index is " + std::to_string(ignore_index) + ")");
    }
  }
  return v;
}

// [..., classes] one-hot targets in primitive ops, all-zero on ignored rows.
// one_hot already zeroes labels outside [0, classes); an ignore_index inside
// that range is dropped by zeroing its column.
inline Tensor target_one_hot(const Tensor& labels, int64_t classes, int64_t ignore_index,
                             DType dtype) {
  Tensor oh = one_hot(labels, classes, dtype);
  if (ignore_index < 0 || ignore_index >= classes) return oh;
  Tensor keep = Tensor::full(dtype, {classes}, 1.0);
  if (dtype == DType::f32)
    keep.data_as<float>()[ignore_index] = 0;
  else
    keep.data_as<double>()[ignore_index] = 0;
  return oh * keep;
}

// Rows that count towards the mean, clamped to 1 so that a batch with every
// row ignored has loss 0 and gradient 0 (PyTorch returns NaN there).
inline Tensor valid_count(const Tensor& target) {
  Tensor count = sum(target);
  return count + eq(count, scalar_like(0.0, count));
}

}  // namespace nabla::ops
