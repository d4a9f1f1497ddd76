// dropout's mask: a function of (seed, logical position) only.
#include <gtest/gtest.h>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

std::vector<float> run_dropout(const Tensor& x, double p, const Tensor& seed,
                               ExecOptions opt = {}) {
  return eval(dropout(x, p, seed), opt).to_vector<float>();
}

TEST(Dropout, MaskIgnoresThreadsAndLayout) {
  Tensor seed = Tensor::from_vector<int32_t>({}, {1234});
  Tensor x = Tensor::full(DType::f32, {64, 33}, 1.0);
  Tensor xt = Tensor::full(DType::f32, {33, 64}, 1.0);
  std::vector<float> one = run_dropout(x, 0.3, seed, {.threads = 1});
  EXPECT_EQ(one, run_dropout(x, 0.3, seed, {.threads = 4, .max_grain = 1}));
  EXPECT_EQ(one, run_dropout(transpose(xt), 0.3, seed, {.threads = 2}));
}

TEST(Dropout, KeepsAboutOneMinusPScaled) {
  Tensor seed = Tensor::from_vector<int32_t>({1}, {7});
  std::vector<float> y = run_dropout(Tensor::full(DType::f32, {200, 500}, 1.0), 0.3, seed);
  int64_t kept = 0;
  for (float v : y) {
    if (v != 0) {
      ++kept;
      EXPECT_FLOAT_EQ(v, 1.0f / 0.7f);
    }
  }
  EXPECT_NEAR(double(kept) / double(y.size()), 0.7, 0.005);
}

TEST(Dropout, RewritingTheSeedLeafChangesTheMask) {
  Tensor seed = Tensor::from_vector<int32_t>({}, {1});
  Tensor x = Tensor::full(DType::f64, {10, 10}, 1.0);
  Tensor y = dropout(x, 0.5, seed);
  Graph g({y});
  Executor ex(g, {.threads = 2});
  ex.run();
  std::vector<double> first = ex.read<double>(y);
  seed.assign(std::vector<int32_t>{2});
  ex.run();
  EXPECT_NE(first, ex.read<double>(y));
  seed.assign(std::vector<int32_t>{1});
  ex.run();
  EXPECT_EQ(first, ex.read<double>(y));
}

TEST(Dropout, EvalModeAndZeroPAreTheIdentity) {
  Tensor seed = Tensor::from_vector<int32_t>({}, {1});
  Tensor x = Tensor::full(DType::f32, {3}, 2.0);
  EXPECT_TRUE(dropout(x, 0.5, seed, false).same(x));
  EXPECT_TRUE(dropout(x, 0.0, seed).same(x));
  EXPECT_EQ(eval(dropout(x, 1.0, seed)).to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(Dropout, RejectsBadArguments) {
  Tensor x = Tensor::full(DType::f32, {3}, 1.0);
  EXPECT_THROW(dropout(x, 1.5, Tensor::from_vector<int32_t>({}, {1})), UsageError);
  EXPECT_THROW(dropout(x, 0.5, Tensor::scalar(1.0)), DTypeError);
  EXPECT_THROW(dropout(x, 0.5, Tensor::from_vector<int32_t>({2}, {1, 2})), ShapeError);
}

}  // namespace
