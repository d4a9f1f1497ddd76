// Test matrices and problems for the GEMM tests: row-major with a leading
// dimension larger than the row when asked, the padding NaN so a kernel that
// reads it shows; and the checks every kernel of nabla's own shares.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"

namespace nabla::cpu::testing_support {

template <class T>
struct Matrix {
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<T> data;

  Matrix(int64_t r, int64_t c, int64_t pad)
      : rows(r),
        cols(c),
        ld(c + pad),
        data(std::max<int64_t>(1, r * (c + pad)), std::numeric_limits<T>::quiet_NaN()) {}
  T& at(int64_t i, int64_t j) { return data[i * ld + j]; }
  const T& at(int64_t i, int64_t j) const { return data[i * ld + j]; }
};

// Entries uniform in [-1, 1).
template <class T>
Matrix<T> random_matrix(int64_t rows, int64_t cols, int64_t pad, std::mt19937& rng) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  Matrix<T> m(rows, cols, pad);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) m.at(i, j) = static_cast<T>(dist(rng));
  }
  return m;
}

using cpu::GemmFn;

// One problem: C = alpha * op(A) op(B) + beta * C0, op(A) [M, K], op(B) [K, N].
template <class T>
struct Problem {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  T alpha = 1, beta = 0;
  Matrix<T> A, B, C0;

  Problem(bool ta_, bool tb_, int64_t M_, int64_t N_, int64_t K_, T alpha_, T beta_, int64_t pad,
          std::mt19937& rng)
      : ta(ta_),
        tb(tb_),
        M(M_),
        N(N_),
        K(K_),
        alpha(alpha_),
        beta(beta_),
        A(ta ? random_matrix<T>(K, M, pad, rng) : random_matrix<T>(M, K, pad, rng)),
        B(tb ? random_matrix<T>(N, K, pad, rng) : random_matrix<T>(K, N, pad, rng)),
        C0(random_matrix<T>(M, N, pad, rng)) {}

  T a(int64_t i, int64_t k) const { return ta ? A.at(k, i) : A.at(i, k); }
  T b(int64_t k, int64_t j) const { return tb ? B.at(j, k) : B.at(k, j); }

  Matrix<T> run(GemmFn<T> fn) const {
    Matrix<T> C = C0;
    fn(ta, tb, M, N, K, alpha, A.data.data(), A.ld, B.data.data(), B.ld, beta, C.data.data(), C.ld);
    return C;
  }

  std::string describe() const {
    std::ostringstream s;
    s << "ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N << " K=" << K << " alpha=" << alpha
      << " beta=" << beta << " lda=" << A.ld << " ldb=" << B.ld << " ldc=" << C0.ld;
    return s.str();
  }
};

// C = op(A) op(B) + D, D [M, N] with leading dimension ldd (0: one row for
// every row), as gemm_bf16_add takes it.
template <class T>
using GemmAddFn = void (*)(bool, bool, int64_t, int64_t, int64_t, const T*, int64_t, const T*, int64_t, const T*,
                           int64_t, T*, int64_t);

