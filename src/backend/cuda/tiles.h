// Products of small matrices in a block's shared memory, for kernels that
// tile their work (attention.cu): C (+)= op(A) op(B), computed by the whole
// block. Two kinds: on CUDA cores in the operands' own type (f32, f64), each
// thread 4 x 4 elements of C (rows and columns a quarter apart), k ascending; and on tensor cores from bf16
// operands with f32 sums (wmma's 16 x 16 x 16 mma), each warp a 16 x 16
// piece. Every dimension is a multiple of 16 (callers pad their tiles with
// zeros). Under the emulator a tensor-core piece is a warp-wide operation as
// on the GPU: every lane must reach it, its pointers must be 32-byte aligned
// and its leading dimensions multiples of 16 bytes, or the kernel fails.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/device.h"

#if defined(NABLA_CUDA_EMULATED)
#include <stdexcept>
#include <string>
#else
#include <mma.h>
#endif

namespace nabla::NABLA_GPU {

// Whether tiles of element type E run on tensor cores (bf16) or CUDA cores.
template <class E>
inline constexpr bool kTensorCores = std::is_same_v<E, bf16>;

// T as a tile element E (rounded where E is bf16), and back.
template <class E, class T>
__device__ __forceinline__ E to_element(T x) {
  if constexpr (kTensorCores<E>) return to_bf16(float(x));
  else return x;
}

#if defined(NABLA_CUDA_EMULATED)

inline void check_tensor_operand(const void* p, int ld, int element_bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ld * element_bytes) % 16 != 0) {
    throw std::logic_error(std::string("cuda emulator: a tensor-core ") + what +
                           " must be 32-byte aligned with a leading dimension of a multiple of 16 bytes (ld " +
                           std::to_string(ld) + ")");
  }
}

// One warp's 16 x 16 piece: C = (accumulate ? C : 0) + sum over k of op(A)
// op(B), a_step/b_step the distance between consecutive k.
inline void warp_mma(const bf16* A, int lda, int a_row, int a_step, const bf16* B, int ldb, int b_col, int b_step,
                     float* C, int ldc, int K, bool accumulate) {
  check_tensor_operand(A, lda, 2, "operand");
  check_tensor_operand(B, ldb, 2, "operand");
  check_tensor_operand(C, ldc, 4, "result");
  warp_sync();  // mma_sync is warp-wide: every lane arrives
  if (lane_id() == 0) {
    float acc[16][16];
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) {
        float s = accumulate ? C[i * ldc + j] : 0.0f;
        for (int k = 0; k < K; ++k) s += to_float(A[i * a_row + k * a_step]) * to_float(B[j * b_col + k * b_step]);
        acc[i][j] = s;
      }
    }
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) C[i * ldc + j] = acc[i][j];
    }
  }
  warp_sync();
}

#else

template <class LayoutA, class LayoutB>
__device__ __forceinline__ void mma_tiles(const bf16* A, int lda, int a_step, const bf16* B, int ldb, int b_step,
                                          float* C, int ldc, int K, bool accumulate) {
  namespace w = nvcuda::wmma;
  w::fragment<w::accumulator, 16, 16, 16, float> c;
  if (accumulate) w::load_matrix_sync(c, C, unsigned(ldc), w::mem_row_major);
  else w::fill_fragment(c, 0.0f);
  for (int k = 0; k < K; k += 16) {
    w::fragment<w::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> a;
    w::fragment<w::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> b;
    w::load_matrix_sync(a, A + k * a_step, unsigned(lda));
    w::load_matrix_sync(b, B + k * b_step, unsigned(ldb));
    w::mma_sync(c, a, b, c);
  }
  w::store_matrix_sync(C, c, unsigned(ldc), w::mem_row_major);
}

