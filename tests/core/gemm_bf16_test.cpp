// gemm_bf16 (operands rounded to bfloat16, f32 accumulation) against long
// double references, and round_to_bf16 on its own.
//
// Tolerances, with u = 2^-24 (f32 unit roundoff) and n = K + 2. A product of
// two bf16 values (8 significant bits each) is exact in f32, so against the
// reference of the rounded operands only the f32 sums and the alpha/beta
// update round: at most n roundings on the way of any product, hence
//   |C - ref_rounded| <= gamma_n * (|alpha| * sum_k |a~_ik b~_kj| + |beta * c_ij|),
// gamma_n = n u / (1 - n u) and a~ = round_to_bf16(a). This is tight enough
// that a kernel that skipped the rounding (errors ~2^-8 relative) fails it.
// Against the unrounded operands each one also moves by up to 2^-8 relative,
// so the product by up to 2^-7 + 2^-16:
//   |C - ref| <= |alpha| * ((2^-7 + 2^-16) * sum_k |a_ik b_kj| + gamma_n * sum_k |a~_ik b~_kj|)
//                + gamma_n * |beta * c_ij|.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"

#include "gemm_matrix.h"

namespace nabla::cpu {
namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

using Matrix = testing_support::Matrix<float>;

Matrix random_matrix(int64_t rows, int64_t cols, int64_t pad, std::mt19937& rng) {
  return testing_support::random_matrix<float>(rows, cols, pad, rng);
}

// One problem: C = alpha * op(A) op(B) + beta * C0, run by gemm_bf16.
struct Problem : testing_support::Problem<float> {
  using testing_support::Problem<float>::Problem;
  Matrix run() const { return testing_support::Problem<float>::run(&gemm_bf16); }
};

// Both references of every element with their bounds (see the top of the file).
struct Reference {
  std::vector<long double> rounded, rounded_bound, exact, exact_bound;
};

Reference reference(const Problem& p) {
  const long double u = std::ldexp(1.0L, -24);
  const long double n = static_cast<long double>(p.K + 2);
  const long double gamma = n * u / (1 - n * u);
  const long double operand_error = std::ldexp(1.0L, -7) + std::ldexp(1.0L, -16);
  const long double alpha = std::fabs(static_cast<long double>(p.alpha));
  Reference r;
  for (auto* v : {&r.rounded, &r.rounded_bound, &r.exact, &r.exact_bound}) v->resize(p.M * p.N);
  // op(A) [M, K] and op(B)^T [N, K], as given and rounded.
  std::vector<float> a(p.M * p.K), bt(p.N * p.K), ar(p.M * p.K), btr(p.N * p.K);
  for (int64_t k = 0; k < p.K; ++k) {
    for (int64_t i = 0; i < p.M; ++i) ar[i * p.K + k] = round_to_bf16(a[i * p.K + k] = p.a(i, k));
    for (int64_t j = 0; j < p.N; ++j) btr[j * p.K + k] = round_to_bf16(bt[j * p.K + k] = p.b(k, j));
  }
  for (int64_t i = 0; i < p.M; ++i) {
    for (int64_t j = 0; j < p.N; ++j) {
      long double sum = 0, abs_sum = 0, sum_r = 0, abs_sum_r = 0;
      for (int64_t k = 0; k < p.K; ++k) {
        const long double prod = static_cast<long double>(a[i * p.K + k]) * bt[j * p.K + k];
        const long double prod_r = static_cast<long double>(ar[i * p.K + k]) * btr[j * p.K + k];
        sum += prod;
        abs_sum += std::fabs(prod);
        sum_r += prod_r;
        abs_sum_r += std::fabs(prod_r);
      }
      const long double bc =
          p.beta == 0.0f ? 0.0L : static_cast<long double>(p.beta) * p.C0.at(i, j);
      const int64_t e = i * p.N + j;
      r.rounded[e] = static_cast<long double>(p.alpha) * sum_r + bc;
      r.rounded_bound[e] = gamma * (alpha * abs_sum_r + std::fabs(bc));
      r.exact[e] = static_cast<long double>(p.alpha) * sum + bc;
      r.exact_bound[e] =
          alpha * (operand_error * abs_sum + gamma * abs_sum_r) + gamma * std::fabs(bc);
    }
  }
  return r;
}

// Every element within both bounds, and C's padding untouched.
testing::AssertionResult matches(const Problem& p, const Reference& r, const Matrix& C) {
  for (int64_t i = 0; i < p.M; ++i) {
    for (int64_t j = 0; j < p.N; ++j) {
      const long double got = C.at(i, j);
      const int64_t e = i * p.N + j;
      const struct {
        const char* name;
        long double value, bound;
      } refs[] = {{"rounded", r.rounded[e], r.rounded_bound[e]},
                  {"exact", r.exact[e], r.exact_bound[e]}};
      for (const auto& ref : refs) {
        if (!(std::fabs(got - ref.value) <= ref.bound)) {
          return testing::AssertionFailure()
                 << p.describe() << ": C[" << i << ", " << j << "] = " << static_cast<double>(got)
                 << ", expected (" << ref.name << " operands) " << static_cast<double>(ref.value)
                 << " +- " << static_cast<double>(ref.bound);
        }
      }
    }
    for (int64_t j = p.N; j < C.ld && i * C.ld + j < static_cast<int64_t>(C.data.size()); ++j) {
      if (std::memcmp(&C.at(i, j), &p.C0.at(i, j), sizeof(float)) != 0) {
        return testing::AssertionFailure()
               << p.describe() << ": padding of C written at [" << i << ", " << j << "]";
      }
    }
  }
  return testing::AssertionSuccess();
}

void check(const Problem& p) { EXPECT_TRUE(matches(p, reference(p), p.run())); }

constexpr int64_t kOddSizes[] = {1, 7, 33, 65, 130};
constexpr bool kBools[] = {false, true};

TEST(RoundToBf16, ExactValuesUnchanged) {
  for (float x : {0.0f, 1.0f, -1.0f, 0.5f, 1.0078125f, -3.0f, 256.0f, 1e-30f, 3.0e38f}) {
    const float r = round_to_bf16(from_bits(to_bits(x) & 0xFFFF0000u));
    EXPECT_EQ(to_bits(r), to_bits(x) & 0xFFFF0000u) << x;
  }
  EXPECT_EQ(to_bits(round_to_bf16(-0.0f)), 0x80000000u);
  EXPECT_EQ(to_bits(round_to_bf16(from_bits(0x7F7F0000u))), 0x7F7F0000u);  // largest bf16
}

TEST(RoundToBf16, TiesToEven) {
  // Near 1 the bf16 spacing is 2^-7: 1 + 2^-8 lies halfway between 1 (even)
  // and 1 + 2^-7 (odd); 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (even).
  const float h = std::ldexp(1.0f, -8);
  EXPECT_EQ(round_to_bf16(1.0f + h), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 3 * h), 1.0f + 4 * h);
  EXPECT_EQ(round_to_bf16(-(1.0f + h)), -1.0f);
  EXPECT_EQ(round_to_bf16(-(1.0f + 3 * h)), -(1.0f + 4 * h));
  // One f32 ulp off the tie decides the direction.
  EXPECT_EQ(round_to_bf16(std::nextafter(1.0f + h, 2.0f)), 1.0f + 2 * h);
  EXPECT_EQ(round_to_bf16(std::nextafter(1.0f + 3 * h, 0.0f)), 1.0f + 2 * h);
  EXPECT_EQ(round_to_bf16(1.0f + 2 * h + h / 2), 1.0f + 2 * h);
  // The tie above the largest bf16 (odd) rounds to infinity, as does FLT_MAX.
  EXPECT_EQ(round_to_bf16(from_bits(0x7F7F8000u)), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to_bf16(from_bits(0x7F7E8000u)), from_bits(0x7F7E0000u));  // tie, even below
}