// The determinism promise of nabla's own kernels (see gemm.cpp): a tile of C
// computed alone has the same bits as the same elements of a whole-matrix
// call, whatever its position, size or leading dimension, for every depth in
// `depths` (one or several passes, odd or even).
template <class T>
void expect_tiles_bit_identical(GemmFn<T> fn, std::initializer_list<int64_t> depths) {
  std::mt19937 rng(9);
  // N above 256 and tiles below it: the AVX-512 f32 kernel reads A in place
  // for narrow products and packs it for wide ones, with the same bits.
  const int64_t M = 97, N = 300;
  struct TileSpec {
    int64_t r0, c0, rows, cols;
  };
  // One-row tiles too: the AVX-512 f32 kernel multiplies one row of A (a
  // decoding step's) without packing B, with the same bits.
  const TileSpec tiles[] = {{0, 0, M, N},      {0, 0, 1, 1},    {96, 149, 1, 1},  {5, 3, 17, 41},
                            {12, 32, 24, 64},  {1, 7, 90, 100}, {50, 0, 47, 150}, {24, 40, 60, 260},
                            {3, 0, 1, N},      {40, 17, 1, 33}};
  for (int64_t K : depths) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (T beta : {T(0), T(0.75)}) {
          const Problem<T> p(ta, tb, M, N, K, T(1.25), beta, 3, rng);
          const Matrix<T> full = p.run(fn);
          for (const auto& t : tiles) {
            SCOPED_TRACE(p.describe() + " tile at " + std::to_string(t.r0) + "," + std::to_string(t.c0));
            Matrix<T> tile(t.rows, t.cols, 5);
            for (int64_t i = 0; i < t.rows; ++i) {
              for (int64_t j = 0; j < t.cols; ++j) tile.at(i, j) = p.C0.at(t.r0 + i, t.c0 + j);
            }
            // op(A) rows r0.. and op(B) columns c0.., whichever way each is stored.
            const T* a = p.A.data.data() + (ta ? t.r0 : t.r0 * p.A.ld);
            const T* b = p.B.data.data() + (tb ? t.c0 * p.B.ld : t.c0);
            fn(ta, tb, t.rows, t.cols, K, p.alpha, a, p.A.ld, b, p.B.ld, p.beta, tile.data.data(), tile.ld);
            for (int64_t i = 0; i < t.rows; ++i) {
              ASSERT_EQ(0, std::memcmp(&tile.at(i, 0), &full.at(t.r0 + i, t.c0), t.cols * sizeof(T)))
                  << "row " << i;
            }
          }
        }
      }
    }
  }
}

// An add kernel reads its addend in the store: the same bits as copying the
// addend into C and accumulating onto it with fn and beta 1, for a bias row
// (ldd 0) and a full addend with its own leading dimension, over no, one and
// several depth passes; the addend is never written.
template <class T>
void expect_add_matches_copy_then_beta_one(GemmFn<T> fn, GemmAddFn<T> add) {
  std::mt19937 rng(10);
  // N above 256 and tiles below it: the AVX-512 f32 kernel reads A in place
  // for narrow products and packs it for wide ones, with the same bits.
  const int64_t M = 97, N = 300;
  for (int64_t K : {0, 77, 601}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Problem<T> p(ta, tb, M, N, K, T(1), T(1), 3, rng);
        for (bool bias : {false, true}) {
          SCOPED_TRACE(p.describe() + (bias ? " bias" : " full addend"));
          const Matrix<T> D = random_matrix<T>(bias ? 1 : M, N, 6, rng);
          const int64_t ldd = bias ? 0 : D.ld;
          Matrix<T> want(M, N, 2), got(M, N, 2);
          std::fill(got.data.begin(), got.data.end(), std::numeric_limits<T>::quiet_NaN());
          for (int64_t i = 0; i < M; ++i) std::copy_n(&D.at(bias ? 0 : i, 0), N, &want.at(i, 0));
          fn(ta, tb, M, N, K, T(1), p.A.data.data(), p.A.ld, p.B.data.data(), p.B.ld, T(1), want.data.data(),
             want.ld);
          const Matrix<T> d_before = D;
          add(ta, tb, M, N, K, p.A.data.data(), p.A.ld, p.B.data.data(), p.B.ld, D.data.data(), ldd,
              got.data.data(), got.ld);
          for (int64_t i = 0; i < M; ++i) {
            ASSERT_EQ(0, std::memcmp(&got.at(i, 0), &want.at(i, 0), N * sizeof(T))) << "row " << i;
          }
          EXPECT_EQ(0, std::memcmp(D.data.data(), d_before.data.data(), D.data.size() * sizeof(T)));
        }
      }
    }
  }
}

}  // namespace nabla::cpu::testing_support
