// Pieces shared by the GEMM kernels (gemm.cpp, gemm_bf16.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace nabla::cpu {

// A per-thread scratch buffer for packing that only grows, so packing
// allocates once per thread rather than once per call.
class PackBuffer {
 public:
  PackBuffer() = default;
  PackBuffer(const PackBuffer&) = delete;
  PackBuffer& operator=(const PackBuffer&) = delete;
  ~PackBuffer() { std::free(data_); }

  // At least `count` elements of T, 64-byte aligned; earlier contents are lost.
  template <class T>
  T* get(int64_t count) {
    const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + 63) / 64 * 64;
    if (bytes > bytes_) {
      std::free(data_);
      data_ = std::aligned_alloc(64, bytes);
      bytes_ = data_ ? bytes : 0;
      if (!data_) throw std::bad_alloc();
    }
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// C[M, N] *= beta, where beta == 0 overwrites (NaNs in C do not survive):
// what a GEMM does when K == 0 or alpha == 0.
template <class T>
void scale_c(int64_t M, int64_t N, T beta, T* C, int64_t ldc) {
  if (beta == T(1)) return;
  for (int64_t i = 0; i < M; ++i) {
    T* c = C + i * ldc;
    if (beta == T(0)) {
      std::fill(c, c + N, T(0));
    } else {
      for (int64_t j = 0; j < N; ++j) c[j] *= beta;
    }
  }
}

// A product with nothing to multiply (C empty, K == 0, or alpha == 0, which
// as in BLAS leaves A and B unread) done as scale_c: true when it was one.
template <class T>
bool trivial_product(int64_t M, int64_t N, int64_t K, T alpha, T beta, T* C, int64_t ldc) {
  if (M > 0 && N > 0 && K > 0 && alpha != T(0)) return false;
  if (M > 0 && N > 0) scale_c(M, N, beta, C, ldc);
  return true;
}

}  // namespace nabla::cpu
