// The AVX-512 GEMM kernels, one loop nest and micro-kernel for two
// precisions: f32 (FMAs; gemm<float> runs here where the build has them) and
// bf16 (gemm_bf16: f32 in and out, operands rounded to bfloat16, f32
// accumulation); and gemm_bf16's portable loop for other builds.
//
// The kernel follows gemm_builtin (Goto/BLIS loop order, see gemm.cpp) on
// panels of 32-bit words: an f32 word is one value, a bf16 word a pair for
// VDPBF16PS, which multiplies pairs of bf16 values and adds both products to
// an f32 lane. A bf16 word holds op(A)[i, k] and op(A)[i, k + 1] (k even, low
// half first), likewise op(B)[k, j] and op(B)[k + 1, j]; an odd depth pads
// its last pair with zero. The f32 kernel's own loop nest (rather than
// OpenBLAS) reads an addend (a bias) in its store, prefetches C in short
// products and runs the training steps' products faster (docs/performance.md).
//
// Determinism, as in gemm_builtin: every element of C sums its words in
// increasing k within depth passes of kKc, the first pass writing
// C = alpha*acc + beta*C and later ones C += alpha*acc. Edge tiles run the same
// full-size micro-kernel on zero-padded panels and only the store is masked,
// so a tile of C computed on its own is bit-identical to the same elements of
// a whole-matrix call (tests/core/gemm_test.cpp and gemm_bf16_test.cpp check
// this).
// NOTE: VDPBF16PS ignores MXCSR and treats subnormal inputs and results as
// zero, so a product or partial sum below 2^-126 in magnitude becomes zero;
// the portable loop keeps subnormals. Either path is deterministic, but the two
// are not bit-identical to each other (their summation orders differ too).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_common.h"
#include "backend/cpu/transpose_16x16.h"

// Both kernels need AVX512F, BW and BF16 (Zen 4, Sapphire Rapids); without
// them f32 goes to OpenBLAS or the built-in kernel, bf16 to the portable loop.
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define NABLA_GEMM_AVX512 1
#include <immintrin.h>
// AMX (Sapphire Rapids and later) runs the bf16 products on tile registers
// where the kernel grants the process their state (see amx_usable).
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define NABLA_GEMM_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace nabla::cpu {

float round_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t exponent = bits & 0x7F800000u;
  if (exponent == 0x7F800000u) {
    // Inf stays Inf; NaN gets the quiet bit, so a payload only in the low
    // half cannot truncate to Inf.
    if (bits & 0x007FFFFFu) bits |= 0x00400000u;
  } else if (exponent == 0) {
    bits &= 0x80000000u;  // zero or subnormal: signed zero
  } else {
    bits += 0x7FFFu + ((bits >> 16) & 1u);  // ties to even; may carry into Inf
  }
  bits &= 0xFFFF0000u;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

namespace {

#ifdef NABLA_GEMM_AVX512

// Blocking. The register tile is kMr rows x kNr columns: 24 of the 32 zmm
// registers accumulate, 2 hold a depth step of B, and each row's A word is a
// broadcast. A depth step is one 32-bit word per element: an f32 value, or a
// bf16 pair (two k). A kKc-deep x kNr panel of B (32 KiB f32, 16 KiB bf16)
// stays in L1, a kMc x kKc block of A in L2, kNc bounds the packed B. kKc
// (even, so pairs never straddle passes) also fixes the summation order.
// The rates these reach, and the other sizes tried, are in
// docs/performance.md (bench/gemm_bench.cpp).
constexpr int kMr = 12;
constexpr int kNr = 32;
constexpr int64_t kKc = 256;
constexpr int64_t kMc = kMr * 16;
constexpr int64_t kNc = 2048;

// 32-bit words per depth step of kc along k.
template <bool Bf16>
int64_t words(int64_t kc) {
  return Bf16 ? (kc + 1) / 2 : kc;
}

thread_local PackBuffer t_pack_a;
thread_local PackBuffer t_pack_b;

__mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// 32 floats (lo then hi) to 16 words of bf16 pairs, in order.
__m512i to_bf16_pairs(__m512 lo, __m512 hi) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// Four vectors' first 12 lanes (four depth steps of a kMr-wide panel, each
// 12 words) as the 48 contiguous words they are in the panel: three full
// stores where four masked 48-byte ones split half of them across lines.
struct Join12 {
  alignas(64) static constexpr int32_t kIndex[3][16] = {
      {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19},
      {4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23},
      {8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27}};
  const __m512i i0 = _mm512_load_si512(kIndex[0]), i1 = _mm512_load_si512(kIndex[1]),
                i2 = _mm512_load_si512(kIndex[2]);
  void store(__m512i v0, __m512i v1, __m512i v2, __m512i v3, void* dst) const {
    auto* d = static_cast<int32_t*>(dst);
    _mm512_storeu_si512(d, _mm512_permutex2var_epi32(v0, i0, v1));
    _mm512_storeu_si512(d + 16, _mm512_permutex2var_epi32(v1, i1, v2));
    _mm512_storeu_si512(d + 32, _mm512_permutex2var_epi32(v2, i2, v3));
  }
};

// Packs `lines` (<= width) x depth kc of a matrix whose lines are contiguous
// along k (line r at src + r * ld: rows of A, or columns of B^T) into width
// words per depth step: dst[w * width + r] = word w of line r, zero past
// `lines`. Per block of 16 words, each group of up to 16 lines is loaded (and
// rounded) into 16 vectors of words and transposed in registers, so a word's
// values of the group leave in one (masked) store, not word by word out of a
// buffer.
template <bool Bf16>
void pack_along_k(const float* src, int64_t ld, int64_t lines, int width, int64_t kc, uint32_t* dst) {
  constexpr int64_t kBlock = Bf16 ? 32 : 16;  // floats per block of 16 words
  const int64_t n_words = words<Bf16>(kc);
  for (int64_t w0 = 0; w0 < n_words; w0 += 16) {
    const int64_t k0 = w0 * kBlock / 16;
    const __mmask16 lo = first_lanes(kc - k0), hi = first_lanes(kc - k0 - 16);
    const int64_t count = std::min<int64_t>(16, n_words - w0);
    for (int g = 0; g < width; g += 16) {
      const int group = std::min(16, width - g);
      __m512i v[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        v[r] = _mm512_setzero_si512();
        if (r < group && g + r < lines) {
          const float* s = src + (g + r) * ld + k0;
          // The lines are separate streams the hardware prefetcher loses
          // track of; fetch this line two blocks ahead while this block is
          // converted.
          _mm_prefetch(reinterpret_cast<const char*>(s + 2 * kBlock), _MM_HINT_T0);
          if constexpr (Bf16) {
            _mm_prefetch(reinterpret_cast<const char*>(s + 2 * kBlock + 16), _MM_HINT_T0);
            v[r] = to_bf16_pairs(_mm512_maskz_loadu_ps(lo, s), _mm512_maskz_loadu_ps(hi, s + 16));
          } else {
            v[r] = _mm512_castps_si512(_mm512_maskz_loadu_ps(lo, s));
          }
        }
      }
      transpose_16x16(v);
      const __mmask16 keep = first_lanes(group);
#pragma GCC unroll 16
      for (int w = 0; w < 16; ++w) {
        if (w < count) _mm512_mask_storeu_epi32(dst + (w0 + w) * width + g, keep, v[w]);
      }
    }
  }
}

// Two rows of 16 floats (k and k + 1 of 16 lines) as 16 words of bf16
// pairs, word j holding line j's pair: bf16 j of row k low, of row k + 1 high.
inline __m512i interleave_pairs(__m512 row0, __m512 row1) {
  alignas(64) static constexpr int16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), to_bf16_pairs(row0, row1));
}

