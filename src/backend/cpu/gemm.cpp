// GEMM: products of at most kSmallGemmWork multiply-adds on gemm_small; larger
// f32 ones on the AVX-512 kernel (gemm_avx512.cpp) where the build has it;
// the rest on OpenBLAS when the build found it, else the built-in kernel below.
//
// Determinism. The built-in kernel computes every element of C in an order that
// depends only on K: for each depth pass (k in [p, min(K, p + kKc)), p a
// multiple of kKc) it sums a*b in increasing k into a zeroed accumulator, then
// writes C = alpha*acc + beta*C on the first pass and C += alpha*acc on later
// ones. Edge tiles run the same full-size micro-kernel on zero-padded panels,
// through a scratch tile, so a tile of C computed on its own is bit-identical
// to the same elements of a whole-matrix call, whatever M, N, the tile's
// position or the leading dimensions (tests/core/gemm_test.cpp checks this).
// NOTE: this relies on the compiler treating every lane of the micro-kernel
// alike (see the pragma there); the tile test is what guards it.
// The AVX-512 kernel keeps the same promise. OpenBLAS gives none (its
// kernels and blocking depend on the shape); there the caller, the matmul
// op, keeps results deterministic by always calling gemm on tiles of fixed
// size.
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_common.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/transpose_16x16.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#ifdef NABLA_HAVE_OPENBLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

