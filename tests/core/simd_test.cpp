// The f32 SIMD functions against the f64 std:: ones, at the error bounds
// src/backend/cpu/simd.h documents, and on the special values.
#include "backend/cpu/simd.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace nabla::cpu {
namespace {

// Every 701st float in [lo, hi] (by bit pattern order), f applied per vector.
template <class F>
std::vector<std::pair<float, float>> sweep(float lo, float hi, F f) {
  auto key = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  };
  auto unkey = [](uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  };
  std::vector<float> xs;
  for (uint64_t k = key(lo); k <= key(hi); k += 701) xs.push_back(unkey(static_cast<uint32_t>(k)));
  xs.push_back(hi);
  std::vector<float> ys(xs.size());
  map(ys.data(), xs.data(), 1, static_cast<int64_t>(xs.size()), f);
  std::vector<std::pair<float, float>> out;
  for (size_t i = 0; i < xs.size(); ++i) out.emplace_back(xs[i], ys[i]);
  return out;
}

// Max of |got - want| / max(|want|, floor).
template <class F, class R>
double max_error(float lo, float hi, F f, R ref, double floor) {
  double worst = 0;
  for (auto [x, y] : sweep(lo, hi, f)) {
    const double want = ref(double(x));
    worst = std::max(worst, std::abs(double(y) - want) / std::max(std::abs(want), floor));
  }
  return worst;
}

constexpr double kTiny = 1e-300;  // a floor that makes the error relative

TEST(Simd, ExpRelativeError) {
  auto f = [](VecF x) { return exp(x); };
  auto ref = [](double x) { return std::exp(x); };
  EXPECT_LT(max_error(-87.0f, 88.72f, f, ref, kTiny), 1e-7);
  // Subnormal results: absolute.
  EXPECT_LT(max_error(-110.0f, -87.0f, f, ref, 1.0), 2e-45);
}

TEST(Simd, ExpNonpositiveMatchesExp) {
  auto f = [](VecF x) { return exp_nonpositive(x); };
  auto ref = [](double x) { return std::exp(x); };
  EXPECT_LT(max_error(-87.0f, 0.0f, f, ref, kTiny), 1e-7);
  EXPECT_LT(max_error(-110.0f, -87.0f, f, ref, 1.0), 2e-45);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {std::numeric_limits<float>::quiet_NaN(), -inf, 0.0f, -0.0f, -104.0f, -1e30f};
  std::vector<float> e(x.size()), want(x.size());
  map(e.data(), x.data(), 1, int64_t(x.size()), [](VecF v) { return exp_nonpositive(v); });
  map(want.data(), x.data(), 1, int64_t(x.size()), [](VecF v) { return exp(v); });
  EXPECT_TRUE(std::isnan(e[0]));
  for (size_t i = 1; i < x.size(); ++i) EXPECT_EQ(e[i], want[i]) << "x = " << x[i];
  EXPECT_EQ(e[1], 0.0f);
  EXPECT_EQ(e[2], 1.0f);
}

TEST(Simd, TanhRelativeError) {
  EXPECT_LT(max_error(
                -20.0f, 20.0f, [](VecF x) { return tanh(x); },
                [](double x) { return std::tanh(x); }, kTiny),
            2e-7);
}

TEST(Simd, ErfError) {
  auto f = [](VecF x) { return erf(x); };
  auto ref = [](double x) { return std::erf(x); };
  EXPECT_LT(max_error(1e-30f, 10.0f, f, ref, kTiny), 5e-7);
  EXPECT_LT(max_error(-10.0f, -1e-30f, f, ref, kTiny), 5e-7);
}

TEST(Simd, SigmoidPairRelativeError) {
  auto ref = [](double x) { return 1 / (1 + std::exp(-x)); };
  EXPECT_LT(max_error(
                -87.0f, 87.0f, [](VecF x) { return sigmoid_pair(x).s; }, ref, kTiny),
            2.5e-7);
  EXPECT_LT(max_error(
                -87.0f, 87.0f, [](VecF x) { return sigmoid_pair(x).one_minus_s; },
                [&](double x) { return ref(-x); }, kTiny),
            2.5e-7);
}

