// gemm, gemm_builtin and (f32) gemm_f32_avx512 against a naive long double
// triple loop, for f32 and f64.
//
// Tolerance: any summation order of a length-K dot product is within
// gamma_K * sum_k |a_k b_k| of the exact value (gamma_K ~ K * eps / 2); scaling by
// alpha and adding beta * C adds two roundings. We accept
//   |C - ref| <= (K + 2) * eps * (|alpha| * sum_k |a_ik b_kj| + |beta * c_ij|)
// (eps of the tested type), a bound with a factor-two margin that scales with K.
#include "backend/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "gemm_matrix.h"

namespace nabla::cpu {
namespace {

using testing_support::Matrix;
using testing_support::random_matrix;
using testing_support::GemmFn;
using testing_support::Problem;

template <class T>
struct Impl {
  const char* name;
  GemmFn<T> fn;
};

// gemm_f32_avx512 with C as its own addend, as gemm calls it.
void f32_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_f32_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, C, ldc);
}

void f32_avx512_add(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, const float* D, int64_t ldd, float* C, int64_t ldc) {
  gemm_f32_avx512(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, D, ldd, C, ldc);
}

template <class T>
std::vector<Impl<T>> impls() {
  std::vector<Impl<T>> all = {{"gemm", &gemm<T>}, {"gemm_builtin", &gemm_builtin<T>}, {"gemm_blas", &gemm_blas<T>}};
  if constexpr (std::is_same_v<T, float>) all.push_back({"gemm_f32_avx512", &f32_avx512});
  return all;
}

// The exact result (to long double) and the accepted error of every element.
template <class T>
struct Reference {
  std::vector<long double> value, bound;
};

template <class T>
Reference<T> reference(const Problem<T>& p) {
  const long double eps = std::numeric_limits<T>::epsilon();
  Reference<T> r;
  r.value.resize(p.M * p.N);
  r.bound.resize(p.M * p.N);
  for (int64_t i = 0; i < p.M; ++i) {
    for (int64_t j = 0; j < p.N; ++j) {
      long double sum = 0, abs_sum = 0;
      for (int64_t k = 0; k < p.K; ++k) {
        const long double prod = static_cast<long double>(p.a(i, k)) * p.b(k, j);
        sum += prod;
        abs_sum += std::fabs(prod);
      }
      const long double bc =
          p.beta == T(0) ? 0.0L : static_cast<long double>(p.beta) * p.C0.at(i, j);
      r.value[i * p.N + j] = static_cast<long double>(p.alpha) * sum + bc;
      r.bound[i * p.N + j] =
          (p.K + 2) * eps *
          (std::fabs(static_cast<long double>(p.alpha)) * abs_sum + std::fabs(bc));
    }
  }
  return r;
}

// Every element within its bound, and C's padding untouched.
template <class T>
testing::AssertionResult matches(const Problem<T>& p, const Reference<T>& r, const Matrix<T>& C) {
  for (int64_t i = 0; i < p.M; ++i) {
    for (int64_t j = 0; j < p.N; ++j) {
      const long double got = C.at(i, j);
      const long double err = std::fabs(got - r.value[i * p.N + j]);
      if (!(err <= r.bound[i * p.N + j])) {
        return testing::AssertionFailure()
               << p.describe() << ": C[" << i << ", " << j << "] = " << static_cast<double>(got)
               << ", expected " << static_cast<double>(r.value[i * p.N + j]) << " +- "
               << static_cast<double>(r.bound[i * p.N + j]);
      }
    }
    for (int64_t j = p.N; j < C.ld && i * C.ld + j < static_cast<int64_t>(C.data.size()); ++j) {
      if (std::memcmp(&C.at(i, j), &p.C0.at(i, j), sizeof(T)) != 0) {
        return testing::AssertionFailure()
               << p.describe() << ": padding of C written at [" << i << ", " << j << "]";
      }
    }
  }
  return testing::AssertionSuccess();
}

// Runs both implementations on p and checks them against one reference.
template <class T>
void check(const Problem<T>& p) {
  const Reference<T> r = reference(p);
  for (const auto& impl : impls<T>()) {
    SCOPED_TRACE(impl.name);
    EXPECT_TRUE(matches(p, r, p.run(impl.fn)));
  }
}

template <class T>
class GemmTest : public testing::Test {};
using Types = testing::Types<float, double>;
TYPED_TEST_SUITE(GemmTest, Types);