// Packs depth kc x `lines` of a matrix whose rows (along k) are contiguous
// across lines (row k at src + k * ld: B, or A^T) into panels of width lines,
// each in pack_along_k's layout, panel q at dst + q * words * width. A bf16
// pair interleaves rows k and k + 1 word by word; rows are read in order, once.
template <bool Bf16>
void pack_across_k(const float* src, int64_t ld, int64_t lines, int width, int64_t kc, uint32_t* dst) {
  constexpr int64_t kStep = Bf16 ? 2 : 1;  // rows per word
  const int64_t n_words = words<Bf16>(kc);
  int64_t k = 0;
  static_assert(kMr == 12, "the join below packs 12-wide panels");
  if (width == kMr) {
    // A^T's kMr-wide panels, four words (depth steps) at a time: three full
    // stores a panel (Join12) and each line fetched eight words ahead, where
    // word by word each step is a masked store, often split across two lines.
    const Join12 join;
    const int64_t full = lines / 12 * 12;
    const auto word = [&](const float* row, int64_t q0, __mmask16 load) {
      const __m512 f0 = _mm512_maskz_loadu_ps(load, row + q0);
      if constexpr (Bf16) return interleave_pairs(f0, _mm512_maskz_loadu_ps(load, row + ld + q0));
      return _mm512_castps_si512(f0);
    };
    for (; k + 4 * kStep <= kc && full > 0; k += 4 * kStep) {
      const float* row = src + k * ld;
      uint32_t* d = dst + k / kStep * 12;
      for (int64_t q0 = 0; q0 < full; q0 += 12, d += n_words * 12) {
        for (int r = 0; r < 4 * kStep; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(row + (8 * kStep + r) * ld + q0), _MM_HINT_T0);
        }
        join.store(word(row, q0, 0x0FFF), word(row + kStep * ld, q0, 0x0FFF), word(row + 2 * kStep * ld, q0, 0x0FFF),
                   word(row + 3 * kStep * ld, q0, 0x0FFF), d);
      }
      for (int w = 0; w < 4 && full < lines; ++w) {  // the ragged last panel
        _mm512_mask_storeu_epi32(d + w * 12, first_lanes(12), word(row + w * kStep * ld, full, first_lanes(lines - full)));
      }
    }
  }
  for (; k < kc; k += kStep) {
    const float* row0 = src + k * ld;
    const float* row1 = Bf16 && k + 1 < kc ? row0 + ld : nullptr;
    uint32_t* d = dst + k / kStep * width;
    for (int64_t q0 = 0; q0 < lines; q0 += width, d += n_words * width) {
      for (int c = 0; c < width; c += 16) {
        // Rows two words ahead, while this word is converted.
        _mm_prefetch(reinterpret_cast<const char*>(row0 + 2 * kStep * ld + q0 + c), _MM_HINT_T0);
        if constexpr (Bf16) _mm_prefetch(reinterpret_cast<const char*>(row0 + 5 * ld + q0 + c), _MM_HINT_T0);
        const __mmask16 load = first_lanes(lines - q0 - c);
        const __m512 f0 = _mm512_maskz_loadu_ps(load, row0 + q0 + c);
        __m512i v;
        if constexpr (Bf16) {
          const __m512 f1 = row1 ? _mm512_maskz_loadu_ps(load, row1 + q0 + c) : _mm512_setzero_ps();
          v = interleave_pairs(f0, f1);
        } else {
          v = _mm512_castps_si512(f0);
        }
        _mm512_mask_storeu_epi32(d + c, first_lanes(width - c), v);
      }
    }
  }
}