TEST(Simd, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {nan, inf, -inf, 0.0f, 89.0f, -104.0f, 1e30f, -1e30f};
  std::vector<float> e(x.size()), t(x.size()), r(x.size()), s(x.size());
  map(e.data(), x.data(), 1, 8, [](VecF v) { return exp(v); });
  map(t.data(), x.data(), 1, 8, [](VecF v) { return tanh(v); });
  map(r.data(), x.data(), 1, 8, [](VecF v) { return erf(v); });
  map(s.data(), x.data(), 1, 8, [](VecF v) { return sigmoid(v); });
  EXPECT_TRUE(std::isnan(e[0]) && std::isnan(t[0]) && std::isnan(r[0]) && std::isnan(s[0]));
  EXPECT_EQ(e[1], inf);
  EXPECT_EQ(e[2], 0.0f);
  EXPECT_EQ(e[3], 1.0f);
  EXPECT_EQ(e[4], inf);
  EXPECT_EQ(e[5], 0.0f);
  EXPECT_EQ(t[1], 1.0f);
  EXPECT_EQ(t[2], -1.0f);
  EXPECT_EQ(t[3], 0.0f);
  EXPECT_EQ(r[6], 1.0f);
  EXPECT_EQ(r[7], -1.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(s[2], 0.0f);
  EXPECT_EQ(s[3], 0.5f);
}

// A strided or partial (tail) vector gives the same bits as a full one.
TEST(Simd, LayoutDoesNotChangeBits) {
  std::vector<float> x(3 * 37);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.37f * float(i) - 20.0f;
  auto f = [](VecF v) { return erf(v) + exp(v) * tanh(v); };
  std::vector<float> flat(x.size()), strided(37);
  map(flat.data(), x.data(), 1, static_cast<int64_t>(x.size()), f);
  map(strided.data(), x.data(), 3, 37, f);
  for (int i = 0; i < 37; ++i) EXPECT_EQ(strided[i], flat[3 * i]) << i;
}

TEST(Simd, Reductions) {
  std::vector<float> x(45);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) + 1e6f;
  // Sum of (1e6 + i)^2, i < 45: exact in f64.
  EXPECT_DOUBLE_EQ(sum_squares_f64(x.data(), 45), 45e12 + 2e6 * 990 + 29370);
  const float s =
      sum_lanes(45, [&](int64_t i, int64_t n) { return VecF::load(x.data() + i, 1, n) - 1e6f; });
  EXPECT_EQ(s, 990.0f);
  // Several sums at once, each with sum_lanes' bits (lengths with and
  // without a tail).
  for (int64_t n : {45, 32, 7}) {
    const std::array<float, 3> three = sum_lanes_rows<3>(n, [&](int r, int64_t i, int64_t m) {
      return VecF::load(x.data() + i, 1, m) * float(r + 1) - 1e6f;
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(three[r], sum_lanes(n, [&](int64_t i, int64_t m) {
                  return VecF::load(x.data() + i, 1, m) * float(r + 1) - 1e6f;
                })) << n << " row " << r;
    }
  }
}

// reduce_add_each: each vector's reduce_add, bit for bit, for every count it
// runs together (and one it does not), on values whose sums round
// differently in any other order.
template <int R>
void expect_reduce_add_each(std::mt19937& rng) {
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (int trial = 0; trial < 200; ++trial) {
    std::array<VecF, R> v;
    for (int r = 0; r < R; ++r) {
      float lanes[VecF::kWidth];
      for (float& l : lanes) l = std::ldexp(mantissa(rng), exponent(rng)) * (rng() % 2 ? 1.0f : -1.0f);
      v[r] = VecF::load(lanes);
    }
    const std::array<float, R> each = reduce_add_each<R>(v);
    for (int r = 0; r < R; ++r) {
      const float one = reduce_add(v[r]);
      ASSERT_EQ(std::memcmp(&each[r], &one, sizeof one), 0) << R << " vectors, vector " << r << ": " << each[r]
                                                            << " against " << one;
    }
  }
}

TEST(Simd, ReduceAddEachMatchesReduceAdd) {
  std::mt19937 rng(11);
  expect_reduce_add_each<1>(rng);
  expect_reduce_add_each<2>(rng);
  expect_reduce_add_each<3>(rng);
  expect_reduce_add_each<4>(rng);
  expect_reduce_add_each<8>(rng);
  expect_reduce_add_each<16>(rng);
}

}  // namespace
}  // namespace nabla::cpu
