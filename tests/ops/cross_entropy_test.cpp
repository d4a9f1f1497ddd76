// cross_entropy's values and its run-time label check.
#include <gtest/gtest.h>

#include <cmath>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

TEST(CrossEntropy, MatchesHandComputedValue) {
  Tensor logits = Tensor::from_vector<double>({3, 3}, {1, 2, 3, 1, 1, 1, 0, 5, -2});
  Tensor labels = Tensor::from_vector<int32_t>({3}, {2, 0, -100});
  double row0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  double row1 = std::log(3.0);
  EXPECT_NEAR(eval(cross_entropy(logits, labels)).item(), (row0 + row1) / 2, 1e-12);
  // Leading axes are rows too.
  Tensor l3 = reshape(Tensor::from_vector<double>({1, 2, 3}, {1, 2, 3, 1, 1, 1}), {1, 2, 3});
  Tensor lab3 = Tensor::from_vector<int32_t>({1, 2}, {2, 0});
  EXPECT_NEAR(eval(cross_entropy(l3, lab3)).item(), (row0 + row1) / 2, 1e-12);
}

TEST(CrossEntropy, AllRowsIgnoredGivesZeroAndZeroGradient) {
  Tensor logits = Tensor::from_vector<double>({2, 3}, {1, 2, 3, 4, 5, 6}).requires_grad();
  Tensor labels = Tensor::from_vector<int32_t>({2}, {-1, -1});
  Tensor loss = cross_entropy(logits, labels, -1);
  std::vector<Tensor> out = eval({loss, grad(loss, {logits})[0]});
  EXPECT_EQ(out[0].item(), 0.0);
  for (double g : out[1].to_vector<double>()) EXPECT_EQ(g, 0.0);
}

TEST(CrossEntropy, SoftTargetsOfAOneHotMatchTheHardLoss) {
  Tensor logits = Tensor::from_vector<double>({2, 3}, {0.5, -1, 2, 3, 0, 1});
  Tensor labels = Tensor::from_vector<int32_t>({2}, {1, 0});
  Tensor probs = Tensor::from_vector<double>({2, 3}, {0, 1, 0, 1, 0, 0});
  EXPECT_NEAR(eval(cross_entropy_soft(logits, probs)).item(),
              eval(cross_entropy(logits, labels)).item(), 1e-12);
}

TEST(CrossEntropy, OutOfRangeLabelNamesOpLabelAndRow) {
  Tensor logits = Tensor::zeros(DType::f32, {3, 4});
  Tensor labels = Tensor::from_vector<int32_t>({3}, {0, 4, 1});
  try {
    eval(cross_entropy(logits, labels));
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cross_entropy"), std::string::npos) << m;
    EXPECT_NE(m.find("label 4"), std::string::npos) << m;
    EXPECT_NE(m.find("row 1"), std::string::npos) << m;
  }
  EXPECT_THROW(cross_entropy(logits, Tensor::from_vector<int32_t>({2}, {0, 1})), ShapeError);
  EXPECT_THROW(cross_entropy(logits, Tensor::zeros(DType::f32, {3})), DTypeError);
}

}  // namespace