// Packs rows [i0, i0 + mc) x depth [p0, p0 + kc) of op(A) into micro-panels
// of kMr rows, each words(kc) x kMr words.
template <bool Bf16>
void pack_a(bool trans, const float* A, int64_t lda, int64_t i0, int64_t p0, int64_t mc, int64_t kc,
            uint32_t* dst) {
  if (trans) {  // A is [K, M]
    pack_across_k<Bf16>(A + p0 * lda + i0, lda, mc, kMr, kc, dst);
    return;
  }
  const int64_t n_words = words<Bf16>(kc);
  for (int64_t ir = 0; ir < mc; ir += kMr, dst += n_words * kMr)
    pack_along_k<Bf16>(A + (i0 + ir) * lda + p0, lda, std::min<int64_t>(kMr, mc - ir), kMr, kc, dst);
}

// Packs depth [p0, p0 + kc) x columns [j0, j0 + nc) of op(B) into
// micro-panels of kNr columns, each words(kc) x kNr words.
template <bool Bf16>
void pack_b(bool trans, const float* B, int64_t ldb, int64_t p0, int64_t j0, int64_t kc, int64_t nc,
            uint32_t* dst) {
  if (!trans) {
    pack_across_k<Bf16>(B + p0 * ldb + j0, ldb, nc, kNr, kc, dst);
    return;
  }
  const int64_t n_words = words<Bf16>(kc);  // B is [N, K]
  for (int64_t jr = 0; jr < nc; jr += kNr, dst += n_words * kNr)
    pack_along_k<Bf16>(B + (j0 + jr) * ldb + p0, ldb, std::min<int64_t>(kNr, nc - jr), kNr, kc, dst);
}

// c = alpha * acc + beta * d in the lanes of mask (beta == 0: d unread).
// Explicit FMAs, so that no element depends on whether the compiler contracts.
inline void store_acc(__m512 acc, __mmask16 mask, float alpha, float beta, const float* d, float* c) {
  const __m512 va = _mm512_set1_ps(alpha);
  __m512 r;
  if (beta == 1.0f) {
    r = _mm512_fmadd_ps(va, acc, _mm512_maskz_loadu_ps(mask, d));
  } else {
    r = _mm512_mul_ps(va, acc);
    if (beta != 0.0f) r = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, d), r);
  }
  _mm512_mask_storeu_ps(c, mask, r);
}

// C[rows, cols] (leading dimension ldc) = alpha * a * b + beta * D for
// micro-panels a and b of n_words depth steps, where D (leading dimension
// ldd, 0 for one row read by every row) is C itself or a separate addend.
// Step w's kMr words of a are at a + w * a_step: kMr when packed, lda for an
// f32 A^T read in place; b is packed. A step is an FMA of f32 words, or
// (Bf16) a VDPBF16PS of bf16 pairs. The kernel computes Rows x 16 Vecs of the kMr x kNr panels (rows <= Rows, cols
// <= 16 Vecs), only the store cut to rows x cols: an edge tile takes the
// smallest variant that covers it, where the full one multiplied padding
// (attention's 197 x 197 scores: 224 columns and 204 rows computed for 197).
// Each element sums its steps in the same order in every variant, so the bits
// are the same. beta == 0 overwrites C.
template <bool Bf16, int Rows, int Vecs>
void micro_kernel(int64_t n_words, const uint32_t* __restrict a, int64_t a_step, const uint32_t* __restrict b,
                  float alpha, float beta, const float* D, int64_t ldd, float* C, int64_t ldc, int64_t rows,
                  int64_t cols) {
  static_assert(Rows <= kMr && Vecs * 16 <= kNr);
  // The tile of C is written (and D read) only after the k loop; their lines
  // are fetched now, so that a tile not in cache (a step's output lands in a
  // buffer last touched long ago) arrives while the loop computes.
#pragma GCC unroll 12
  for (int i = 0; i < Rows; ++i) {
    if (i < rows) {
#pragma GCC unroll 2
      for (int v = 0; v < Vecs; ++v) _mm_prefetch(reinterpret_cast<const char*>(C + i * ldc + 16 * v), _MM_HINT_T0);
    }
  }
  __m512 acc[Rows][Vecs];
#pragma GCC unroll 12
  for (int i = 0; i < Rows; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (int64_t w = 0; w < n_words; ++w, a += a_step, b += kNr) {
    __m512i bv[Vecs];
#pragma GCC unroll 2
    for (int v = 0; v < Vecs; ++v) bv[v] = _mm512_load_si512(b + 16 * v);
#pragma GCC unroll 12
    for (int i = 0; i < Rows; ++i) {
      if constexpr (Bf16) {
        const __m512bh ai = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[i])));
#pragma GCC unroll 2
        for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], reinterpret_cast<__m512bh>(bv[v]), ai);
      } else {
        float ai;
        std::memcpy(&ai, a + i, sizeof ai);
        const __m512 av = _mm512_set1_ps(ai);
#pragma GCC unroll 2
        for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_fmadd_ps(av, _mm512_castsi512_ps(bv[v]), acc[i][v]);
      }
    }
  }
  __mmask16 mask[Vecs];
