// One GEMM interface for every matmul in nabla. OpenBLAS when the build found
// it (run single-threaded: nabla's own pool splits the work), else a built-in
// cache-blocked kernel.
#pragma once

#include <cstdint>

namespace nabla::cpu {

// C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C, all row-major.
// op(A) = A or A^T per trans_a (A is stored [M, K] or [K, M] with leading
// dimension lda); likewise B. Runs on the calling thread only.
// beta == 0 means C is overwritten (NaNs in the old C do not propagate).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// "openblas" or "builtin".
const char* gemm_backend();

// The built-in kernel, always compiled: the fallback and the tests' oracle.
template <class T>
void gemm_builtin(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha,
                  const T* A, int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

}  // namespace nabla::cpu
