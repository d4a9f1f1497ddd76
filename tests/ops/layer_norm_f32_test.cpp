// The f32 layer norm kernels (rows handled kRowBlock at a time, statistics in
// one sweep or by the corrected two-pass algorithm in f32 lanes) against the
// f64 kernels on the same values. The gradient checks run in f64 only, so
// this is where the f32 paths meet every layout: blocks cut short at the end
// of a parallel chunk, gathered strided rows, a broadcast dy, and rows with a
// large common offset (the two passes), where a mean that lost digits would
// show.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"

using namespace nabla;

namespace {

// The same values as an f64 and an f32 tensor (f32-representable).
struct Pair {
  Tensor f64, f32;
};

Pair random_pair(Shape shape, double offset, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(numel(shape)));
  for (float& x : v) x = float(offset) + dist(rng);
  return {Tensor::from_vector<double>(shape, std::vector<double>(v.begin(), v.end())),
          Tensor::from_vector<float>(shape, v)};
}

enum class Layout { contiguous, transposed, strided };

// x [rows, cols] in the given layout: a transposed [cols, rows] tensor, or
// every other column of [rows, 2 cols].
Pair make_x(Layout layout, int64_t rows, int64_t cols, double offset, uint32_t seed) {
  switch (layout) {
    case Layout::contiguous:
      return random_pair({rows, cols}, offset, seed);
    case Layout::transposed: {
      Pair p = random_pair({cols, rows}, offset, seed);
      return {transpose(p.f64), transpose(p.f32)};
    }
    case Layout::strided: {
      Pair p = random_pair({rows, 2 * cols}, offset, seed);
      return {slice(p.f64, 1, 0, 2 * cols, 2), slice(p.f32, 1, 0, 2 * cols, 2)};
    }
  }
  return {};
}

using Op = std::function<Tensor(const std::vector<Tensor>&)>;

// op on the f32 inputs at 1, 2 and 3 threads (bit-identical) within tol of op
// on the f64 inputs, element by element.
void expect_f32_matches_f64(const Op& op, const std::vector<Pair>& in, double tol, const std::string& what) {
  std::vector<Tensor> in64, in32;
  for (const Pair& p : in) in64.push_back(p.f64), in32.push_back(p.f32);
  const std::vector<double> want = eval(op(in64)).to_vector<double>();
  const Tensor y32 = op(in32);
  const std::vector<float> got = eval(y32, {.threads = 1}).to_vector<float>();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " element " << i;
  }
  for (int threads : {2, 3}) {
    EXPECT_EQ(eval(y32, {.threads = threads}).to_vector<float>(), got) << what << ", " << threads << " threads";
  }
}

}  // namespace