__device__ __forceinline__ void warp_mma(const bf16* A, int lda, int a_row, int a_step, const bf16* B, int ldb,
                                         int b_col, int b_step, float* C, int ldc, int K, bool accumulate) {
  namespace w = nvcuda::wmma;
  // A row-major has a_step 1 (k along a row); column-major has a_row 1.
  if (a_step == 1) {
    if (b_step == 1) mma_tiles<w::row_major, w::col_major>(A, lda, 1, B, ldb, 1, C, ldc, K, accumulate);
    else mma_tiles<w::row_major, w::row_major>(A, lda, 1, B, ldb, b_step, C, ldc, K, accumulate);
  } else {
    if (b_step == 1) mma_tiles<w::col_major, w::col_major>(A, lda, a_step, B, ldb, 1, C, ldc, K, accumulate);
    else mma_tiles<w::col_major, w::row_major>(A, lda, a_step, B, ldb, b_step, C, ldc, K, accumulate);
  }
  (void)a_row;
  (void)b_col;
}

#endif

// A matrix operand in shared memory: op(X)[r, k] is X[r * ld + k], or with
// `transposed` X[k * ld + r].
template <class E>
struct TileOperand {
  const E* p;
  int ld;
  bool transposed;
};

// C [M, N] (row stride ldc) = (accumulate ? C scaled row r by row_scale[r]
// (when given) : 0) + op(A) [M, K] op(B) [K, N], where op(B)[k, n] is
// B.p[k * ld + n], or B.p[n * ld + k] transposed. Every thread of the block
// calls it; the caller syncs before C is read.
template <class T, class E>
__device__ void block_product(TileOperand<E> A, TileOperand<E> B, T* C, int ldc, int M, int N, int K, bool accumulate,
                              const T* row_scale = nullptr) {
  const int a_row = A.transposed ? 1 : A.ld, a_step = A.transposed ? A.ld : 1;
  const int b_col = B.transposed ? B.ld : 1, b_step = B.transposed ? 1 : B.ld;
  if constexpr (kTensorCores<E>) {
    static_assert(std::is_same_v<T, float>, "tensor-core tiles sum in f32");
    const int warp = int(threadIdx.x) / 32, warps = int(blockDim.x) / 32, lane = int(threadIdx.x) % 32;
    const int tn = N / 16, tiles = (M / 16) * tn;
    for (int t = warp; t < tiles; t += warps) {
      const int r0 = t / tn * 16, c0 = t % tn * 16;
      float* c = C + r0 * ldc + c0;
      if (accumulate && row_scale) {
        for (int e = lane; e < 256; e += 32) c[(e / 16) * ldc + e % 16] *= row_scale[r0 + e / 16];
        warp_sync();
      }
      warp_mma(A.p + r0 * a_row, A.ld, a_row, a_step, B.p + c0 * b_col, B.ld, b_col, b_step, c, ldc, K, accumulate);
    }
  } else {
    // Thread t: rows t / tn + {0, 1, 2, 3} M/4 and columns t % tn + {0, 1,
    // 2, 3} N/4, so that a warp's lanes read consecutive columns (or rows
    // of a transposed B) of shared memory: different banks.
    const int tm = M / 4, tn = N / 4, pieces = tm * tn;
    for (int t = int(threadIdx.x); t < pieces; t += int(blockDim.x)) {
      const int r0 = t / tn, c0 = t % tn;
      T acc[4][4];
      for (int i = 0; i < 4; ++i) {
        const int r = r0 + i * tm;
        const T s = accumulate && row_scale ? row_scale[r] : T(1);
        for (int j = 0; j < 4; ++j) acc[i][j] = accumulate ? C[r * ldc + c0 + j * tn] * s : T(0);
      }
      const E* a = A.p + r0 * a_row;
      const E* b = B.p + c0 * b_col;
      for (int k = 0; k < K; ++k) {
        T x[4], y[4];
        for (int i = 0; i < 4; ++i) x[i] = a[i * tm * a_row + k * a_step];
        for (int j = 0; j < 4; ++j) y[j] = b[j * tn * b_col + k * b_step];
        for (int i = 0; i < 4; ++i) {
          for (int j = 0; j < 4; ++j) acc[i][j] += x[i] * y[j];
        }
      }
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) C[(r0 + i * tm) * ldc + c0 + j * tn] = acc[i][j];
      }
    }
  }
}

}  // namespace nabla::NABLA_GPU
