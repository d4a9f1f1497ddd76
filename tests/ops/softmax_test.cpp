// softmax's masking conventions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

TEST(Softmax, CausalLastQuerySeesEveryKey) {
  // Tq = 2, Tk = 3: query 0 sees keys 0..1, query 1 sees all.
  Tensor x = Tensor::zeros(DType::f64, {2, 3});
  std::vector<double> y = eval(softmax(x, 1.0, Tensor(), true)).to_vector<double>();
  std::vector<double> want = {0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3};
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-15) << i;
}

TEST(Softmax, LargeInputsDoNotOverflow) {
  Tensor x = Tensor::from_vector<float>({3}, {1000, 1001, 1002});
  std::vector<float> y = eval(softmax(x)).to_vector<float>();
  double e1 = std::exp(-1.0), e2 = std::exp(-2.0);
  EXPECT_NEAR(y[2], 1 / (1 + e1 + e2), 1e-6);
  std::vector<float> l = eval(log_softmax(x)).to_vector<float>();
  EXPECT_NEAR(l[2], -std::log(1 + e1 + e2), 1e-5);
}

TEST(Softmax, FullyMaskedRowIsNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = Tensor::zeros(DType::f64, {2, 2});
  Tensor mask = Tensor::from_vector<double>({2, 2}, {0, -inf, -inf, -inf});
  std::vector<double> y = eval(softmax(x, 1.0, mask)).to_vector<double>();
  EXPECT_EQ(y[0], 1.0);
  EXPECT_EQ(y[1], 0.0);
  EXPECT_TRUE(std::isnan(y[2]) && std::isnan(y[3]));
}

TEST(Softmax, RejectsAMaskThatDoesNotBroadcast) {
  Tensor x = Tensor::zeros(DType::f32, {2, 3});
  EXPECT_THROW(softmax(x, 1.0, Tensor::zeros(DType::f32, {2, 3, 3})), ShapeError);
  EXPECT_THROW(softmax(x, 1.0, Tensor::zeros(DType::f64, {3})), DTypeError);
  EXPECT_THROW(softmax(Tensor::zeros(DType::f32, {3}), 1.0, Tensor(), true), ShapeError);
}

}  // namespace