TEST(RoundToBf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_to_bf16(inf), inf);
  EXPECT_EQ(round_to_bf16(-inf), -inf);
  // NaNs whose payload is only in the low half must not truncate to infinity.
  for (uint32_t bits : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FBFFFFFu, 0xFFFFFFFFu}) {
    const float r = round_to_bf16(from_bits(bits));
    EXPECT_TRUE(std::isnan(r)) << std::hex << bits;
    EXPECT_EQ(to_bits(r) >> 31, bits >> 31) << std::hex << bits;  // sign kept
  }
  // Subnormals become a zero of their sign, as the AVX-512 conversion does.
  EXPECT_EQ(to_bits(round_to_bf16(from_bits(0x00000001u))), 0u);
  EXPECT_EQ(to_bits(round_to_bf16(from_bits(0x807FFFFFu))), 0x80000000u);
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::min()), std::numeric_limits<float>::min());
}

// The in-place array form (gemm_small's rounding) gives the scalar's bits for
// every kind of value, NaN payloads included, at lengths around whole
// vectors, and writes nothing past n.
TEST(RoundToBf16, ArrayRoundsLikeOneByOne) {
  std::mt19937 rng(11);
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x00800000u, 0x3F808000u,
                                0x3F818000u, 0x7F7F8000u, 0x7F7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                0x7F800001u, 0xFF800001u, 0x7FBFFFFFu, 0xFFFFFFFFu};
  for (int i = 0; i < 4000; ++i) bits.push_back(static_cast<uint32_t>(rng()));  // every exponent
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, static_cast<int64_t>(bits.size())}) {
    std::vector<float> x(static_cast<size_t>(n) + 1);
    for (int64_t i = 0; i < n; ++i) x[i] = from_bits(bits[i]);
    x[n] = from_bits(0x3F800001u);  // past the end: must stay as it is
    round_to_bf16(x.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(to_bits(x[i]), to_bits(round_to_bf16(from_bits(bits[i])))) << std::hex << bits[i] << " n " << n;
    }
    EXPECT_EQ(to_bits(x[n]), 0x3F800001u);
  }
}