TEST(LayerNormF32, MatchesF64InEveryLayoutAndBlock) {
  // Rows: fewer than a block, a block and one more, and 300 rows of 96, which
  // are two parallel chunks of 170 and 130 rows: blocks end short mid-tensor.
  struct Size {
    int64_t rows, cols;
  };
  const Size sizes[] = {{1, 5}, {3, 17}, {5, 16}, {9, 1}, {300, 96}, {37, 192}};
  for (const Size s : sizes) {
    for (Layout layout : {Layout::contiguous, Layout::transposed, Layout::strided}) {
      for (double offset : {0.0, 100.0}) {
        const std::string what = std::to_string(s.rows) + "x" + std::to_string(s.cols) + " layout " +
                                 std::to_string(int(layout)) + " offset " + std::to_string(offset);
        const uint32_t seed = uint32_t(s.rows * 131 + s.cols);
        const Pair x = make_x(layout, s.rows, s.cols, offset, seed);
        const Pair dy = make_x(Layout::contiguous, s.rows, s.cols, 0.0, seed + 1);
        const Pair addend = make_x(layout, s.rows, s.cols, 0.0, seed + 5);
        const Pair gamma = random_pair({s.cols}, 1.0, seed + 2), beta = random_pair({s.cols}, 0.0, seed + 3);
        // A broadcast dy: one row for all (strides 0 along the rows).
        const Pair row = random_pair({1, s.cols}, 0.0, seed + 4);
        const Pair dy_broadcast{expand(row.f64, {s.rows, s.cols}), expand(row.f32, {s.rows, s.cols})};
        // xhat is off by f32 rounding of x and of the mean, relative to the
        // row's spread: about 1e-7 (1 + offset) here, and a few rows of 5 or
        // 16 values spread little. A wrong row or block is off by O(1).
        const double tol = 2e-6 * (1 + offset);
        expect_f32_matches_f64([](const std::vector<Tensor>& v) { return layer_norm(v[0], 1e-5); }, {x},
                               tol, "layer_norm " + what);
        expect_f32_matches_f64(
            [](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2], 1e-5); }, {x, gamma, beta},
            tol, "layer_norm_affine " + what);
        for (const Pair& d : {dy, dy_broadcast}) {
          expect_f32_matches_f64([](const std::vector<Tensor>& v) { return layer_norm_back(v[0], v[1], 1e-5); },
                                 {x, d}, tol, "layer_norm_back " + what);
          expect_f32_matches_f64(
              [](const std::vector<Tensor>& v) { return layer_norm_affine_back(v[0], v[1], v[2], 1e-5); },
              // 4x: dgamma and dbeta are sums over up to 300 rows, each
              // term carrying xhat's error.
              {x, d, gamma}, tol * 4, "layer_norm_affine_back " + what);
          // The residual's gradient added to dx, laid out as x is.
          expect_f32_matches_f64(
              [](const std::vector<Tensor>& v) { return layer_norm_affine_back(v[0], v[1], v[2], 1e-5, v[3]); },
              {x, d, gamma, addend}, tol * 4, "layer_norm_affine_back_add " + what);
        }
      }
    }
  }
}

// With a large common offset the mean is where f32 loses digits: a mean from
// f32 lane sums alone is off by several ulps of the offset, which xhat shows
// divided by the row's spread (1 here). The corrected two-pass mean is within
// about one rounding of it.
TEST(LayerNormF32, StatisticsKeepALargeOffset) {
  for (int64_t cols : {96, 192, 768}) {
    for (double offset : {100.0, 1000.0}) {
      const Pair x = random_pair({64, cols}, offset, uint32_t(cols));
      const std::vector<double> want = eval(layer_norm(x.f64, 1e-5)).to_vector<double>();
      const std::vector<float> got = eval(layer_norm(x.f32, 1e-5)).to_vector<float>();
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
      EXPECT_LT(worst, 6e-8 * offset) << cols << " columns, offset " << offset;
    }
  }
}

// Rows that no single stride reaches (two outer axes swapped, [5, 3, C] from
// a [3, 5, C] tensor) take the general walk over the rows rather than the
// plain loop; 15 rows end in a short block.
TEST(LayerNormF32, MatchesF64WithRowsInPermutedOrder) {
  for (int64_t cols : {16, 40}) {
    const std::string what = std::to_string(cols) + " columns";
    Pair x = random_pair({3, 5, cols}, 10.0, uint32_t(cols));
    x = {transpose(x.f64, 0, 1), transpose(x.f32, 0, 1)};
    Pair dy = random_pair({3, 5, cols}, 0.0, uint32_t(cols) + 1);
    dy = {transpose(dy.f64, 0, 1), transpose(dy.f32, 0, 1)};
    const Pair gamma = random_pair({cols}, 1.0, 7), beta = random_pair({cols}, 0.0, 8);
    const double tol = 2e-6 * (1 + 10.0);  // the rule of the first test, at offset 10
    expect_f32_matches_f64([](const std::vector<Tensor>& v) { return layer_norm(v[0], 1e-5); }, {x}, tol,
                           "layer_norm " + what);
    expect_f32_matches_f64([](const std::vector<Tensor>& v) { return layer_norm(v[0], v[1], v[2], 1e-5); },
                           {x, gamma, beta}, tol, "layer_norm_affine " + what);
    expect_f32_matches_f64([](const std::vector<Tensor>& v) { return layer_norm_back(v[0], v[1], 1e-5); }, {x, dy},
                           tol, "layer_norm_back " + what);
  }
}

