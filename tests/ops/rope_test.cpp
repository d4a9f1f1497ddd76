// rope against the rotation written out by hand, in both pairings.
#include <gtest/gtest.h>

#include <cmath>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

// x [T = 2, D = 4]; pair i turns by pos * base^(-2i/D).
void expect_rope(RopeMode mode) {
  std::vector<double> x = {1, 2, 3, 4, -1, 0.5, 2, -3};
  std::vector<int32_t> pos = {3, 7};
  const double base = 100;
  std::vector<double> got = eval(rope(Tensor::from_vector<double>({2, 4}, x),
                                      Tensor::from_vector<int32_t>({2}, pos), base, mode))
                                .to_vector<double>();
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < 2; ++i) {
      double th = pos[t] * std::pow(base, -2.0 * i / 4.0);
      int a = mode == RopeMode::neox ? i : 2 * i, b = mode == RopeMode::neox ? i + 2 : 2 * i + 1;
      double xa = x[t * 4 + a], xb = x[t * 4 + b];
      EXPECT_NEAR(got[t * 4 + a], xa * std::cos(th) - xb * std::sin(th), 1e-12);
      EXPECT_NEAR(got[t * 4 + b], xa * std::sin(th) + xb * std::cos(th), 1e-12);
    }
  }
}

TEST(Rope, NeoxPairsHalves) { expect_rope(RopeMode::neox); }
TEST(Rope, OriginalPairsNeighbours) { expect_rope(RopeMode::original); }

TEST(Rope, OffsetMeansConsecutivePositions) {
  Tensor x = Tensor::from_vector<double>({3, 2}, {1, 2, 3, 4, 5, 6});
  std::vector<double> a = eval(rope(x, int64_t{5})).to_vector<double>();
  std::vector<double> b =
      eval(rope(x, Tensor::from_vector<int32_t>({3}, {5, 6, 7}))).to_vector<double>();
  EXPECT_EQ(a, b);
}

// Llama 3's scaled frequencies: pair i turns by pos * base^(-2i/D) / factor_i.
TEST(Rope, FrequencyFactorsDivideTheAngles) {
  const std::vector<double> x = {1, 2, 3, 4, -1, 0.5, 2, -3}, factors = {2.0, 8.0};
  const std::vector<int32_t> pos = {3, 7};
  const std::vector<double> got =
      eval(rope(Tensor::from_vector<double>({2, 4}, x), Tensor::from_vector<int32_t>({2}, pos), 100.0,
                RopeMode::neox, factors))
          .to_vector<double>();
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < 2; ++i) {
      const double th = pos[t] * std::pow(100.0, -2.0 * i / 4.0) / factors[i];
      const double xa = x[t * 4 + i], xb = x[t * 4 + i + 2];
      EXPECT_NEAR(got[t * 4 + i], xa * std::cos(th) - xb * std::sin(th), 1e-12);
      EXPECT_NEAR(got[t * 4 + i + 2], xa * std::sin(th) + xb * std::cos(th), 1e-12);
    }
  }
  Tensor x4 = Tensor::zeros(DType::f32, {2, 4});
  EXPECT_THROW(rope(x4, int64_t{0}, 100.0, RopeMode::neox, {1.0, 2.0, 3.0}), ShapeError);
  EXPECT_THROW(rope(x4, int64_t{0}, 100.0, RopeMode::neox, {1.0, 0.0}), UsageError);
}

// Phi-3's partial rotation: the first R = 4 of D = 6 dimensions turn (at
// base^(-2i/R)), scaled by longrope's attention factor; the last two pass
// through unscaled.
TEST(Rope, PartialRotationScalesTheRotatedPartAlone) {
  const std::vector<double> x = {1, 2, 3, 4, 5, 6, -1, 0.5, 2, -3, 7, -8}, factors = {2.0, 0.5};
  const std::vector<int32_t> pos = {3, 7};
  const double m = 1.19;
  const std::vector<double> got = eval(rope(Tensor::from_vector<double>({2, 6}, x), Tensor::from_vector<int32_t>({2}, pos),
                                            100.0, RopeMode::neox, factors, 4, m))
                                      .to_vector<double>();
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < 2; ++i) {
      const double th = pos[t] * std::pow(100.0, -2.0 * i / 4.0) / factors[i];
      const double xa = x[t * 6 + i], xb = x[t * 6 + i + 2];
      EXPECT_NEAR(got[t * 6 + i], m * (xa * std::cos(th) - xb * std::sin(th)), 1e-12);
      EXPECT_NEAR(got[t * 6 + i + 2], m * (xa * std::sin(th) + xb * std::cos(th)), 1e-12);
    }
    EXPECT_EQ(got[t * 6 + 4], x[t * 6 + 4]);
    EXPECT_EQ(got[t * 6 + 5], x[t * 6 + 5]);
  }
  const Tensor x6 = Tensor::zeros(DType::f32, {2, 6});
  EXPECT_THROW(rope(x6, int64_t{0}, 100.0, RopeMode::neox, {1.0, 2.0, 3.0}, 4), ShapeError);  // R/2 factors
  EXPECT_THROW(rope(x6, int64_t{0}, 100.0, RopeMode::neox, {}, 3), ShapeError);               // odd
  EXPECT_THROW(rope(x6, int64_t{0}, 100.0, RopeMode::neox, {}, 8), ShapeError);               // past D
  EXPECT_THROW(rope(x6, int64_t{0}, 100.0, RopeMode::neox, {}, -2), UsageError);
  EXPECT_THROW(rope(x6, int64_t{0}, 100.0, RopeMode::neox, {}, 4, 0.0), UsageError);
}

TEST(Rope, RejectsBadShapes) {
  EXPECT_THROW(rope(Tensor::zeros(DType::f32, {2, 3}), int64_t{0}), ShapeError);
  EXPECT_THROW(
      rope(Tensor::zeros(DType::f32, {2, 4}), Tensor::from_vector<int32_t>({3}, {0, 1, 2})),
      ShapeError);
}

}  // namespace