constexpr int64_t kOddSizes[] = {1, 7, 33, 65, 130};
constexpr bool kBools[] = {false, true};

TYPED_TEST(GemmTest, AllTransposesOddSizes) {
  using T = TypeParam;
  std::mt19937 rng(1);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      for (int64_t M : kOddSizes) {
        for (int64_t N : kOddSizes) {
          for (int64_t K : kOddSizes) check(Problem<T>(ta, tb, M, N, K, T(1), T(0), 0, rng));
        }
      }
    }
  }
}

TYPED_TEST(GemmTest, LeadingDimensionsLargerThanRows) {
  using T = TypeParam;
  std::mt19937 rng(2);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      for (int64_t pad : {1, 3, 17}) {
        check(Problem<T>(ta, tb, 33, 65, 7, T(1), T(0), pad, rng));
        check(Problem<T>(ta, tb, 130, 7, 65, T(1), T(0.5), pad, rng));
        check(Problem<T>(ta, tb, 1, 130, 33, T(1), T(1), pad, rng));
      }
    }
  }
}

TYPED_TEST(GemmTest, AlphaBeta) {
  using T = TypeParam;
  std::mt19937 rng(3);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      for (T alpha : {T(1), T(-0.5), T(2.5)}) {
        for (T beta : {T(0), T(1), T(0.75), T(-2)}) {
          check(Problem<T>(ta, tb, 65, 33, 130, alpha, beta, 2, rng));
        }
      }
    }
  }
}

// Sizes past every blocking parameter of the built-in kernel: several depth
// passes (K > 256), several row blocks and several column blocks.
TYPED_TEST(GemmTest, LargerThanOneBlock) {
  using T = TypeParam;
  std::mt19937 rng(4);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      check(Problem<T>(ta, tb, 300, 70, 600, T(1), T(0.5), 1, rng));
      check(Problem<T>(ta, tb, 5, 4500, 20, T(-1), T(0), 0, rng));
      // A^T packed (N past 256, or lda a multiple of 128: the f32 kernel
      // reads a narrower A^T in place) four depth steps at a time, with a
      // ragged last panel and depths that leave 1-3 steps over.
      check(Problem<T>(ta, tb, 37, 300, 263, T(1), T(0), 0, rng));
      check(Problem<T>(ta, tb, 128, 64, 70, T(1), T(0.5), 0, rng));
    }
  }
}

TYPED_TEST(GemmTest, BetaZeroOverwritesNaN) {
  using T = TypeParam;
  std::mt19937 rng(5);
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      Problem<T> p(ta, tb, 33, 65, 130, T(1.5), T(0), 1, rng);
      for (int64_t i = 0; i < p.M; ++i) {
        for (int64_t j = 0; j < p.N; ++j) p.C0.at(i, j) = std::numeric_limits<T>::quiet_NaN();
      }
      check(p);
    }
  }
}

TYPED_TEST(GemmTest, KZeroScalesC) {
  using T = TypeParam;
  std::mt19937 rng(6);
  const T a = 1, b = 1;  // never read, but must be valid pointers
  for (const auto& impl : impls<T>()) {
    SCOPED_TRACE(impl.name);
    Matrix<T> C = random_matrix<T>(7, 33, 2, rng);
    const Matrix<T> C0 = C;
    impl.fn(false, false, 7, 33, 0, T(1), &a, 1, &b, 33, T(0.5), C.data.data(), C.ld);
    for (int64_t i = 0; i < 7; ++i) {
      for (int64_t j = 0; j < 33; ++j) ASSERT_EQ(C.at(i, j), T(0.5) * C0.at(i, j));
    }

    for (auto& x : C.data) x = std::numeric_limits<T>::quiet_NaN();
    impl.fn(true, true, 7, 33, 0, T(1), &a, 7, &b, 1, T(0), C.data.data(), C.ld);
    for (int64_t i = 0; i < 7; ++i) {
      for (int64_t j = 0; j < 33; ++j) ASSERT_EQ(C.at(i, j), T(0));
      EXPECT_TRUE(std::isnan(C.at(i, 33)));  // padding untouched
    }
  }
}