namespace nabla::cpu {
namespace {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif

// Blocking for the built-in kernel (Goto/BLIS loop order). The register tile
// is kMr x kNr accumulators, two vectors per row: 24 of the 32 AVX-512
// registers, 12 of the 16 AVX2 or SSE ones (4 x 2 for SSE, where products need
// temporaries). A kKc x kNr panel of B stays in L1, a kMc x kKc block of A in
// L2; kNc bounds the packed B. Values tuned on Zen 4 with the shapes in
// bench/gemm_bench.cpp; kKc also fixes the summation order (see above).
template <class T>
struct Blocking {
  static constexpr int kNr = 2 * kVecBytes / static_cast<int>(sizeof(T));
  static constexpr int kMr = kVecBytes == 64 ? 12 : kVecBytes == 32 ? 6 : 4;
  static constexpr int64_t kKc = 256;
  static constexpr int64_t kMc = kMr * 16;
  static constexpr int64_t kNc = 2048;
};


thread_local PackBuffer t_pack_a;
thread_local PackBuffer t_pack_b;

// Packs rows [i0, i0 + mc) x depth [p0, p0 + kc) of op(A) into micro-panels of
// kMr rows, each stored k-major (kMr values per k); rows past mc are zero.
template <class T>
void pack_a(bool trans, const T* A, int64_t lda, int64_t i0, int64_t p0, int64_t mc, int64_t kc,
            T* dst) {
  constexpr int mr = Blocking<T>::kMr;
  for (int64_t ir = 0; ir < mc; ir += mr, dst += kc * mr) {
    const int64_t rows = std::min<int64_t>(mr, mc - ir);
    if (trans) {  // A is [K, M]: a row of A gives kMr contiguous values
      for (int64_t k = 0; k < kc; ++k) {
        const T* src = A + (p0 + k) * lda + i0 + ir;
        for (int64_t i = 0; i < rows; ++i) dst[k * mr + i] = src[i];
        for (int64_t i = rows; i < mr; ++i) dst[k * mr + i] = T(0);
      }
    } else {
      for (int64_t i = 0; i < rows; ++i) {
        const T* src = A + (i0 + ir + i) * lda + p0;
        for (int64_t k = 0; k < kc; ++k) dst[k * mr + i] = src[k];
      }
      for (int64_t i = rows; i < mr; ++i) {
        for (int64_t k = 0; k < kc; ++k) dst[k * mr + i] = T(0);
      }
    }
  }
}

// Packs depth [p0, p0 + kc) x columns [j0, j0 + nc) of op(B) into micro-panels
// of kNr columns, each stored k-major; columns past nc are zero.
template <class T>
void pack_b(bool trans, const T* B, int64_t ldb, int64_t p0, int64_t j0, int64_t kc, int64_t nc,
            T* dst) {
  constexpr int nr = Blocking<T>::kNr;
  for (int64_t jr = 0; jr < nc; jr += nr, dst += kc * nr) {
    const int64_t cols = std::min<int64_t>(nr, nc - jr);
    if (trans) {  // B is [N, K]
      for (int64_t j = 0; j < cols; ++j) {
        const T* src = B + (j0 + jr + j) * ldb + p0;
        for (int64_t k = 0; k < kc; ++k) dst[k * nr + j] = src[k];
      }
      for (int64_t j = cols; j < nr; ++j) {
        for (int64_t k = 0; k < kc; ++k) dst[k * nr + j] = T(0);
      }
    } else {
      for (int64_t k = 0; k < kc; ++k) {
        const T* src = B + (p0 + k) * ldb + j0 + jr;
        for (int64_t j = 0; j < cols; ++j) dst[k * nr + j] = src[j];
        for (int64_t j = cols; j < nr; ++j) dst[k * nr + j] = T(0);
      }
    }
  }
}

// C[kMr, kNr] (leading dimension ldc) = alpha * a * b + beta * C, with a and b
// packed micro-panels of depth kc. Fixed trip counts let the compiler keep the
// accumulators in vector registers; beta == 0 overwrites C.
template <class T>
void micro_kernel(int64_t kc, const T* __restrict a, const T* __restrict b, T alpha, T beta,
                  T* __restrict C, int64_t ldc) {
  constexpr int mr = Blocking<T>::kMr;
  constexpr int nr = Blocking<T>::kNr;
  T acc[mr][nr] = {};
  for (int64_t k = 0; k < kc; ++k) {
    for (int i = 0; i < mr; ++i) {
      const T ak = a[k * mr + i];
      // NOTE: without this, g++ 12 fully unrolls a j loop of <= 16 iterations
      // (f64 with AVX-512, both types with AVX2) before vectorising, then
      // vectorises across i with shuffles: 10x slower, and lanes no longer
      // compute alike, which breaks the tile bit-identity test.
#pragma GCC unroll 1
      for (int j = 0; j < nr; ++j) acc[i][j] += ak * b[k * nr + j];
    }
  }
  for (int i = 0; i < mr; ++i) {
    T* c = C + i * ldc;
    if (beta == T(0)) {
      for (int j = 0; j < nr; ++j) c[j] = alpha * acc[i][j];
    } else if (beta == T(1)) {
      for (int j = 0; j < nr; ++j) c[j] += alpha * acc[i][j];
    } else {
      for (int j = 0; j < nr; ++j) c[j] = alpha * acc[i][j] + beta * c[j];
    }
  }
}

#ifdef NABLA_HAVE_OPENBLAS
// cblas takes int dimensions and rejects (with a message, computing nothing) a
// leading dimension below the row length, which a stride-0 view would give.
bool blas_accepts(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                  int64_t ldb, int64_t ldc) {
  const auto fits = [](int64_t v, int64_t row) {
    return v <= INT_MAX && v >= std::max<int64_t>(1, row);
  };
  return M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && fits(lda, trans_a ? M : K) &&
         fits(ldb, trans_b ? K : N) && fits(ldc, N);
}

void blas_single_thread() {
  // nabla's own pool splits the work; OpenBLAS threads would oversubscribe.
  static const bool once = (openblas_set_num_threads(1), true);
  (void)once;
}

void blas_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
               const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void blas_gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
               const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#endif

}  // namespace

template <class T>
void gemm_builtin(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                  int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  using Bl = Blocking<T>;
  constexpr int mr = Bl::kMr;
  constexpr int nr = Bl::kNr;
  if (trivial_product(M, N, K, alpha, beta, C, ldc)) return;

  const int64_t nc_max = std::min(Bl::kNc, (N + nr - 1) / nr * nr);
  const int64_t mc_max = std::min(Bl::kMc, (M + mr - 1) / mr * mr);
  const int64_t kc_max = std::min(Bl::kKc, K);
  T* pa = t_pack_a.get<T>(mc_max * kc_max);
  T* pb = t_pack_b.get<T>(nc_max * kc_max);
  alignas(64) T edge[mr * nr];

  for (int64_t jc = 0; jc < N; jc += Bl::kNc) {
    const int64_t nc = std::min(Bl::kNc, N - jc);
    for (int64_t pc = 0; pc < K; pc += Bl::kKc) {
      const int64_t kc = std::min(Bl::kKc, K - pc);
      const T pass_beta = pc == 0 ? beta : T(1);
      pack_b(trans_b, B, ldb, pc, jc, kc, nc, pb);
      for (int64_t ic = 0; ic < M; ic += Bl::kMc) {
        const int64_t mc = std::min(Bl::kMc, M - ic);
        pack_a(trans_a, A, lda, ic, pc, mc, kc, pa);
        for (int64_t jr = 0; jr < nc; jr += nr) {
          const int64_t cols = std::min<int64_t>(nr, nc - jr);
          const T* b = pb + jr * kc;
          for (int64_t ir = 0; ir < mc; ir += mr) {
            const int64_t rows = std::min<int64_t>(mr, mc - ir);
            const T* a = pa + ir * kc;
            T* c = C + (ic + ir) * ldc + jc + jr;
            if (rows == mr && cols == nr) {
              micro_kernel(kc, a, b, alpha, pass_beta, c, ldc);
              continue;
            }
            // Edge tile: same kernel on a scratch copy, so the arithmetic is identical.
            if (pass_beta != T(0)) {
              for (int64_t i = 0; i < rows; ++i)
                std::memcpy(edge + i * nr, c + i * ldc, cols * sizeof(T));
            }
            micro_kernel(kc, a, b, alpha, pass_beta, edge, nr);
            for (int64_t i = 0; i < rows; ++i)
              std::memcpy(c + i * ldc, edge + i * nr, cols * sizeof(T));
          }
        }
      }
    }
  }
}

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (trivial_product(M, N, K, alpha, beta, C, ldc)) return;
  if (M * N * K <= kSmallGemmWork && alpha == T(1) && (beta == T(0) || beta == T(1))) {
    return gemm_small(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, false, beta == T(1));
  }
  if constexpr (std::is_same_v<T, float>) {
    if (gemm_avx512_native()) {
      return gemm_f32_avx512(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, C, ldc);
    }
  }
  gemm_blas<T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void gemm_blas(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
               int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (trivial_product(M, N, K, alpha, beta, C, ldc)) return;
#ifdef NABLA_HAVE_OPENBLAS
  if (blas_accepts(trans_a, trans_b, M, N, K, lda, ldb, ldc)) {
    blas_single_thread();
    blas_gemm(trans_a, trans_b, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
              alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta, C,
              static_cast<int>(ldc));
    return;
  }
#endif
  gemm_builtin(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {

// Rows [0, R) of C, columns [j0, j0 + NV * kWidth) clipped to N, from a
// (element (r, k) at a[r * a_rs + k * a_ks]: row-major or transposed alike,
// each is one broadcast) and b [K, ldb]: R * NV independent vector
// accumulators, enough FMA chains in flight to hide the FMA latency. With
// Tail, the last vector's columns come from tail [K, kWidth] (B's last
// partial vector, zero padded) instead of b, whose rows then end at N. Plain
// loads only in the k loop: a branch there, or a masked-load intrinsic, made
// g++ store every accumulator to the stack on every k.
template <int R, int NV, bool Tail>
void small_block_f32(int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_ks, const float* b, int64_t ldb,
                     const float* tail, int64_t j0, float* c, int64_t ldc, bool accumulate) {
  constexpr int W = VecF::kWidth;
  VecF acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = VecF(0.0f);
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb + j0;
    VecF bv[NV];
    for (int v = 0; v < NV - 1; ++v) bv[v] = VecF::load(bk + v * W);
    bv[NV - 1] = Tail ? VecF::load(tail + k * W) : VecF::load(bk + (NV - 1) * W);
    for (int r = 0; r < R; ++r) {
      const VecF ak(a[r * a_rs + k * a_ks]);
      for (int v = 0; v < NV; ++v) acc[r][v] = fma(ak, bv[v], acc[r][v]);
    }
  }
  for (int v = 0; v < NV; ++v) {
    const int64_t lanes = std::clamp<int64_t>(N - j0 - v * W, 0, W);
    for (int r = 0; r < R; ++r) {
      float* cr = c + r * ldc + j0 + v * W;
      // Stored through a copy: store() takes its operand's address, which
      // would keep the accumulator in memory.
      VecF out = acc[r][v];
      if (accumulate) out = out + VecF::load(cr, 1, lanes);
      out.store(cr, lanes);
    }
  }
}

// tail: B's last partial vector as [K, kWidth], used by the pass holding it;
// null when N is whole vectors.
template <int R, int NV>
void small_block_f32(int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_ks, const float* b, int64_t ldb,
                     const float* tail, int64_t j0, float* c, int64_t ldc, bool accumulate) {
  if (tail && N - j0 - (NV - 1) * VecF::kWidth < VecF::kWidth) {
    return small_block_f32<R, NV, true>(N, K, a, a_rs, a_ks, b, ldb, tail, j0, c, ldc, accumulate);
  }
  small_block_f32<R, NV, false>(N, K, a, a_rs, a_ks, b, ldb, tail, j0, c, ldc, accumulate);
}

// Row blocks of 16 accumulators (16 rows of one vector, 8 of two): enough
// independent FMA chains to cover the FMA latency on both pipes, where 6
// rows of one vector (attention's 16 x 16 scores) waited on it. The last
// rows go in blocks of halving height.
template <int NV>
void small_rows_f32(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_ks, const float* b,
                    int64_t ldb, const float* tail, int64_t j0, float* c, int64_t ldc, bool accumulate) {
  constexpr int R = 16 / NV;
  int64_t i = 0;
  const auto rows = [&]<int H>() {
    for (; i + H <= M; i += H) {
      small_block_f32<H, NV>(N, K, a + i * a_rs, a_rs, a_ks, b, ldb, tail, j0, c + i * ldc, ldc, accumulate);
    }
  };
  rows.template operator()<R>();
  if constexpr (R >= 16) rows.template operator()<8>();
  rows.template operator()<4>();
  rows.template operator()<2>();
  rows.template operator()<1>();
}

template <class T>
struct SmallScratch {
  std::vector<T> a, b, tail;
};

// dst[r * ldd + c] = op(src)[r, c] for r < rows, c < cols, where op(src) is
// src (ld) or, with trans, src^T; columns [cols, ldd) of dst are zeroed.
// Rounded to bf16 after the copy when asked, in one vector pass over dst (a
// call per element would outweigh a small product's arithmetic).
template <class T>
void copy_rows(bool trans, bool round_bf16, int64_t rows, int64_t cols, const T* src, int64_t ld, T* dst,
               int64_t ldd) {
  if (!trans) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ldd, src + r * ld, size_t(cols) * sizeof(T));
#if defined(__AVX512F__)
  } else if (std::is_same_v<T, float> && ldd % 16 == 0) {
    // 16 x 16 blocks transposed in registers (zero past rows and cols):
    // element by element, this copy would cost as much as a 16-token q k^T.
    for (int64_t c0 = 0; c0 < ldd; c0 += 16) {
      for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, rows - r0)) - 1);
        __m512i x[16];
        for (int i = 0; i < 16; ++i) {
          x[i] = c0 + i < cols ? _mm512_maskz_loadu_epi32(m, src + (c0 + i) * ld + r0) : _mm512_setzero_si512();
        }
        transpose_16x16(x);
        for (int i = 0; i < 16 && r0 + i < rows; ++i) _mm512_storeu_si512(dst + (r0 + i) * ldd + c0, x[i]);
      }
    }
