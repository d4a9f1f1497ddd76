// Values the gradient checks cannot see: a fused kernel and its composite
// could share a wrong constant, so forward values are compared with the
// definitions (computed in Python's math module), and the gradients at the
// kinks with PyTorch's conventions. Bad arguments throw typed errors.
#include <gtest/gtest.h>

#include <cmath>

#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"

using namespace nabla;

namespace {

std::vector<double> values(const Tensor& y) { return eval(y).to_vector<double>(); }

std::vector<double> grad_of_sum(Tensor (*f)(const Tensor&), std::vector<double> x) {
  Tensor t = Tensor::from_vector<double>({int64_t(x.size())}, x);
  return values(grad(sum(f(t)), {t})[0]);
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-14) << "entry " << i;
}

}  // namespace

TEST(ActivationValues, GeluFamilyMatchesDefinitions) {
  Tensor x = Tensor::from_vector<double>({2}, {-1.5, 1.0});
  expect_near(values(gelu(x)), {-0.10042842301976707, 0.8411919906082768});
  expect_near(values(gelu_erf(x)), {-0.10021080190328713, 0.8413447460685429});
  expect_near(values(gelu_quick(x)), {-0.10833780155292343, 0.8457957659328212});
}

TEST(ActivationValues, SoftplusEluLeakyHardswishClamp) {
  Tensor one = Tensor::from_vector<double>({1}, {1.0});
  expect_near(values(softplus(one)), {1.3132616875182228});
  expect_near(values(softplus(one, 2.0)), {1.0634640055214863});
  // Linear above the threshold: beta x = 25 > 20.
  expect_near(values(softplus(Tensor::from_vector<double>({1}, {25.0}))), {25.0});
  expect_near(values(elu(Tensor::from_vector<double>({2}, {-1.0, 2.0}), 0.5)),
              {-0.31606027941427883, 2.0});
  expect_near(values(leaky_relu(Tensor::from_vector<double>({2}, {-2.0, 3.0}))), {-0.02, 3.0});
  expect_near(values(hardswish(Tensor::from_vector<double>({4}, {-4.0, 1.0, 3.0, 5.0}))),
              {0.0, 4.0 / 6.0, 3.0, 5.0});
  expect_near(values(clamp(Tensor::from_vector<double>({3}, {-2.0, 0.25, 2.0}), -1.0, 1.0)),
              {-1.0, 0.25, 1.0});
}

TEST(ActivationValues, GradientsAtTheKinksFollowPyTorch) {
  // clamp passes the gradient at lo and hi themselves.
  expect_near(grad_of_sum([](const Tensor& x) { return clamp(x, -1.0, 1.0); }, {-1, 1, -2, 2, 0}),
              {1, 1, 0, 0, 1});
  // hardswish: x/3 + 1/2 on [-3, 3], 0 below, 1 above.
  expect_near(grad_of_sum(hardswish, {-3, 3, -3.5, 3.5}), {-0.5, 1.5, 0, 1});
  // leaky_relu and elu take the negative side's slope at 0.
  expect_near(grad_of_sum([](const Tensor& x) { return leaky_relu(x, 0.1); }, {0.0}), {0.1});
  expect_near(grad_of_sum([](const Tensor& x) { return elu(x, 0.5); }, {0.0}), {0.5});
  // softplus at beta x == threshold is still on the smooth side.
  expect_near(grad_of_sum([](const Tensor& x) { return softplus(x, 1.0, 0.0); }, {0.0, 1.0}),
              {0.5, 1.0});
}

TEST(NormValues, LayerNormAndRmsNormMatchDefinitions) {
  Tensor x = Tensor::from_vector<double>({2, 4}, {1, 2, 3, 4, 11, 12, 13, 14});
  const double a = 1.3416407864998738, b = 0.4472135954999579;
  expect_near(values(layer_norm(x, 0.0)), {-a, -b, b, a, -a, -b, b, a});
  expect_near(values(rms_norm(slice(x, 0, 0, 1), 0.0)),
              {0.3651483716701107, 0.7302967433402214, 1.0954451150103321, 1.4605934866804429});
  // Affine: per-column scale and shift.
  Tensor gamma = Tensor::from_vector<double>({4}, {1, 2, 3, 4});
  Tensor beta = Tensor::from_vector<double>({4}, {0.5, 0.5, 0.5, 0.5});
  expect_near(values(layer_norm(slice(x, 0, 0, 1), gamma, beta, 0.0)),
              {0.5 - a, 0.5 - 2 * b, 0.5 + 3 * b, 0.5 + 4 * a});
}

TEST(NormValues, BadArgumentsThrowNamingTheOp) {
  Tensor x = Tensor::zeros(DType::f32, {3, 4});
  try {
    layer_norm(x, Tensor::zeros(DType::f32, {3}), Tensor());
    FAIL() << "no error for gamma of the wrong shape";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "layer_norm: gamma must be [4] for x [3, 4], got [3]");
  }
  EXPECT_THROW(rms_norm(x, Tensor::zeros(DType::f64, {4})), DTypeError);
  EXPECT_THROW(layer_norm(x, -1.0), UsageError);
  EXPECT_THROW(rms_norm(Tensor::scalar(1.0), 1e-5), ShapeError);
  EXPECT_THROW(layer_norm_back(x, Tensor::zeros(DType::f32, {4})), ShapeError);
  EXPECT_THROW(softplus(x, 0.0), UsageError);
  EXPECT_THROW(clamp(x, NAN, 1.0), UsageError);
}