// Rows whose mean is near their spread (mean^2 about var): blocks of them
// take the one sweep or, where a row's mean^2 exceeds its var, the two
// passes, both within a few roundings of f64; and one massive column
// (1000 against N(0, 1)), where the one sweep's sums are far from the
// mean's, as in a transformer's outlier features.
TEST(LayerNormF32, OneSweepStatisticsKeepTheirAccuracy) {
  for (int64_t cols : {96, 768}) {
    for (double offset : {0.9, 1.0, 1.1}) {
      const std::string what = std::to_string(cols) + " columns, offset " + std::to_string(offset);
      const Pair x = random_pair({64, cols}, offset, uint32_t(cols + 7));
      const Pair dy = random_pair({64, cols}, 0.5, uint32_t(cols + 8));
      const Pair gamma = random_pair({cols}, 1.0, 9);
      // A quarter of the first test's 2e-6 (1 + offset) at offset 1 (here
      // and for the massive column below): xhat is off by f32 roundings of x
      // and the mean, about 2e-7; dgamma and dbeta, sums over 64 rows, 4x
      // that, as in the first test.
      expect_f32_matches_f64([](const std::vector<Tensor>& v) { return layer_norm(v[0], 1e-5); }, {x}, 1e-6,
                             "layer_norm " + what);
      expect_f32_matches_f64([](const std::vector<Tensor>& v) { return layer_norm_back(v[0], v[1], 1e-5); }, {x, dy},
                             1e-6, "layer_norm_back " + what);
      expect_f32_matches_f64(
          [](const std::vector<Tensor>& v) { return layer_norm_affine_back(v[0], v[1], v[2], 1e-5); }, {x, dy, gamma},
          4e-6, "layer_norm_affine_back " + what);
    }
    std::vector<float> v(size_t(64 * cols));
    std::mt19937 rng{uint32_t(cols)};
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (size_t i = 0; i < v.size(); ++i) v[i] = (i % size_t(cols) == 5 ? 1000.0f : 0.0f) + dist(rng);
    const Pair x{Tensor::from_vector<double>({64, cols}, std::vector<double>(v.begin(), v.end())),
                 Tensor::from_vector<float>({64, cols}, v)};
    const Pair dy = random_pair({64, cols}, 0.5, uint32_t(cols + 10));
    expect_f32_matches_f64([](const std::vector<Tensor>& v) { return layer_norm(v[0], 1e-5); }, {x}, 1e-6,
                           "layer_norm, a massive column of " + std::to_string(cols));
    expect_f32_matches_f64([](const std::vector<Tensor>& v) { return layer_norm_back(v[0], v[1], 1e-5); }, {x, dy},
                           1e-6, "layer_norm_back, a massive column of " + std::to_string(cols));
  }
}

// A row's result does not depend on the rows it shares a block with: rows
// taking the one sweep and rows taking the two passes (a large offset),
// mixed in blocks, give the bits each gives alone.
TEST(LayerNormF32, ARowsResultIsItsOwn) {
  const int64_t rows = 9, cols = 40;
  std::vector<float> v(size_t(rows * cols)), d(v.size());
  std::mt19937 rng{3};
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = (i / cols % 3 == 1 ? 100.0f : 0.0f) + dist(rng);
    d[i] = dist(rng);
  }
  const Tensor x = Tensor::from_vector<float>({rows, cols}, v), dy = Tensor::from_vector<float>({rows, cols}, d);
  const std::vector<float> y = eval(layer_norm(x, 1e-5)).to_vector<float>();
  const std::vector<float> dx = eval(layer_norm_back(x, dy, 1e-5)).to_vector<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const Tensor xr = slice(x, 0, r, r + 1), dyr = slice(dy, 0, r, r + 1);
    const std::vector<float> yr = eval(layer_norm(xr, 1e-5)).to_vector<float>();
    const std::vector<float> dxr = eval(layer_norm_back(xr, dyr, 1e-5)).to_vector<float>();
    EXPECT_EQ(yr, std::vector<float>(y.begin() + r * cols, y.begin() + (r + 1) * cols)) << "layer_norm row " << r;
    EXPECT_EQ(dxr, std::vector<float>(dx.begin() + r * cols, dx.begin() + (r + 1) * cols)) << "layer_norm_back row " << r;
  }
}