// As in BLAS, alpha == 0 reads neither A nor B: NaNs there do not reach C.
TYPED_TEST(GemmTest, AlphaZeroIgnoresAB) {
  using T = TypeParam;
  std::mt19937 rng(7);
  for (const auto& impl : impls<T>()) {
    SCOPED_TRACE(impl.name);
    Problem<T> p(false, false, 7, 33, 65, T(0), T(-2), 0, rng);
    p.A.at(3, 3) = std::numeric_limits<T>::quiet_NaN();
    p.B.at(5, 5) = std::numeric_limits<T>::infinity();
    const Matrix<T> C = p.run(impl.fn);
    for (int64_t i = 0; i < p.M; ++i) {
      for (int64_t j = 0; j < p.N; ++j) ASSERT_EQ(C.at(i, j), T(-2) * p.C0.at(i, j));
    }
  }
}

TYPED_TEST(GemmTest, EmptyOutputIsUntouched) {
  using T = TypeParam;
  std::mt19937 rng(8);
  for (const auto& impl : impls<T>()) {
    SCOPED_TRACE(impl.name);
    Matrix<T> C = random_matrix<T>(4, 4, 0, rng);
    const Matrix<T> C0 = C;
    const T x = 1;
    impl.fn(false, false, 0, 4, 3, T(1), &x, 3, &x, 4, T(0), C.data.data(), 4);
    impl.fn(false, false, 4, 0, 3, T(1), &x, 3, &x, 1, T(0), C.data.data(), 4);
    EXPECT_EQ(0, std::memcmp(C.data.data(), C0.data.data(), C.data.size() * sizeof(T)));
  }
}

// The built-in kernel's promise (see gemm.cpp): a tile of C computed alone has
// the same bits as the same elements of a whole-matrix call.
TYPED_TEST(GemmTest, BuiltinTileIsBitIdentical) {
  testing_support::expect_tiles_bit_identical<TypeParam>(&gemm_builtin<TypeParam>, {600});
}

// The same promise from the AVX-512 f32 kernel, whose tiles the matmul op
// computes on separate threads (the portable fallback is gemm_builtin).
TEST(GemmF32Avx512, TileIsBitIdentical) {
  testing_support::expect_tiles_bit_identical<float>(&f32_avx512, {600, 601, 77, 256});
}

// A B packed once (PackedB) and multiplied by its leading rows and columns:
// the bits of gemm_f32_avx512 on the same sub-matrix of B, for both of B's
// layouts, depth prefixes inside and across the 256-deep passes, and column
// prefixes inside and across the 2048-wide blocks.
TEST(GemmF32Avx512, PackedBMatchesAFreshProduct) {
  if (!gemm_avx512_native()) GTEST_SKIP() << "PackedB needs the AVX-512 kernel";
  std::mt19937 rng(9);
  struct Shape {
    int64_t K, N, k, n;
  };
  for (bool tb : kBools) {
    for (const Shape& s : {Shape{64, 256, 64, 97}, Shape{300, 64, 241, 64}, Shape{300, 64, 300, 33},
                           Shape{40, 2100, 37, 2090}}) {
      SCOPED_TRACE("tb " + std::to_string(tb) + " K " + std::to_string(s.K) + " N " + std::to_string(s.N) +
                   " k " + std::to_string(s.k) + " n " + std::to_string(s.n));
      const int64_t M = 37;
      const Matrix<float> A = random_matrix<float>(M, s.K, 3, rng);
      const Matrix<float> B = tb ? random_matrix<float>(s.N, s.K, 2, rng) : random_matrix<float>(s.K, s.N, 2, rng);
      PackedB packed;
      ASSERT_TRUE(packed.pack(tb, s.K, s.N, B.data.data(), B.ld));
      Matrix<float> C(M, s.n, 1), expect(M, s.n, 1);
      packed.multiply(false, M, s.n, s.k, A.data.data(), A.ld, C.data.data(), C.ld);
      gemm_f32_avx512(false, tb, M, s.n, s.k, 1.0f, A.data.data(), A.ld, B.data.data(), B.ld, 0.0f,
                      expect.data.data(), expect.ld, expect.data.data(), expect.ld);
      EXPECT_EQ(0, std::memcmp(C.data.data(), expect.data.data(), C.data.size() * sizeof(float)));
    }
  }
}

