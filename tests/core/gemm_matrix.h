// Test matrices and problems for the GEMM tests: row-major with a leading
// dimension larger than the row when asked, the padding NaN so a kernel that
// reads it shows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

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

template <class T>
using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*,
                        int64_t, T, T*, int64_t);

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

}  // namespace nabla::cpu::testing_support
