// One GEMM interface for every matmul in nabla. Small products (alpha 1, beta
// 0 or 1) on gemm_small; other f32 ones on the AVX-512 kernel where the build
// has it (gemm_f32_avx512); the rest on OpenBLAS when the build found it (run
// single-threaded: nabla's own pool splits the work), else a built-in
// cache-blocked kernel.
#pragma once

#include <cstdint>

#include "backend/cpu/gemm_common.h"

namespace nabla::cpu {

// The signature every GEMM below shares, for tests and benchmarks that run
// several side by side.
template <class T>
using GemmFn = void (*)(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                        int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C, all row-major.
// op(A) = A or A^T per trans_a (A is stored [M, K] or [K, M] with leading
// dimension lda); likewise B. Runs on the calling thread only.
// beta == 0 means C is overwritten (NaNs in the old C do not propagate).
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Requests the cache lines of rows x row_bytes bytes starting at p, rows
// ld_bytes apart; for writing (prefetchw where the target has it) when asked.
inline void prefetch_matrix(const void* p, int64_t rows, int64_t row_bytes, int64_t ld_bytes, bool for_write) {
  for (int64_t i = 0; i < rows; ++i) {
    const uintptr_t row = reinterpret_cast<uintptr_t>(p) + uintptr_t(i * ld_bytes);
    for (uintptr_t line = row & ~uintptr_t{63}; line < row + uintptr_t(row_bytes); line += 64) {
      if (for_write) {
        __builtin_prefetch(reinterpret_cast<const void*>(line), 1);
      } else {
        __builtin_prefetch(reinterpret_cast<const void*>(line));
      }
    }
  }
}

// What gemm<float> runs for products past gemm_small: "avx512", "openblas" or
// "builtin".
const char* gemm_backend();

// OpenBLAS's gemm where the build found it, else gemm_builtin: the peer
// that benchmarks measure nabla's own kernels against.
template <class T>
void gemm_blas(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// What gemm_blas runs: "openblas" or "builtin".
const char* gemm_blas_backend();

// Multiply-adds (M N K) up to which gemm_small is the faster route: a BLAS
// call's setup and packing outweigh the arithmetic of a product this small
// (attention at 16 tokens: [16, 24] x [24, 16], 6,144).
inline constexpr int64_t kSmallGemmWork = int64_t{1} << 16;

// C[M, N] = op(A) op(B) (or, with accumulate, C += op(A) op(B)) for small
// products: operands copied row-major into a per-thread scratch where their
// layout needs it (rounded to bf16 when round_bf16, for the bf16 matmul
// option), then each row of C accumulated in registers from vector FMAs over
// rows of B, in increasing k. Any leading dimensions, 0 included (a
// broadcast row). Runs on the calling thread only.
template <class T>
void gemm_small(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                const T* B, int64_t ldb, T* C, int64_t ldc, bool round_bf16 = false, bool accumulate = false);

// The built-in kernel, always compiled: the fallback and the tests' oracle.
template <class T>
void gemm_builtin(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha,
                  const T* A, int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// C[M, N] = alpha * op(A) op(B) + beta * C like gemm<float>, but with A and B
// rounded to bfloat16 (round_to_bf16) while packing and products accumulated
// in f32: the "bf16 matmul" option. Products of two bf16 values are exact in
// f32, so the error is the bf16 rounding of both operands (about 2^-8 relative
// each) plus f32 summation. The summation order depends only on K, and a tile
// of C computed on its own is bit-identical to the same elements of a
// whole-matrix call, as for gemm_builtin. Runs on the calling thread only.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

// C[M, N] = op(A) op(B) + D as gemm_bf16, where D [M, N] has leading
// dimension ldd (0: one row added to every row, a bias) and is read in the
// micro-kernel's store: bit-identical to copying D into C and calling
// gemm_bf16 with beta 1, without the separate pass over C.
void gemm_bf16_add(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                   const float* B, int64_t ldb, const float* D, int64_t ldd, float* C, int64_t ldc);

// C = op(A) op(B), or C += op(A) op(B) with accumulate: one product of a
// graph's matmul or fused attention. With bf16 (the bf16 matmul option) a
// float product rounds its operands to bfloat16: gemm_small's rounding for a
// small product, else gemm_bf16. Otherwise, and for double, gemm.
// d, when given, is what C starts as instead of its own values: C = D +
// op(A) op(B), D [M, N] read through strides (0 where broadcast: a bias row).
// A bf16 product with row-contiguous D reads it in its store
// (gemm_bf16_add); otherwise D is copied into C first.
template <class T>
void product(bool bf16, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
             const T* B, int64_t ldb, T* C, int64_t ldc, bool accumulate = false, const T* d = nullptr,
             int64_t d_row_stride = 0, int64_t d_col_stride = 1);

// C = alpha op(A) op(B) + beta D in f32 on the AVX-512 kernel (gemm_bf16's
// loop nest and micro-kernel with f32 panels and FMAs), where D [M, N] with
// leading dimension ldd (0: one row read by every row, a bias) is C itself
// (D == C, ldd == ldc) or an addend read in the micro-kernel's store, never
// copied into C first. Deterministic as gemm_builtin is: the summation order
// depends only on K, and a tile of C computed alone is bit-identical to the
// same elements of a whole-matrix call. beta == 0 leaves D unread. Without
// gemm_avx512_native(), gemm_builtin computes the same product. Runs on the
// calling thread only.
void gemm_f32_avx512(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                     int64_t lda, const float* B, int64_t ldb, float beta, const float* D, int64_t ldd, float* C,
                     int64_t ldc);

// op(B) [K, N] packed once, for f32 products that repeat it with different
// A: a head's K and V in fused attention, shared by all of its query blocks,
// which gemm_f32_avx512 would pack again for each; a factored weight
// gradient's right factor, shared by its chunks of rows. Needs the AVX-512
// kernel.
class PackedB {
 public:
  // Packs op(B) (B stored [K, N], or [N, K] with trans_b; leading dimension
  // ldb), as bf16 pairs for gemm_bf16's products with bf16. False, with
  // nothing packed, where gemm_avx512_native() is not (or, for bf16, where
  // gemm_bf16 runs on AMX).
  bool pack(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb, bool bf16 = false);
  // C [M, n] = op(A) [M, k] times the packed op(B)'s first k rows and first
  // n columns (k <= K, n <= N; k == K for bf16): the same bits as
  // gemm_f32_avx512 with alpha 1 and beta 0 on those rows and columns (as
  // gemm_bf16 for bf16). Only after pack() returned true; runs on the
  // calling thread only.
  void multiply(bool trans_a, int64_t M, int64_t n, int64_t k, const float* A, int64_t lda, float* C,
                int64_t ldc) const;

 private:
  PackBuffer buffer_;
  const uint32_t* words_ = nullptr;
  int64_t K_ = 0, N_ = 0;
  bool bf16_ = false;
};

// True when the build has the AVX-512 kernels (AVX512F, BW and BF16): then
// gemm<float> runs gemm_f32_avx512 and gemm_bf16 VDPBF16PS (or AMX, see
// gemm_bf16_backend); else gemm_bf16 runs a portable loop with the same rounding.
bool gemm_avx512_native();

// The kernel gemm_bf16 runs: "amx" (AMX tiles, TDPBF16PS: where the build
// has AMX-BF16 and Linux grants the process its tile state, unless the
// environment sets NABLA_AMX=0), "avx512" (VDPBF16PS) or "portable".
const char* gemm_bf16_backend();

// x rounded to the nearest bfloat16 (ties to even), returned as the f32 of the
// same value. As the AVX-512 BF16 conversion does, NaN stays NaN (quiet) and
// subnormals become a zero of the same sign; finite values past the largest
// bf16 round to infinity.
float round_to_bf16(float x);

// x[0, n) rounded in place as round_to_bf16 rounds each (one vector
// conversion per 16 values where the build has AVX-512 BF16).
void round_to_bf16(float* x, int64_t n);

}  // namespace nabla::cpu