// gemm_bf16 with one operand all ones gives the other's rounded values, so the
// packing (both layouts of both operands, either half of a k-pair) must round
// as round_to_bf16 does.
TEST(GemmBf16, PackingRoundsLikeRoundToBf16) {
  using Limits = std::numeric_limits<float>;
  const float h = std::ldexp(1.0f, -8);
  // Ties, ordinary values, Inf and overflow to it, NaNs (one with only a low
  // payload), the smallest normal and a subnormal.
  std::vector<float> values = {1 + h, 1 + 3 * h, -(1 + h), 0.1f, -7.3e-5f, 12345.678f};
  values.insert(values.end(), {Limits::infinity(), Limits::max(), Limits::quiet_NaN(),
                               from_bits(0x7F800001u), Limits::min(), from_bits(0x00000123u)});
  std::mt19937 rng(10);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (int i = 0; i < 40; ++i) values.push_back(dist(rng));
  const int64_t M = static_cast<int64_t>(values.size());
  const auto expect_rounded = [&](const std::vector<float>& C, const char* what) {
    for (int64_t i = 0; i < M; ++i) {
      const float want = round_to_bf16(values[i]), got = C[i];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << what << " value " << values[i];
      } else {
        EXPECT_EQ(got, want) << what << " value " << values[i];
      }
    }
  };
  // Depth 2 with the value in either half of the pair; the other half is zero.
  for (int64_t slot : {0, 1}) {
    for (bool trans : kBools) {
      std::vector<float> v(M * 2, 0.0f), ones(2, 1.0f), C(M, -1.0f);
      // v as op(A) [M, 2] (trans: stored [2, M]); as op(B) [2, M] (trans: stored [M, 2]).
      for (int64_t i = 0; i < M; ++i) v[trans ? slot * M + i : i * 2 + slot] = values[i];
      gemm_bf16(trans, false, M, 1, 2, 1.0f, v.data(), trans ? M : 2, ones.data(), 1, 0.0f,
                C.data(), 1);
      expect_rounded(C, trans ? "A^T" : "A");
      gemm_bf16(false, !trans, 1, M, 2, 1.0f, ones.data(), 2, v.data(), !trans ? 2 : M, 0.0f,
                C.data(), M);
      expect_rounded(C, !trans ? "B^T" : "B");
    }
  }
  // Depth 1: the pair's second half is padding.
  for (bool trans : kBools) {
    std::vector<float> C(M, -1.0f);
    const float one = 1.0f;
    gemm_bf16(false, trans, 1, M, 1, 1.0f, &one, 1, values.data(), trans ? 1 : M, 0.0f, C.data(),
              M);
    expect_rounded(C, trans ? "B^T, K=1" : "B, K=1");
    gemm_bf16(trans, false, M, 1, 1, 1.0f, values.data(), trans ? M : 1, &one, 1, 0.0f, C.data(),
              1);
    expect_rounded(C, trans ? "A^T, K=1" : "A, K=1");
  }
}