#pragma GCC unroll 2
  for (int v = 0; v < Vecs; ++v) mask[v] = first_lanes(cols - 16 * v);
#pragma GCC unroll 12
  for (int i = 0; i < Rows; ++i) {
    if (i >= rows) break;
#pragma GCC unroll 2
    for (int v = 0; v < Vecs; ++v) {
      store_acc(acc[i][v], mask[v], alpha, beta, D + i * ldd + 16 * v, C + i * ldc + 16 * v);
    }
  }
}

// Depth passes shorter than this (in k) prefetch C a tile ahead.
constexpr int64_t kShortDepth = 128;

// The micro-kernel variant for a tile of rows x cols (at most kMr x kNr).
template <bool Bf16>
void micro_kernel(int64_t n_words, const uint32_t* a, int64_t a_step, const uint32_t* b, float alpha, float beta,
                  const float* D, int64_t ldd, float* C, int64_t ldc, int64_t rows, int64_t cols) {
  if (cols > 16) {
    if (rows > 8) return micro_kernel<Bf16, 12, 2>(n_words, a, a_step, b, alpha, beta, D, ldd, C, ldc, rows, cols);
    if (rows > 4) return micro_kernel<Bf16, 8, 2>(n_words, a, a_step, b, alpha, beta, D, ldd, C, ldc, rows, cols);
    return micro_kernel<Bf16, 4, 2>(n_words, a, a_step, b, alpha, beta, D, ldd, C, ldc, rows, cols);
  }
  if (rows > 8) return micro_kernel<Bf16, 12, 1>(n_words, a, a_step, b, alpha, beta, D, ldd, C, ldc, rows, cols);
  if (rows > 4) return micro_kernel<Bf16, 8, 1>(n_words, a, a_step, b, alpha, beta, D, ldd, C, ldc, rows, cols);
  micro_kernel<Bf16, 4, 1>(n_words, a, a_step, b, alpha, beta, D, ldd, C, ldc, rows, cols);
}

// op(B) [K, N] packed ahead of the product (PackedB; bf16 pairs only for
// products of its full depth: a shorter prefix could pair its last k with
// the one after it): pass (jc, pc)'s micro-panels, each packed with the
// pass's full depth, at packed_pass().
struct Prepacked {
  const uint32_t* words = nullptr;
  int64_t K = 0, N = 0;
};

// Where pass (jc, pc) of a whole op(B) [K, N] starts: the column blocks
// before it (kNc wide, a multiple of kNr) whole, then the depth before pc of
// this block's padded width.
template <bool Bf16>
int64_t packed_pass(int64_t K, int64_t N, int64_t jc, int64_t pc) {
  const int64_t width = (std::min(kNc, N - jc) + kNr - 1) / kNr * kNr;
  return jc * words<Bf16>(K) + width * words<Bf16>(pc);
}

