// A 16 x 16 transpose of 32-bit words in AVX-512 registers, shared by the
// GEMM packings (gemm_avx512.cpp) and gemm_small's transposing copy.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

namespace nabla::cpu {

// The shuffles below in their zero-masking form under a full mask: the same
// instructions, but g++ 12 warns that the plain forms' undefined pass-through
// operand "may be used uninitialized".
constexpr __mmask16 kAll16 = 0xFFFF;
constexpr __mmask8 kAll8 = 0xFF;
inline __m512i unpacklo_32(__m512i a, __m512i b) { return _mm512_maskz_unpacklo_epi32(kAll16, a, b); }
inline __m512i unpackhi_32(__m512i a, __m512i b) { return _mm512_maskz_unpackhi_epi32(kAll16, a, b); }
inline __m512i unpacklo_64(__m512i a, __m512i b) { return _mm512_maskz_unpacklo_epi64(kAll8, a, b); }
inline __m512i unpackhi_64(__m512i a, __m512i b) { return _mm512_maskz_unpackhi_epi64(kAll8, a, b); }
template <int Imm>
__m512i shuffle_128(__m512i a, __m512i b) { return _mm512_maskz_shuffle_i32x4(kAll16, a, b, Imm); }

// Transposes 16 x 16 words in registers: r[i] holds row i on entry and
// column i on return (unpacks within 128-bit lanes, then lane shuffles).
inline void transpose_16x16(__m512i r[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = unpacklo_32(r[i], r[i + 1]);
    t[i + 1] = unpackhi_32(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    r[i] = unpacklo_64(t[i], t[i + 2]);
    r[i + 1] = unpackhi_64(t[i], t[i + 2]);
    r[i + 2] = unpacklo_64(t[i + 1], t[i + 3]);
    r[i + 3] = unpackhi_64(t[i + 1], t[i + 3]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[i] = shuffle_128<0x88>(r[i], r[i + 4]);
    t[i + 4] = shuffle_128<0xdd>(r[i], r[i + 4]);
    t[i + 8] = shuffle_128<0x88>(r[i + 8], r[i + 12]);
    t[i + 12] = shuffle_128<0xdd>(r[i + 8], r[i + 12]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[i] = shuffle_128<0x88>(t[i], t[i + 8]);
    r[i + 8] = shuffle_128<0xdd>(t[i], t[i + 8]);
    r[i + 4] = shuffle_128<0x88>(t[i + 4], t[i + 12]);
    r[i + 12] = shuffle_128<0xdd>(t[i + 4], t[i + 12]);
  }
}

}  // namespace nabla::cpu

#endif  // __AVX512F__