TEST(GemmBf16, AllTransposesOddSizes) {
  std::mt19937 rng(1);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      for (int64_t M : kOddSizes) {
        for (int64_t N : kOddSizes) {
          for (int64_t K : kOddSizes) check(Problem(ta, tb, M, N, K, 1.0f, 0.0f, 0, rng));
        }
      }
    }
  }
}

TEST(GemmBf16, LeadingDimensionsLargerThanRows) {
  std::mt19937 rng(2);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      for (int64_t pad : {1, 3, 17}) {
        check(Problem(ta, tb, 33, 65, 7, 1.0f, 0.0f, pad, rng));
        check(Problem(ta, tb, 130, 7, 65, 1.0f, 0.5f, pad, rng));
        check(Problem(ta, tb, 1, 130, 33, 1.0f, 1.0f, pad, rng));
        check(Problem(ta, tb, 13, 31, 1, 1.0f, 1.0f, pad, rng));
      }
    }
  }
}

TEST(GemmBf16, AlphaBeta) {
  std::mt19937 rng(3);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      for (float alpha : {1.0f, -0.5f, 2.5f}) {
        for (float beta : {0.0f, 1.0f, 0.75f, -2.0f}) {
          check(Problem(ta, tb, 65, 33, 131, alpha, beta, 2, rng));
        }
      }
    }
  }
}

// Sizes past every blocking parameter of the AVX-512 kernel: several depth
// passes (K > 256, the last one odd), several row blocks and column blocks.
TEST(GemmBf16, LargerThanOneBlock) {
  std::mt19937 rng(4);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      check(Problem(ta, tb, 300, 70, 601, 1.0f, 0.5f, 1, rng));
      check(Problem(ta, tb, 5, 4500, 20, -1.0f, 0.0f, 0, rng));
    }
  }
}

TEST(GemmBf16, BetaZeroOverwritesNaN) {
  std::mt19937 rng(5);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      Problem p(ta, tb, 33, 65, 130, 1.5f, 0.0f, 1, rng);
      for (int64_t i = 0; i < p.M; ++i) {
        for (int64_t j = 0; j < p.N; ++j) p.C0.at(i, j) = std::numeric_limits<float>::quiet_NaN();
      }
      check(p);
    }
  }
}

TEST(GemmBf16, KZeroScalesC) {
  std::mt19937 rng(6);
  const float a = 1, b = 1;  // never read, but must be valid pointers
  Matrix C = random_matrix(7, 33, 2, rng);
  const Matrix C0 = C;
  gemm_bf16(false, false, 7, 33, 0, 1.0f, &a, 1, &b, 33, 0.5f, C.data.data(), C.ld);
  for (int64_t i = 0; i < 7; ++i) {
    for (int64_t j = 0; j < 33; ++j) ASSERT_EQ(C.at(i, j), 0.5f * C0.at(i, j));
  }
  for (auto& x : C.data) x = std::numeric_limits<float>::quiet_NaN();
  gemm_bf16(true, true, 7, 33, 0, 1.0f, &a, 7, &b, 1, 0.0f, C.data.data(), C.ld);
  for (int64_t i = 0; i < 7; ++i) {
    for (int64_t j = 0; j < 33; ++j) ASSERT_EQ(C.at(i, j), 0.0f);
    EXPECT_TRUE(std::isnan(C.at(i, 33)));  // padding untouched
  }
}