#endif
  } else {
    for (int64_t c = 0; c < cols; ++c) {  // source rows, read contiguously
      const T* in = src + c * ld;
      for (int64_t r = 0; r < rows; ++r) dst[r * ldd + c] = in[r];
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = cols; c < ldd; ++c) dst[r * ldd + c] = T(0);
  if constexpr (std::is_same_v<T, float>) {
    if (round_bf16) round_to_bf16(dst, rows * ldd);
  }
}

}  // namespace

template <class T>
void gemm_small(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                const T* B, int64_t ldb, T* C, int64_t ldc, bool round_bf16, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if constexpr (!std::is_same_v<T, float>) round_bf16 = false;
  thread_local SmallScratch<T> s;
  // Copies only where the layout or the rounding needs one: the f32 kernel
  // reads a transposed A in place (its elements are broadcast one by one),
  // and a row-major B whose rows are not whole vectors in place but for its
  // last partial vector, copied zero-padded (the tail).
  constexpr bool kF32 = std::is_same_v<T, float>;
  const T* a = A;
  int64_t a_rs = lda, a_ks = 1;
  if (round_bf16 || (trans_a && !kF32)) {
    s.a.resize(size_t(M * K));
    copy_rows(trans_a, round_bf16, M, K, A, lda, s.a.data(), K);
    a = s.a.data();
    a_rs = K;
  } else if (trans_a) {
    a_rs = 1;
    a_ks = lda;
  }
  constexpr int64_t W = kF32 ? VecF::kWidth : 1;
  const T* b = B;
  const T* tail = nullptr;
  if (trans_b || round_bf16) {
    const int64_t padded = (N + W - 1) / W * W;
    s.b.resize(size_t(K * padded));
    copy_rows(trans_b, round_bf16, K, N, B, ldb, s.b.data(), padded);
    b = s.b.data();
    ldb = padded;
  } else if (N % W != 0) {
    const int64_t whole = N / W * W;
    s.tail.resize(size_t(K * W));
    if constexpr (kF32) {  // one (masked) vector per row: memcpy and memset cost more per call at this size
      for (int64_t k = 0; k < K; ++k) VecF::load(B + k * ldb + whole, 1, N - whole).store(s.tail.data() + k * W);
    }
    tail = s.tail.data();
  }
  if constexpr (kF32) {
    const int64_t width = (N + W - 1) / W * W;  // whole vectors
    int64_t j0 = 0;
    for (; j0 + 2 * W <= width; j0 += 2 * W) small_rows_f32<2>(M, N, K, a, a_rs, a_ks, b, ldb, tail, j0, C, ldc, accumulate);
    if (j0 < width) small_rows_f32<1>(M, N, K, a, a_rs, a_ks, b, ldb, tail, j0, C, ldc, accumulate);
  } else {
    for (int64_t i = 0; i < M; ++i) {
      T* c = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) {  // summed apart from C, as the f32 path does
        T acc = T(0);
        for (int64_t k = 0; k < K; ++k) acc += a[i * a_rs + k] * b[k * ldb + j];
        c[j] = accumulate ? c[j] + acc : acc;
      }
    }
  }
}