// C = alpha op(A) op(B) + beta D, D [M, N] with leading dimension ldd (C
// itself for plain GEMM; read by the first depth pass only). With prepacked,
// op(B) is its first K rows and N columns and B is unread.
template <bool Bf16>
void blocked_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, const float* D, int64_t ldd, float* C,
                  int64_t ldc, const Prepacked& prepacked = {}) {
  const int64_t nc_max = (std::min(kNc, N) + kNr - 1) / kNr * kNr;
  const int64_t mc_max = (std::min(kMc, M) + kMr - 1) / kMr * kMr;
  const int64_t words_max = words<Bf16>(std::min(kKc, K));
  uint32_t* pa = t_pack_a.get<uint32_t>(mc_max * words_max);
  uint32_t* pb = prepacked.words ? nullptr : t_pack_b.get<uint32_t>(nc_max * words_max);
  // An f32 A^T ([K, M]: a weight gradient's X) already holds each depth step
  // of a micro-panel as kMr contiguous floats, lda apart, which the kernel
  // broadcasts in place instead of packing A: worth it where few panels of B
  // would reuse a packed copy (N up to 8 panels), and unless lda is a
  // multiple of 128 floats, where a panel's kc lines fall into 8 or fewer of
  // L1's 64 sets and evict each other. A ([M, K]) read in place, its kMr rows
  // as kMr streams, is slower than packed (docs/performance.md).
  const bool direct_a = !Bf16 && trans_a && N <= 8 * kNr && lda % 128 != 0;
  for (int64_t jc = 0; jc < N; jc += kNc) {
    const int64_t nc = std::min(kNc, N - jc);
    for (int64_t pc = 0; pc < K; pc += kKc) {
      const int64_t kc = std::min(kKc, K - pc);
      const int64_t n_words = words<Bf16>(kc);
      // Later passes add onto C itself.
      const float pass_beta = pc == 0 ? beta : 1.0f;
      const float* pass_d = pc == 0 ? D : C;
      const int64_t pass_ldd = pc == 0 ? ldd : ldc;
      const uint32_t* pass_b = pb;
      int64_t panel_words = n_words * kNr;  // between micro-panels of B
      if (prepacked.words) {
        pass_b = prepacked.words + packed_pass<Bf16>(prepacked.K, prepacked.N, jc, pc);
        panel_words = words<Bf16>(std::min(kKc, prepacked.K - pc)) * kNr;
      } else {
        pack_b<Bf16>(trans_b, B, ldb, pc, jc, kc, nc, pb);
      }
      for (int64_t ic = 0; ic < M; ic += kMc) {
        const int64_t mc = std::min(kMc, M - ic);
        // With direct_a, full panels in place and a ragged last one packed (zero rows).
        const int64_t mc_direct = direct_a ? mc / kMr * kMr : 0;
        if (!direct_a) {
          pack_a<Bf16>(trans_a, A, lda, ic, pc, mc, kc, pa);
        } else if (mc_direct < mc) {
          pack_a<Bf16>(trans_a, A, lda, ic + mc_direct, pc, mc - mc_direct, kc, pa);
        }
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          const uint32_t* b = pass_b + jr / kNr * panel_words;
          for (int64_t ir = 0; ir < mc; ir += kMr) {
            const int64_t i = ic + ir, j = jc + jr;
            // The next tile's C, a whole tile ahead, in a short product
            // (attention's scores, K 64): its tile computes for less time than
            // cold lines take to arrive when the micro-kernel requests them
            // (longer products gain nothing from it).
            // The next tile is the one below, or the top of the next panel.
            const bool below = ir + kMr < mc;
            const int64_t ni = below ? i + kMr : ic, nj = below ? j : j + kNr;
            if (kc < kShortDepth && nj < jc + nc) {
              constexpr int64_t f = sizeof(float);
              prefetch_matrix(C + ni * ldc + nj, std::min<int64_t>(kMr, ic + mc - ni),
                              std::min<int64_t>(kNr, jc + nc - nj) * f, ldc * f, true);
            }
            const uint32_t* a = pa + (ir - mc_direct) * n_words;
            int64_t a_step = kMr;
            if (ir < mc_direct) {
              a = reinterpret_cast<const uint32_t*>(A + pc * lda + i);
              a_step = lda;
            }
            micro_kernel<Bf16>(n_words, a, a_step, b, alpha, pass_beta, pass_d + i * pass_ldd + j, pass_ldd,
                               C + i * ldc + j, ldc, mc - ir, nc - jr);
          }
        }
      }
    }
  }
}

// One row of A (M = 1: a decoding step's token against a weight): C[1, N] =
// alpha x op(B) + beta D with the arithmetic of blocked_gemm (each element
// one FMA chain in increasing k per depth pass of kKc, stored by store_acc),
// so its bits are those of the same row of a whole-matrix product; but B is
// read in place, once, where blocked_gemm copies it into panels first (for
// one row, all of its traffic again). op(B) = B^T (a weight [N, K], the
// usual case) reads 16 rows of B at a time, each 16 k a 16 x 16 block
// transposed in registers; op(B) = B reads 16 columns of each row of B.
void gemv_f32(bool trans_a, bool trans_b, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, const float* D, float* C) {
  thread_local std::vector<float> x_buf;
  const float* x = A;
  if (trans_a && lda != 1) {  // A^T stored [K, 1]: its column, gathered
    x_buf.resize(size_t(K));
    for (int64_t k = 0; k < K; ++k) x_buf[size_t(k)] = A[k * lda];
    x = x_buf.data();
  }
  for (int64_t j0 = 0; j0 < N; j0 += 16) {
    const int64_t cols = std::min<int64_t>(16, N - j0);
    const __mmask16 mask = first_lanes(cols);
    for (int64_t pc = 0; pc < K; pc += kKc) {
      const int64_t kc = std::min(kKc, K - pc);
      __m512 acc = _mm512_setzero_ps();
      if (trans_b) {
        for (int64_t k0 = 0; k0 < kc; k0 += 16) {
          const int64_t depth = std::min<int64_t>(16, kc - k0);
          const __mmask16 kmask = first_lanes(depth);
          __m512i r[16];
#pragma GCC unroll 16
          for (int i = 0; i < 16; ++i) {
            const float* row = B + (j0 + i) * ldb + pc + k0;
            if (i < cols) {
              _mm_prefetch(reinterpret_cast<const char*>(row + 128), _MM_HINT_T0);
              r[i] = _mm512_castps_si512(_mm512_maskz_loadu_ps(kmask, row));
            } else {
              r[i] = _mm512_setzero_si512();
            }
          }
          transpose_16x16(r);  // r[kk]: op(B)[pc + k0 + kk, j0 .. j0 + 15]
          for (int64_t kk = 0; kk < depth; ++kk) {
            acc = _mm512_fmadd_ps(_mm512_set1_ps(x[pc + k0 + kk]), _mm512_castsi512_ps(r[kk]), acc);
          }
        }
      } else {
        for (int64_t k = pc; k < pc + kc; ++k) {
          acc = _mm512_fmadd_ps(_mm512_set1_ps(x[k]), _mm512_maskz_loadu_ps(mask, B + k * ldb + j0), acc);
        }
      }
      // Later passes add onto C itself, as blocked_gemm's.
      store_acc(acc, mask, alpha, pc == 0 ? beta : 1.0f, (pc == 0 ? D : C) + j0, C + j0);
    }
  }
}