// As in BLAS, alpha == 0 reads neither A nor B: NaNs there do not reach C.
TEST(GemmBf16, AlphaZeroIgnoresAB) {
  std::mt19937 rng(7);
  Problem p(false, false, 7, 33, 65, 0.0f, -2.0f, 0, rng);
  p.A.at(3, 3) = std::numeric_limits<float>::quiet_NaN();
  p.B.at(5, 5) = std::numeric_limits<float>::infinity();
  const Matrix C = p.run();
  for (int64_t i = 0; i < p.M; ++i) {
    for (int64_t j = 0; j < p.N; ++j) ASSERT_EQ(C.at(i, j), -2.0f * p.C0.at(i, j));
  }
}

TEST(GemmBf16, EmptyOutputIsUntouched) {
  std::mt19937 rng(8);
  Matrix C = random_matrix(4, 4, 0, rng);
  const Matrix C0 = C;
  const float x = 1;
  gemm_bf16(false, false, 0, 4, 3, 1.0f, &x, 3, &x, 4, 0.0f, C.data.data(), 4);
  gemm_bf16(false, false, 4, 0, 3, 1.0f, &x, 3, &x, 1, 0.0f, C.data.data(), 4);
  EXPECT_EQ(0, std::memcmp(C.data.data(), C0.data.data(), C.data.size() * sizeof(float)));
}

// Operands that bf16 holds exactly (small integers) with every partial sum
// exact in f32 (|sum| < 2^24): nothing rounds, so the result has the same bits
// as the f32 gemm's.
TEST(GemmBf16, ExactOperandsMatchF32Gemm) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> dist(-16, 16);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      for (float alpha : {1.0f, -0.5f, 4.0f}) {
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          Problem p(ta, tb, 37, 70, 301, alpha, beta, 1, rng);
          for (Matrix* m : {&p.A, &p.B, &p.C0}) {
            for (int64_t i = 0; i < m->rows; ++i) {
              for (int64_t j = 0; j < m->cols; ++j) m->at(i, j) = static_cast<float>(dist(rng));
            }
          }
          const Matrix got = p.run();
          for (auto fn : {&gemm<float>, &gemm_builtin<float>}) {
            Matrix want = p.C0;
            fn(ta, tb, p.M, p.N, p.K, alpha, p.A.data.data(), p.A.ld, p.B.data.data(), p.B.ld, beta,
               want.data.data(), want.ld);
            // == rather than bits: the sign of an exact zero may differ.
            for (int64_t i = 0; i < p.M; ++i) {
              for (int64_t j = 0; j < p.N; ++j)
                ASSERT_EQ(got.at(i, j), want.at(i, j)) << p.describe() << " at " << i << ", " << j;
            }
          }
        }
      }
    }
  }
}

TEST(GemmBf16, TileIsBitIdentical) { testing_support::expect_tiles_bit_identical<float>(&gemm_bf16, {600, 601, 77}); }

TEST(GemmBf16, AddMatchesCopyThenBetaOne) {
  testing_support::expect_add_matches_copy_then_beta_one<float>(&gemm_bf16, &gemm_bf16_add);
}

TEST(GemmBf16, NativeKernelWhenTheBuildHasAvx512Bf16) {
  const std::string bf16 = gemm_bf16_backend();
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
  EXPECT_TRUE(gemm_avx512_native());
  EXPECT_STREQ("avx512", gemm_backend());
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
  // ctest runs this suite once more with NABLA_AMX=0, for the VDPBF16PS kernel.
  const char* env = std::getenv("NABLA_AMX");
  EXPECT_EQ(bf16, env && std::string(env) == "0" ? "avx512" : "amx");
#else
  EXPECT_EQ(bf16, "avx512");
#endif
#else
  EXPECT_FALSE(gemm_avx512_native());
  EXPECT_EQ(bf16, "portable");
#endif
}

}  // namespace
}  // namespace nabla::cpu