// PackedB with bf16 pairs: the bits of gemm_bf16 on the same columns, at the
// packed depth (odd, across passes), for both of B's layouts and for A and
// A^T.
TEST(GemmF32Avx512, PackedBBf16MatchesGemmBf16) {
  std::mt19937 rng(10);
  PackedB probe;
  const float one = 1.0f;
  if (!probe.pack(false, 1, 1, &one, 1, true)) GTEST_SKIP() << "bf16 PackedB needs the VDPBF16PS kernel";
  for (bool ta : kBools) {
    for (bool tb : kBools) {
      for (int64_t K : {64, 301}) {
        SCOPED_TRACE("ta " + std::to_string(ta) + " tb " + std::to_string(tb) + " K " + std::to_string(K));
        const int64_t M = 29, N = 200, n = 97;
        const Matrix<float> A = ta ? random_matrix<float>(K, M, 3, rng) : random_matrix<float>(M, K, 3, rng);
        const Matrix<float> B = tb ? random_matrix<float>(N, K, 2, rng) : random_matrix<float>(K, N, 2, rng);
        PackedB packed;
        ASSERT_TRUE(packed.pack(tb, K, N, B.data.data(), B.ld, true));
        Matrix<float> C(M, n, 1), expect(M, n, 1);
        packed.multiply(ta, M, n, K, A.data.data(), A.ld, C.data.data(), C.ld);
        gemm_bf16(ta, tb, M, n, K, 1.0f, A.data.data(), A.ld, B.data.data(), B.ld, 0.0f, expect.data.data(),
                  expect.ld);
        EXPECT_EQ(0, std::memcmp(C.data.data(), expect.data.data(), C.data.size() * sizeof(float)));
      }
    }
  }
}

TEST(GemmF32Avx512, AddMatchesCopyThenBetaOne) {
  testing_support::expect_add_matches_copy_then_beta_one<float>(&f32_avx512, &f32_avx512_add);
}

// gemm_small (alpha 1; beta 0, or 1 with accumulate): every transpose,
// widths around whole vectors, heights around the row blocks (16 rows of
// one vector, 8 of two) and their halving tails, depths around the 16 x 16
// blocks of the transposing copy, padded leading dimensions; C's padding
// untouched.
TYPED_TEST(GemmTest, SmallProducts) {
  using T = TypeParam;
  std::mt19937 rng(5);
  const GemmFn<T> small = [](bool ta, bool tb, int64_t M, int64_t N, int64_t K, T, const T* A, int64_t lda,
                             const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
    gemm_small<T>(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, false, beta != T(0));
  };
  for (bool ta : kBools)
    for (bool tb : kBools)
      for (int64_t M : {1, 5, 7, 8, 9, 15, 16, 17, 33})
        for (int64_t N : {1, 15, 16, 17, 24, 33, 40})
          for (int64_t K : {1, 7, 17, 24, 33})
            for (int64_t pad : {0, 3})
              for (T beta : {T(0), T(1)}) {
                Problem<T> p(ta, tb, M, N, K, T(1), beta, pad, rng);
                ASSERT_TRUE(matches(p, reference(p), p.run(small)));
              }
}

// With round_bf16 the operands are rounded first and nothing else changes:
// the same bits as rounding them beforehand.
TEST(Gemm, SmallProductsRoundToBf16LikeRoundedOperands) {
  std::mt19937 rng(6);
  Problem<float> p(true, true, 7, 24, 24, 1.0f, 0.0f, 2, rng);
  Matrix<float> C(7, 24, 2), expect(7, 24, 2);
  gemm_small<float>(true, true, 7, 24, 24, p.A.data.data(), p.A.ld, p.B.data.data(), p.B.ld, C.data.data(), C.ld,
                    true);
  Problem<float> r = p;
  for (auto* m : {&r.A, &r.B})
    for (float& x : m->data) x = std::isnan(x) ? x : round_to_bf16(x);
  gemm_small<float>(true, true, 7, 24, 24, r.A.data.data(), r.A.ld, r.B.data.data(), r.B.ld, expect.data.data(),
                    expect.ld);
  EXPECT_EQ(0, std::memcmp(C.data.data(), expect.data.data(), C.data.size() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(C.data.data(), p.run(&gemm<float>).data.data(), C.data.size() * sizeof(float)));
}

TEST(Gemm, BackendName) {
  const std::string name = gemm_backend(), blas = gemm_blas_backend();
  EXPECT_TRUE(name == "avx512" || name == "openblas" || name == "builtin") << name;
  EXPECT_TRUE(blas == "openblas" || blas == "builtin") << blas;
  EXPECT_EQ(name == "avx512", gemm_avx512_native());
}

}  // namespace
}  // namespace nabla::cpu