#ifdef NABLA_GEMM_AMX

// The bf16 GEMM on AMX tiles: TDPBF16PS multiplies a 16-row x 16-pair tile
// of A by a 16-pair x 16-column tile of B (pairs as in the word layout
// above) into a 16 x 16 f32 tile of C, 16 times the multiply-adds of a
// VDPBF16PS. Eight tile registers hold a 32 x 32 block of C (tmm0-3), two
// tiles of A (tmm4-5) and two of B (tmm6-7). Blocking and summation order
// follow blocked_gemm: depth passes of kKc, each pass's products summed in
// increasing k within the tile, the first pass writing alpha*acc + beta*D and
// later ones adding onto C; A and B are zero-padded to whole tiles (32 rows,
// 32 columns, 16 pairs), so an element's sum depends on K alone and a tile
// of C computed alone is bit-identical to a whole-matrix call.
constexpr int64_t kAmxBlock = 32;  // rows and columns of C per block of 4 tiles
constexpr int64_t kAmxPairs = 16;  // words (bf16 pairs) per tile step

// Linux grants a process AMX's tile state only on request; NABLA_AMX=0
// keeps the VDPBF16PS kernel (to compare the two, or on a kernel that refuses).
bool amx_usable() {
  static const bool usable = [] {
    const char* env = std::getenv("NABLA_AMX");
    if (env && std::strcmp(env, "0") == 0) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}

// The LDTILECFG layout (palette 1): every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Rows [0, rows) x depth kc of op(A) (at A: row i's k at A[i * lda + k], or
// for trans A^T[k * lda + i]) as bf16 pairs in a row-major [rows_pad, padded]
// block (padded words a row, a multiple of kAmxPairs), zero past the data.
void amx_pack_a(bool trans, const float* A, int64_t lda, int64_t rows, int64_t rows_pad, int64_t kc,
                int64_t padded, uint32_t* dst) {
  if (!trans) {
    for (int64_t i = 0; i < rows_pad; ++i) {
      uint32_t* d = dst + i * padded;
      for (int64_t w0 = 0; w0 < padded; w0 += 16) {
        const int64_t k0 = 2 * w0;
        __m512i v = _mm512_setzero_si512();
        if (i < rows && k0 < kc) {
          const float* s = A + i * lda + k0;
          v = to_bf16_pairs(_mm512_maskz_loadu_ps(first_lanes(kc - k0), s),
                            _mm512_maskz_loadu_ps(first_lanes(kc - k0 - 16), s + 16));
        }
        _mm512_storeu_si512(d + w0, v);
      }
    }
    return;
  }
  // A^T: rows k and k + 1 of 16 lines interleave into a vector of 16 words
  // (word j: line j's pair), 16 such vectors are transposed in registers
  // into 16 rows of A of 16 words each.
  for (int64_t i0 = 0; i0 < rows_pad; i0 += 16) {
    const int64_t lines = std::max<int64_t>(0, std::min<int64_t>(16, rows - i0));
    const __mmask16 mask = first_lanes(lines);
    for (int64_t w0 = 0; w0 < padded; w0 += 16) {
      __m512i v[16];
#pragma GCC unroll 16
      for (int w = 0; w < 16; ++w) {
        const int64_t k = 2 * (w0 + w);
        const float* row = A + k * lda + i0;
        const __m512 f0 = k < kc ? _mm512_maskz_loadu_ps(mask, row) : _mm512_setzero_ps();
        const __m512 f1 = k + 1 < kc ? _mm512_maskz_loadu_ps(mask, row + lda) : _mm512_setzero_ps();
        v[w] = interleave_pairs(f0, f1);
      }
      transpose_16x16(v);
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) _mm512_storeu_si512(dst + (i0 + r) * padded + w0, v[r]);
    }
  }
}