template void gemm_small<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
                                float*, int64_t, bool, bool);
template void gemm_small<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*,
                                 int64_t, double*, int64_t, bool, bool);

const char* gemm_blas_backend() {
#ifdef NABLA_HAVE_OPENBLAS
  return "openblas";
#else
  return "builtin";
#endif
}

const char* gemm_backend() { return gemm_avx512_native() ? "avx512" : gemm_blas_backend(); }

template <class T>
void product(bool bf16, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
             const T* B, int64_t ldb, T* C, int64_t ldc, bool accumulate, const T* d, int64_t d_row_stride,
             int64_t d_col_stride) {
  const bool small = M * N * K <= kSmallGemmWork;
  if (d) {
    if constexpr (std::is_same_v<T, float>) {
      // No pass writing D into C first: that pass would write C's cold lines
      // once more before the GEMM reads them back.
      if (!small && d_col_stride == 1 && (bf16 || gemm_avx512_native())) {
        if (bf16) return gemm_bf16_add(trans_a, trans_b, M, N, K, A, lda, B, ldb, d, d_row_stride, C, ldc);
        return gemm_f32_avx512(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, d, d_row_stride, C, ldc);
      }
    }
    for (int64_t i = 0; i < M; ++i) {
      const T* src = d + i * d_row_stride;
      T* dst = C + i * ldc;
      if (d_col_stride == 1) {
        std::copy(src, src + N, dst);
      } else {
        for (int64_t j = 0; j < N; ++j) dst[j] = src[j * d_col_stride];
      }
    }
    accumulate = true;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (bf16) {
      if (small) return gemm_small(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, true, accumulate);
      return gemm_bf16(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc);
    }
  }
  gemm<T>(trans_a, trans_b, M, N, K, T(1), A, lda, B, ldb, accumulate ? T(1) : T(0), C, ldc);
}

template void product<float>(bool, bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
                             float*, int64_t, bool, const float*, int64_t, int64_t);
template void product<double>(bool, bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*,
                              int64_t, double*, int64_t, bool, const double*, int64_t, int64_t);

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);
template void gemm_blas<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                               const float*, int64_t, float, float*, int64_t);
template void gemm_blas<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                const double*, int64_t, double, double*, int64_t);
template void gemm_builtin<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                  int64_t, const float*, int64_t, float, float*, int64_t);
template void gemm_builtin<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                   int64_t, const double*, int64_t, double, double*, int64_t);

}  // namespace nabla::cpu
