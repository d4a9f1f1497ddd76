// Reductions over long leading axes into few outputs (bias gradients), which
// the kernel splits into fixed blocks of rows and registers of lanes: values
// against a plain f64 loop, NaN through the block fold, and the same bits at
// any thread count, in contiguous and strided layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

Tensor random_leaf(Shape shape, uint32_t seed) {
  Tensor t = Tensor::zeros(DType::f32, shape);
  uint32_t s = seed * 2654435761u + 3;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    t.data_as<float>()[i] = (float(s >> 8) / float(1 << 24)) * 4 - 1;  // an offset mean, as gradients have
  }
  return t;
}

enum class Kind { sum, mean, max };

Tensor reduce_rows(Kind kind, const Tensor& x) {
  switch (kind) {
    case Kind::sum: return sum(x, {0});
    case Kind::mean: return mean(x, {0});
    case Kind::max: return max(x, {0});
  }
  return Tensor();
}

// x as a [rows, cols] matrix read through strides (rs, cs), folded per column in f64.
std::vector<double> reference(Kind kind, const float* x, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  std::vector<double> out(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    double acc = kind == Kind::max ? -std::numeric_limits<double>::infinity() : 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      const double v = x[i * rs + j * cs];
      acc = kind == Kind::max ? std::max(acc, v) : acc + v;
    }
    out[j] = kind == Kind::mean ? acc / double(rows) : acc;
  }
  return out;
}

}  // namespace

TEST(Reduce, LongColumnReductionsMatchAnF64LoopAtAnyThreadCount) {
  struct Case {
    int64_t rows, cols;
    bool transposed;  // x is transpose(y) of a [cols, rows] y: columns are strided
  };
  for (const Case c : {Case{2048, 96, false}, Case{777, 70, false}, Case{1576, 40, false}, Case{1100, 33, true},
                       Case{600, 8, false}, Case{5, 300, false}}) {
    Tensor y = c.transposed ? random_leaf({c.cols, c.rows}, 11) : random_leaf({c.rows, c.cols}, 11);
    Tensor x = c.transposed ? transpose(y) : y;
    const float* data = y.data_as<float>();
    const int64_t rs = c.transposed ? 1 : c.cols, cs = c.transposed ? c.rows : 1;
    for (Kind kind : {Kind::sum, Kind::mean, Kind::max}) {
      const std::string what = "kind " + std::to_string(int(kind)) + ", [" + std::to_string(c.rows) + ", " +
                               std::to_string(c.cols) + "]" + (c.transposed ? " transposed" : "");
      const std::vector<double> want = reference(kind, data, c.rows, c.cols, rs, cs);
      Tensor out = reduce_rows(kind, x);
      const std::vector<float> one = eval(out, {.threads = 1}).to_vector<float>();
      ASSERT_EQ(one.size(), want.size()) << what;
      for (size_t j = 0; j < want.size(); ++j) {
        // f64 accumulation in another order: equal up to the final rounding to f32.
        EXPECT_NEAR(one[j], want[j], 1e-6 * (std::abs(want[j]) + 1)) << what << " column " << j;
      }
      for (int threads : {2, 3}) {
        EXPECT_EQ(eval(out, {.threads = threads, .max_grain = 1}).to_vector<float>(), one) << what << ", " << threads;
        EXPECT_EQ(eval(out, {.threads = threads}).to_vector<float>(), one) << what << ", " << threads;
      }
    }
  }
}

TEST(Reduce, NaNInALaterRowBlockReachesTheMax) {
  Tensor x = random_leaf({2048, 96}, 12);
  x.data_as<float>()[1900 * 96 + 5] = std::nanf("");
  const std::vector<float> m = eval(max(x, {0}), {.threads = 2}).to_vector<float>();
  EXPECT_TRUE(std::isnan(m[5]));
  EXPECT_FALSE(std::isnan(m[4]));
  EXPECT_TRUE(std::isnan(eval(sum(x, {0}), {.threads = 2}).to_vector<float>()[5]));
}