// Columns [0, cols) x depth kc of op(B) (at B: B[k * ldb + j], or for trans
// B^T[j * ldb + k]) as cols_pad / 16 panels of 16 columns and padded words,
// panel q at dst + q * padded * 16 with word w of column c at [w * 16 + c]
// (a TDPBF16PS B tile per 16 words), zero past the data.
void amx_pack_b(bool trans, const float* B, int64_t ldb, int64_t cols, int64_t cols_pad, int64_t kc,
                int64_t padded, uint32_t* dst) {
  for (int64_t j0 = 0; j0 < cols_pad; j0 += 16) {
    uint32_t* d = dst + j0 * padded;
    const int64_t lines = std::min<int64_t>(16, cols - j0);
    int64_t filled = 0;
    if (lines > 0) {
      if (trans) {
        pack_along_k<true>(B + j0 * ldb, ldb, lines, 16, kc, d);
      } else {
        pack_across_k<true>(B + j0, ldb, lines, 16, kc, d);
      }
      filled = words<true>(kc);
    }
    std::memset(d + filled * 16, 0, static_cast<size_t>(padded - filled) * 16 * sizeof(uint32_t));
  }
}

void amx_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, const float* D, int64_t ldd, float* C,
                   int64_t ldc) {
  const auto round_up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  const int64_t words_max = round_up(words<true>(std::min(kKc, K)), kAmxPairs);
  const int64_t mc_max = round_up(std::min(kMc, M), kAmxBlock), nc_max = round_up(std::min(kNc, N), kAmxBlock);
  uint32_t* pa = t_pack_a.get<uint32_t>(mc_max * words_max);
  uint32_t* pb = t_pack_b.get<uint32_t>(nc_max * words_max);
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
  alignas(64) float acc[kAmxBlock * kAmxBlock];
  for (int64_t jc = 0; jc < N; jc += kNc) {
    const int64_t nc = std::min(kNc, N - jc), nc_pad = round_up(nc, kAmxBlock);
    for (int64_t pc = 0; pc < K; pc += kKc) {
      const int64_t kc = std::min(kKc, K - pc), n_words = round_up(words<true>(kc), kAmxPairs);
      const float pass_beta = pc == 0 ? beta : 1.0f;
      const float* pass_d = pc == 0 ? D : C;
      const int64_t pass_ldd = pc == 0 ? ldd : ldc;
      amx_pack_b(trans_b, trans_b ? B + jc * ldb + pc : B + pc * ldb + jc, ldb, nc, nc_pad, kc, n_words, pb);
      for (int64_t ic = 0; ic < M; ic += kMc) {
        const int64_t mc = std::min(kMc, M - ic), mc_pad = round_up(mc, kAmxBlock);
        amx_pack_a(trans_a, trans_a ? A + pc * lda + ic : A + ic * lda + pc, lda, mc, mc_pad, kc, n_words, pa);
        for (int64_t jr = 0; jr < nc_pad; jr += kAmxBlock) {
          const uint32_t* b0 = pb + jr * n_words;
          const uint32_t* b1 = b0 + 16 * n_words;
          for (int64_t ir = 0; ir < mc_pad; ir += kAmxBlock) {
            const uint32_t* a0 = pa + ir * n_words;
            const uint32_t* a1 = a0 + 16 * n_words;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t w = 0; w < n_words; w += kAmxPairs) {
              _tile_loadd(4, a0 + w, n_words * 4);
              _tile_loadd(5, a1 + w, n_words * 4);
              _tile_loadd(6, b0 + w * 16, 64);
              _tile_loadd(7, b1 + w * 16, 64);
              _tile_dpbf16ps(0, 4, 6);
              _tile_dpbf16ps(1, 4, 7);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, acc, kAmxBlock * 4);
            _tile_stored(1, acc + 16, kAmxBlock * 4);
            _tile_stored(2, acc + 16 * kAmxBlock, kAmxBlock * 4);
            _tile_stored(3, acc + 16 * kAmxBlock + 16, kAmxBlock * 4);
            const int64_t i = ic + ir, j = jc + jr;
            const int64_t rows = std::min(kAmxBlock, mc - ir), cols = std::min(kAmxBlock, nc - jr);
            const __mmask16 m0 = first_lanes(cols), m1 = first_lanes(cols - 16);
            for (int64_t r = 0; r < rows; ++r) {
              const float* d = pass_d + (i + r) * pass_ldd + j;
              float* c = C + (i + r) * ldc + j;
              const float* row = acc + r * kAmxBlock;
              store_acc(_mm512_load_ps(row), m0, alpha, pass_beta, d, c);
              if (cols > 16) store_acc(_mm512_load_ps(row + 16), m1, alpha, pass_beta, d + 16, c + 16);
            }
          }
        }
      }
    }
  }
  _tile_release();
}

#endif  // NABLA_GEMM_AMX

void gemm_bf16_kernel(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                      const float* D, int64_t ldd, float* C, int64_t ldc) {
#ifdef NABLA_GEMM_AMX
  if (amx_usable()) return amx_gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, D, ldd, C, ldc);
#endif
  blocked_gemm<true>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, D, ldd, C, ldc);
}

#else  // portable

// Rounds op(A) and op(B)^T once into rows along k, then each element sums its
// products in increasing k: no blocking, so tiles are trivially bit-identical
// to a whole-matrix call.
void gemm_bf16_kernel(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                      const float* D, int64_t ldd, float* C, int64_t ldc) {
  std::vector<float> a(M * K), bt(N * K);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t k = 0; k < K; ++k)
      a[i * K + k] = round_to_bf16(trans_a ? A[k * lda + i] : A[i * lda + k]);
  }
  for (int64_t j = 0; j < N; ++j) {
    for (int64_t k = 0; k < K; ++k)
      bt[j * K + k] = round_to_bf16(trans_b ? B[j * ldb + k] : B[k * ldb + j]);
  }
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += a[i * K + k] * bt[j * K + k];  // exact products
      const float d = beta == 0.0f ? 0.0f : D[i * ldd + j];
      C[i * ldc + j] = beta == 0.0f ? alpha * acc : alpha * acc + beta * d;
    }
  }
}

#endif

// C = beta D (C itself, or an addend): a product with nothing to multiply.
void scale_into(int64_t M, int64_t N, float beta, const float* D, int64_t ldd, float* C, int64_t ldc) {
  if (D == C && ldd == ldc) return scale_c(M, N, beta, C, ldc);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * D[i * ldd + j];
  }
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  if (trivial_product(M, N, K, alpha, beta, C, ldc)) return;
  gemm_bf16_kernel(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, C, ldc);
}

void gemm_bf16_add(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                   const float* B, int64_t ldb, const float* D, int64_t ldd, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return scale_into(M, N, 1.0f, D, ldd, C, ldc);
  gemm_bf16_kernel(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, D, ldd, C, ldc);
}

void gemm_f32_avx512(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                     int64_t lda, const float* B, int64_t ldb, float beta, const float* D, int64_t ldd, float* C,
                     int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.0f) return scale_into(M, N, beta, D, ldd, C, ldc);
#ifdef NABLA_GEMM_AVX512
  if (M == 1) return gemv_f32(trans_a, trans_b, N, K, alpha, A, lda, B, ldb, beta, D, C);
  blocked_gemm<false>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, D, ldd, C, ldc);
#else
  if (beta != 0.0f && (D != C || ldd != ldc)) {
    scale_into(M, N, 1.0f, D, ldd, C, ldc);
  }
  gemm_builtin<float>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

bool PackedB::pack(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb, bool bf16) {
#ifdef NABLA_GEMM_AVX512
  // bf16 products on AMX tiles sum in another order than this kernel's.
  if (bf16 && std::strcmp(gemm_bf16_backend(), "avx512") != 0) return false;
  const int64_t width = (N + kNr - 1) / kNr * kNr;  // every column block padded
  const int64_t depth = bf16 ? words<true>(K) : K;
  uint32_t* dst = buffer_.get<uint32_t>(std::max<int64_t>(1, width * depth));
  for (int64_t jc = 0; jc < N; jc += kNc) {
    for (int64_t pc = 0; pc < K; pc += kKc) {
      const int64_t kc = std::min(kKc, K - pc), nc = std::min(kNc, N - jc);
      if (bf16) {
        pack_b<true>(trans_b, B, ldb, pc, jc, kc, nc, dst + packed_pass<true>(K, N, jc, pc));
      } else {
        pack_b<false>(trans_b, B, ldb, pc, jc, kc, nc, dst + packed_pass<false>(K, N, jc, pc));
      }
    }
  }
  words_ = dst;
  K_ = K;
  N_ = N;
  bf16_ = bf16;
  return true;
#else
  (void)trans_b, (void)K, (void)N, (void)B, (void)ldb, (void)bf16;
  return false;
#endif
}

void PackedB::multiply(bool trans_a, int64_t M, int64_t n, int64_t k, const float* A, int64_t lda, float* C,
                       int64_t ldc) const {
  if (M <= 0 || n <= 0) return;
  if (k <= 0) return scale_c(M, n, 0.0f, C, ldc);
#ifdef NABLA_GEMM_AVX512
  if (bf16_) {
    if (k != K_) throw std::logic_error("PackedB: a bf16 product must use the packed depth whole");
    return blocked_gemm<true>(trans_a, false, M, n, k, 1.0f, A, lda, nullptr, 0, 0.0f, C, ldc, C, ldc,
                              Prepacked{words_, K_, N_});
  }
  blocked_gemm<false>(trans_a, false, M, n, k, 1.0f, A, lda, nullptr, 0, 0.0f, C, ldc, C, ldc,
                      Prepacked{words_, K_, N_});
#else
  (void)trans_a, (void)A, (void)lda;
#endif
}

void round_to_bf16(float* x, int64_t n) {
#ifdef NABLA_GEMM_AVX512
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(n - i);
    const __m256i half = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i)));
    const __m512i wide = _mm512_maskz_slli_epi32(kAll16, _mm512_maskz_cvtepu16_epi32(kAll16, half), 16);
    _mm512_mask_storeu_ps(x + i, m, _mm512_castsi512_ps(wide));
  }
#else
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
#endif
}

bool gemm_avx512_native() {
#ifdef NABLA_GEMM_AVX512
  return true;
#else
  return false;
#endif
}

const char* gemm_bf16_backend() {
#ifdef NABLA_GEMM_AMX
  if (amx_usable()) return "amx";
#endif
  return gemm_avx512_native() ? "avx512" : "portable";
}

}  // namespace nabla::cpu
