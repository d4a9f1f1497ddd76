// One SIMD vector type for the f32 kernels, and the elementary functions they
// need (exp, tanh, erf, sigmoid) written once on it.
//
// Vec<float> holds kWidth lanes: 16 with AVX-512F, 8 with AVX2 + FMA, else 4
// (SSE2 or NEON). It is a GCC/Clang vector extension, so arithmetic and
// comparisons are plain operators; only FMA uses an intrinsic (ISO C++ builds
// do not contract a * b + c). Where the target has no 16-byte SIMD the
// compiler lowers the same code to scalar loops: that is the fallback.
//
// Every operation here is lane-wise, so an element's result does not depend
// on its lane or on what the other lanes hold: kernels built on it are
// bit-identical whatever their chunking, and strided and contiguous layouts
// give the same bits (kernels gather strided data into a vector).
//
// f64 kernels keep std:: functions: they are the reference the f32 kernels
// are checked against (rtol 1e-3), so the approximations below only need to
// be a few ulp from the correctly rounded f32 value; each states its bound,
// checked by tests/core/simd_test.cpp against the f64 functions.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#elif defined(__SSE__)
#include <xmmintrin.h>
#endif
#if defined(__AVX512F__)
#include "backend/cpu/transpose_16x16.h"
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
#include <arm_neon.h>
#endif

namespace nabla::cpu {

#if defined(__AVX512F__)
inline constexpr int kSimdBytes = 64;
#elif defined(__AVX2__) && defined(__FMA__)
inline constexpr int kSimdBytes = 32;
#else
inline constexpr int kSimdBytes = 16;
#endif

template <class T>
struct Vec;

template <>
struct Vec<float> {
  static constexpr int kWidth = kSimdBytes / static_cast<int>(sizeof(float));
  using Raw = float __attribute__((vector_size(kSimdBytes)));
  using Bits = int32_t __attribute__((vector_size(kSimdBytes)));

  Raw v;

  Vec() = default;
  Vec(Raw r) : v(r) {}            // NOLINT: implicit by design
  // s - 0 rather than 0 + s: the same value for every s (signed zeros
  // included), so the compiler drops the subtraction and only broadcasts;
  // 0 + s turns -0 into +0 and costs an add each time.
  Vec(float s) : v(s - Raw{}) {}  // NOLINT: broadcast
  static Vec load(const float* p) {
    Raw r;
    std::memcpy(&r, p, sizeof r);  // unaligned load
    return r;
  }
  void store(float* p) const { std::memcpy(p, &v, sizeof v); }
  // Lanes [0, n) from p[i * stride] (n <= kWidth); the other lanes are 0
  // and their memory is not touched.
  static Vec load(const float* p, int64_t stride, int64_t n) {
    if (stride == 1 && n == kWidth) return load(p);
    if (stride == 0) return Vec(*p);
#if defined(__AVX512F__)
    if (stride == 1) return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
#endif
    alignas(kSimdBytes) float buf[kWidth] = {};
    for (int64_t i = 0; i < n; ++i) buf[i] = p[i * stride];
    return load(buf);
  }
  // Writes lanes [0, n) to p[0, n).
  void store(float* p, int64_t n) const {
    if (n == kWidth) return store(p);
#if defined(__AVX512F__)
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
#else
    alignas(kSimdBytes) float buf[kWidth];
    store(buf);
    std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(float));
#endif
  }
  float operator[](int i) const { return v[i]; }
};

using VecF = Vec<float>;

inline VecF operator+(VecF a, VecF b) { return a.v + b.v; }
inline VecF operator-(VecF a, VecF b) { return a.v - b.v; }
inline VecF operator*(VecF a, VecF b) { return a.v * b.v; }
inline VecF operator/(VecF a, VecF b) { return a.v / b.v; }
inline VecF operator-(VecF a) { return -a.v; }
inline VecF& operator+=(VecF& a, VecF b) { return a = a + b; }
inline VecF& operator*=(VecF& a, VecF b) { return a = a * b; }

// Lane masks: all ones where the comparison holds (false for NaN, except !=).
using MaskF = VecF::Bits;
inline MaskF operator<(VecF a, VecF b) { return a.v < b.v; }
inline MaskF operator>(VecF a, VecF b) { return a.v > b.v; }
inline MaskF operator>=(VecF a, VecF b) { return a.v >= b.v; }
inline MaskF operator!=(VecF a, VecF b) { return a.v != b.v; }
// m ? a : b, lane by lane.
inline VecF select(MaskF m, VecF a, VecF b) { return m ? a.v : b.v; }

inline MaskF bits(VecF a) {
  MaskF r;
  std::memcpy(&r, &a.v, sizeof r);
  return r;
}
inline VecF from_bits(MaskF b) {
  VecF::Raw r;
  std::memcpy(&r, &b, sizeof r);
  return r;
}

// a * b + c with one rounding.
inline VecF fma(VecF a, VecF b, VecF c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a.v, b.v, c.v);
#elif defined(__AVX2__) && defined(__FMA__)
  return _mm256_fmadd_ps(a.v, b.v, c.v);
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
  return vfmaq_f32(c.v, a.v, b.v);
#else
  return a * b + c;
#endif
}

// Correctly rounded square root, lane by lane (as std::sqrt).
inline VecF sqrt(VecF a) {
#if defined(__AVX512F__)
  // NOTE: the masked form with every lane set: g++ 12 warns that
  // _mm512_sqrt_ps's undefined pass-through may be used.
  return _mm512_mask_sqrt_ps(a.v, __mmask16(0xFFFF), a.v);
#elif defined(__AVX2__) && defined(__FMA__)
  return _mm256_sqrt_ps(a.v);
#elif defined(__ARM_NEON) && defined(__aarch64__)
  return vsqrtq_f32(a.v);
#else
  VecF r;
  for (int i = 0; i < VecF::kWidth; ++i) r.v[i] = __builtin_sqrtf(a.v[i]);
  return r;
#endif
}

// Four f32 lanes on every target, for the per-row scalars of a block of
// four rows: their square roots and divisions as one short vector. A VecF
// assembled lane by lane goes through the stack, and its wide reload waits
// on the narrow stores (store forwarding fails there), on each block's chain
// in the layer norms.
using Lanes4 = float __attribute__((vector_size(16)));

// Correctly rounded square root, lane by lane (as std::sqrt).
inline Lanes4 sqrt(Lanes4 a) {
#if defined(__SSE__)
  return _mm_sqrt_ps(a);
#elif defined(__ARM_NEON) && defined(__aarch64__)
  return vsqrtq_f32(a);
#else
  for (int i = 0; i < 4; ++i) a[i] = __builtin_sqrtf(a[i]);
  return a;
#endif
}

// min and max that return `a` when either operand is NaN, so a NaN input
// clamped against constants stays NaN: min is b < a ? b : a, max b > a ? b :
// a. Written as MINPS / MAXPS with b first, which compute exactly that (from
// the plain select g++ emits a compare and a blend); the masked forms with
// every lane set, as in sqrt.
inline VecF min(VecF a, VecF b) {
#if defined(__AVX512F__)
  return _mm512_mask_min_ps(b.v, __mmask16(0xFFFF), b.v, a.v);
#elif defined(__AVX2__) && defined(__FMA__)
  return _mm256_min_ps(b.v, a.v);
#else
  return select(b < a, b, a);
#endif
}
inline VecF max(VecF a, VecF b) {
#if defined(__AVX512F__)
  return _mm512_mask_max_ps(b.v, __mmask16(0xFFFF), b.v, a.v);
#elif defined(__AVX2__) && defined(__FMA__)
  return _mm256_max_ps(b.v, a.v);
#else
  return select(b > a, b, a);
#endif
}
inline VecF abs(VecF a) { return from_bits(bits(a) & 0x7fffffff); }

namespace simd_detail {
// Float vectors of 16 to 64 bytes; fold() combines the upper half of a
// vector with the lower half until one value is left. NOTE: halves come from
// register shuffles: through memory, a 64-byte store read back as 32-byte
// loads stalls store forwarding for longer than the whole reduction takes.
// The last two steps stay in 16-byte vectors (lane 0 combined with lane 2,
// then with lane 1's result): as 8-byte halves g++ finished with vhaddps,
// which cannot address xmm16-31, and where the value sat there (a block of 16
// row sums) it moved it through the stack, a store-forwarding round trip per
// sum.
using F16 = float __attribute__((vector_size(16)));
using F32 = float __attribute__((vector_size(32)));
using F64 = float __attribute__((vector_size(64)));

template <class Op>
inline float fold(F16 v, Op op) {
  const F16 pairs = op(v, __builtin_shufflevector(v, v, 2, 3, 0, 1));
  return op(pairs, __builtin_shufflevector(pairs, pairs, 1, 0, 3, 2))[0];
}
template <class Op>
inline float fold(F32 v, Op op) {
  return fold(
      op(__builtin_shufflevector(v, v, 0, 1, 2, 3), __builtin_shufflevector(v, v, 4, 5, 6, 7)), op);
}
template <class Op>
inline float fold(F64 v, Op op) {
  return fold(op(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)),
              op);
}
}  // namespace simd_detail

// Horizontal sum, in a fixed order (a tree over the lanes).
inline float reduce_add(VecF a) {
  return simd_detail::fold(a.v, [](auto x, auto y) { return x + y; });
}
#if defined(__AVX512F__)
namespace simd_detail {
// One level of reduce_add_each: t[j] = lo(a, b) + hi(a, b) for the pairs a =
// t[2j], b = t[2j + 1] of t's first N vectors (a vector past the last pairs
// with itself). The shuffles in their zero-masking form under a full mask,
// as in transpose_16x16.h (g++ 12 warns on the plain forms).
template <int N, class Lo, class Hi>
inline void halve(__m512* t, Lo lo, Hi hi) {
#pragma GCC unroll 8
  for (int j = 0; j < (N + 1) / 2; ++j) {
    const __m512 a = t[2 * j], b = 2 * j + 1 < N ? t[2 * j + 1] : a;
    t[j] = _mm512_add_ps(lo(a, b), hi(a, b));
  }
}
}  // namespace simd_detail
#endif

// reduce_add of each of R vectors: the same additions in the same tree, so
// the same bits, but with AVX-512 (R a power of two up to 16) the vectors'
// folds run together, two vectors' halves combined by each add: about 2R
// adds and 4R shuffles where R folds take 4R adds and 4R shuffles and
// extracts (a layer norm backward's block of 4 rows reduces 16 sums).
// Level by level over pairs of vectors [a, b]: lanes 0-7 + lanes 8-15, so
// the first eight lanes hold a's i + (i + 8) and the next eight b's; then
// within those, i + (i + 4); then within each 128-bit lane of four, 0 + 2
// and 1 + 3; then 0 + 1. Vector r's sum ends in lane 4 (r % 4) + r / 4.
template <int R>
inline std::array<float, R> reduce_add_each(const std::array<VecF, R>& v) {
  std::array<float, R> out;
#if defined(__AVX512F__)
  if constexpr (R >= 2 && R <= 16 && (R & (R - 1)) == 0) {
    using simd_detail::halve;
    constexpr int n1 = R / 2, n2 = (n1 + 1) / 2, n3 = (n2 + 1) / 2;
    __m512 t[16];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) t[r] = v[r].v;
    halve<R>(t, [](__m512 a, __m512 b) { return _mm512_maskz_shuffle_f32x4(0xFFFF, a, b, 0x44); },
             [](__m512 a, __m512 b) { return _mm512_maskz_shuffle_f32x4(0xFFFF, a, b, 0xEE); });
    halve<n1>(t, [](__m512 a, __m512 b) { return _mm512_maskz_shuffle_f32x4(0xFFFF, a, b, 0x88); },
              [](__m512 a, __m512 b) { return _mm512_maskz_shuffle_f32x4(0xFFFF, a, b, 0xDD); });
    halve<n2>(
        t,
        [](__m512 a, __m512 b) {
          return _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, _mm512_castps_pd(a), _mm512_castps_pd(b)));
        },
        [](__m512 a, __m512 b) {
          return _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, _mm512_castps_pd(a), _mm512_castps_pd(b)));
        });
    halve<n3>(t, [](__m512 a, __m512 b) { return _mm512_maskz_shuffle_ps(0xFFFF, a, b, 0x88); },
              [](__m512 a, __m512 b) { return _mm512_maskz_shuffle_ps(0xFFFF, a, b, 0xDD); });
    // Out through registers: a vector stored and read back as floats would
    // wait on store forwarding (see fold).
    const simd_detail::F64 w = t[0];
    const simd_detail::F16 q[4] = {
        __builtin_shufflevector(w, w, 0, 1, 2, 3), __builtin_shufflevector(w, w, 4, 5, 6, 7),
        __builtin_shufflevector(w, w, 8, 9, 10, 11), __builtin_shufflevector(w, w, 12, 13, 14, 15)};
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) out[r] = q[r % 4][r / 4];
    return out;
  }
#endif
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) out[r] = reduce_add(v[r]);
  return out;
}

// Horizontal max. NOTE: a NaN lane may or may not win; callers that must
// propagate NaN get it from the arithmetic that follows (softmax: e^(z - max)).
inline float reduce_max(VecF a) {
  return simd_detail::fold(a.v, [](auto x, auto y) { return y > x ? y : x; });
}

// Polynomial c[0] + c[1] x + ... + c[N-1] x^(N-1), Horner with FMA.
template <size_t N>
inline VecF poly(VecF x, const float (&c)[N]) {
  VecF p = c[N - 1];
  for (size_t i = N - 1; i-- > 0;) p = fma(p, x, c[i]);
  return p;
}

// e^x for x already clamped to [-104, 89]. As Cephes expf, x = n ln2 + r
// with |r| <= ln2/2 (ln2 in two parts), but e^r is one polynomial of degree
// 6 in Horner form (near-minimax coefficients, relative error 4e-9 in exact
// arithmetic): 6 FMAs where Cephes's 1 + r + r^2 P(r) took 8 operations, a
// fifth of the function, and no less accurate. Then scaled by 2^n so that
// results down to the subnormals (x >= -103.9) and up to FLT_MAX (x <=
// 88.72) are right; below that 0, above it +inf; NaN stays NaN. Max relative
// error 8e-8 (under 1 ulp; 1e-7 where FMA is two roundings) on normal
// results, absolute 2e-45 on subnormal ones.
inline VecF exp_of_clamped(VecF xc) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  static constexpr float kP[] = {1.0f,          1.0f,          4.99999970e-1f, 1.66665137e-1f,
                                 4.16674167e-2f, 8.36950447e-3f, 1.38710940e-3f};
#if defined(__AVX512F__)
  // n = round(x log2e) by vrndscaleps rather than adding and subtracting
  // 1.5 2^23: one instruction for two (the product is rounded
  // before n is, so n can be one off where x log2e is within an ulp of a
  // half-integer; |r| then passes ln2/2 by an ulp, within the polynomial's
  // accuracy).
  const VecF y = xc * kLog2e;  // NOTE: the masked form with every lane set, as in sqrt
  const VecF n = _mm512_mask_roundscale_ps(y.v, __mmask16(0xFFFF), y.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const VecF t = fma(xc, kLog2e, kRound);
  const VecF n = t - kRound;  // round(x / ln2), exact
#endif
  VecF r = fma(n, -kLn2Hi, xc);
  r = fma(n, -kLn2Lo, r);
  const VecF p = poly(r, kP);  // e^r
#if defined(__AVX512F__)
  // p 2^n in one instruction (a third of exp's work the other way); rounded
  // once, so the same value as the two exact scalings below (checked on
  // every float). NOTE: the masked form with every lane set, as in sqrt.
  return _mm512_mask_scalef_ps(p.v, __mmask16(0xFFFF), p.v, n.v);
#else
  // n as an integer: the low bits of t. 2^n = 2^(n/2, floored) * 2^(the rest),
  // each a normal float for n in [-150, 128].
  const MaskF ni = bits(t) - bits(VecF(kRound));
  const MaskF n1 = ni >> 1, n2 = ni - n1;
  return p * from_bits((n1 + 127) << 23) * from_bits((n2 + 127) << 23);
#endif
}

// e^x.
inline VecF exp(VecF x) { return exp_of_clamped(min(max(x, -104.0f), 89.0f)); }

// e^x for x <= 0, -inf or NaN (a softmax's z - max z): one clamp fewer.
inline VecF exp_nonpositive(VecF x) { return exp_of_clamped(max(x, -104.0f)); }

// sigmoid(x) and 1 - sigmoid(x) = sigmoid(-x), both without cancellation:
// with e = e^-|x| <= 1, r = 1 / (1 + e) is the sigmoid of |x| and e r that of
// -|x|. Max relative error 2.5e-7 each (0 below x = -104, where e^x underflows).
struct SigmoidPair {
  VecF s, one_minus_s;
};
inline SigmoidPair sigmoid_pair(VecF x) {
  const VecF e = exp_nonpositive(-abs(x));
  const VecF r = 1.0f / (1.0f + e);
  const VecF er = e * r;
  const MaskF pos = x >= 0.0f;
  return {select(pos, r, er), select(pos, er, r)};
}
inline VecF sigmoid(VecF x) { return sigmoid_pair(x).s; }

// tanh. Cephes tanhf: for |x| < 0.625 an odd polynomial (no cancellation near
// 0), else 1 - 2 / (e^(2|x|) + 1) with x's sign. Max relative error 2e-7.
inline VecF tanh(VecF x) {
  static constexpr float kP[] = {-3.33332819422e-1f, 1.33314422036e-1f, -5.37397155531e-2f,
                                 2.06390887954e-2f, -5.70498872745e-3f};
  const VecF ax = abs(x);
  const VecF z = x * x;
  const VecF small = fma(poly(z, kP) * z, x, x);
  const VecF large = 1.0f - 2.0f / (exp(ax + ax) + 1.0f);
  const VecF large_signed = from_bits(bits(large) | (bits(x) & int32_t(0x80000000)));
  return select(ax < 0.625f, small, large_signed);
}

// erf. A rational x P(x^2) / Q(x^2) on [-4, 4] (Eigen's and XLA's f32 erf),
// +-1 beyond. Max absolute and relative error 4e-7 with FMA, 5e-7 without
// (about 7 ulp near +-1; relative for |x| >= 1e-30: subnormal x lose digits). So 1 + erf(x) has
// 4e-7 absolute accuracy (std::erf in f32 gives 6e-8, from rounding to 1)
// and little relative accuracy in the far negative tail.
inline VecF erf(VecF x) {
  static constexpr float kP[] = {-1.60960333262415e-02f, -2.95459980854025e-03f,
                                 -7.34990630326855e-04f, -5.69250639462346e-05f,
                                 -2.10102402082508e-06f, 2.77068142495902e-08f,
                                 -2.72614225801306e-10f};
  static constexpr float kQ[] = {-1.42647390514189e-02f, -7.37332916720468e-03f,
                                 -1.68282697438203e-03f, -2.13374055278905e-04f,
                                 -1.45660718464996e-05f};
  const VecF xc = min(max(x, -4.0f), 4.0f);
  const VecF z = xc * xc;
  return xc * poly(z, kP) / poly(z, kQ);
}

// Lanes [0, m) set.
inline MaskF first_lanes(int64_t m) {
  MaskF iota;
  for (int i = 0; i < VecF::kWidth; ++i) iota[i] = i;
  return iota < static_cast<int32_t>(m);
}

// The sum over i in [0, n) of the lanes of f(i, m), where f returns the
// vector for elements [i, i + m): m is kWidth except at the tail, whose lanes
// past m are dropped (f may load them as anything). f32 lanes, summed in a
// fixed order.
template <class F>
inline float sum_lanes(int64_t n, F&& f) {
  constexpr int W = VecF::kWidth;
  VecF acc = 0.0f;
  int64_t i = 0;
  for (; i + W <= n; i += W) acc += f(i, int64_t{W});
  if (i < n) acc += select(first_lanes(n - i), f(i, n - i), 0.0f);
  return reduce_add(acc);
}

// sum_lanes for R sums at once: out[r] = the sum over i of f(r, i, m), each
// in the order sum_lanes would take. Their accumulators interleave, so R
// chains of dependent adds (and R horizontal reductions) overlap, where one
// short sum alone waits on each add's latency.
template <int R, class F>
inline std::array<float, R> sum_lanes_rows(int64_t n, F&& f) {
  constexpr int W = VecF::kWidth;
  // NOTE: the unroll pragmas keep the accumulators in registers; without
  // them g++ 12 keeps the array on the stack (a load and store per add).
  std::array<VecF, R> acc;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] += f(r, i, int64_t{W});
  }
  if (i < n) {
    const MaskF tail = first_lanes(n - i);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] += select(tail, f(r, i, n - i), 0.0f);
  }
  // Sixteen sums (a layer norm backward's block of four rows) fold faster
  // together; up to eight (the forward's block), each row's sum is ready
  // sooner on a fold of its own (docs/performance.md).
  if constexpr (R == 16) return reduce_add_each<R>(acc);
  std::array<float, R> out;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) out[r] = reduce_add(acc[r]);
  return out;
}

// The sum of f(x[i]) over [0, n), each x[i] widened to f64 first and the sum
// kept in f64 lanes; f is applied alike to a vector of lanes and to a scalar.
template <class F>
inline double sum_f64_of(const float* x, int64_t n, F&& f) {
  using Half = float __attribute__((vector_size(kSimdBytes / 2)));
  using Wide = double __attribute__((vector_size(kSimdBytes)));
  constexpr int H = kSimdBytes / 8;
  Wide acc = {};
  int64_t i = 0;
  for (; i + H <= n; i += H) {
    Half h;
    std::memcpy(&h, x + i, sizeof h);
    acc += f(__builtin_convertvector(h, Wide));
  }
  double s = 0;
  for (int k = 0; k < H; ++k) s += acc[k];
  for (; i < n; ++i) s += f(double(x[i]));
  return s;
}

// The sum of x[i]^2 over [0, n), squares and sums in f64 lanes.
inline double sum_squares_f64(const float* x, int64_t n) {
  return sum_f64_of(x, n, [](auto v) { return v * v; });
}

// p[i * stride] for i in [0, n) as a contiguous array: p itself when stride
// is 1, else a copy in buf. Row kernels use it to run one contiguous code path.
inline const float* gather(const float* p, int64_t stride, int64_t n, std::vector<float>& buf) {
  if (stride == 1) return p;
  buf.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) buf[i] = p[i * stride];
  return buf.data();
}

// The calling thread's gather() buffer number `slot` (0 to 7), kept between
// calls. NOTE: call it where the buffer is used, inside the parallel_for body.
// A block-scope thread_local declared in a kernel and used only inside its
// lambda is never initialised on a pool worker (the worker does not pass the
// declaration), so the worker's destructor is never registered and its copy
// leaked at thread exit.
inline std::vector<float>& gather_buffer(int slot) {
  thread_local std::vector<float> buffers[8];
  return buffers[slot];
}

// Applies f (VecF -> VecF) to x[0, n) (stride xs, any value) into out[0, n),
// kWidth elements at a time; the tail runs through the same f on a partial
// vector, so every element gets the same arithmetic.
template <class F>
inline void map(float* out, const float* x, int64_t xs, int64_t n, F&& f) {
  constexpr int W = VecF::kWidth;
  int64_t i = 0;
  if (xs == 1) {
    for (; i + W <= n; i += W) f(VecF::load(x + i)).store(out + i);
  }
  for (; i < n; i += W) {
    const int64_t m = n - i < W ? n - i : W;
    f(VecF::load(x + i * xs, xs, m)).store(out + i, m);
  }
}

// Two inputs: out[i] = f(x[i * xs], y[i * ys]).
template <class F>
inline void map(float* out, const float* x, int64_t xs, const float* y, int64_t ys, int64_t n,
                F&& f) {
  constexpr int W = VecF::kWidth;
  int64_t i = 0;
  if (xs == 1 && ys == 1) {
    for (; i + W <= n; i += W) f(VecF::load(x + i), VecF::load(y + i)).store(out + i);
  }
  for (; i < n; i += W) {
    const int64_t m = n - i < W ? n - i : W;
    f(VecF::load(x + i * xs, xs, m), VecF::load(y + i * ys, ys, m)).store(out + i, m);
  }
}

// The softmax of up to R rows held in one vector each: row r's z[r] in lanes
// [0, visible[r]) written to y[r][0, len), zeros past visible[r] and the whole
// row NaN when nothing is visible (n <= R rows), their chains (two
// horizontal reductions, exp and a division: about 100 cycles of latency
// around a dozen instructions) interleaved.
template <int R>
inline void softmax_one_vector_rows(const VecF* z_in, const int64_t* visible, float* const* y_out, int n,
                                    int64_t len) {
  constexpr float kNegInf = -__builtin_inff();
  std::array<VecF, R> z, e;
  std::array<float, R> mx, total;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int k = r < n ? r : 0;  // missing rows repeat the first, unused
    z[r] = select(first_lanes(visible[k]), z_in[k], kNegInf);
    mx[r] = reduce_max(z[r]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    e[r] = exp_nonpositive(z[r] - mx[r]);
    total[r] = reduce_add(e[r]);
  }
  for (int r = 0; r < n; ++r) {
    float* y = y_out[r];
    if (mx[r] == kNegInf) {  // every position hidden
      for (int64_t j = 0; j < len; ++j) y[j] = __builtin_nanf("");
      continue;
    }
    (e[r] * (1.0f / total[r])).store(y, visible[r]);
    for (int64_t j = visible[r]; j < len; ++j) y[j] = 0.0f;
  }
}

#if defined(__AVX512F__)
// softmax_one_vector_rows for 16 rows (kWidth 16), with the same values, on
// the rows transposed: lane r of column j holds row r's z_j, so every row's
// max and sum are vertical (the sum in reduce_add's tree order, so the same
// bits) and one exp and one division serve a value of each of 16 rows. Two
// 16 x 16 transposes cost less than 16 rows' horizontal reductions.
inline void softmax_one_vector_16_rows(const VecF* z_in, const int64_t* visible, float* const* y_out,
                                       int64_t len) {
  constexpr float kNegInf = -__builtin_inff();
  __m512i c[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) c[r] = _mm512_castps_si512(select(first_lanes(visible[r]), z_in[r], kNegInf).v);
  transpose_16x16(c);
  const auto col = [&](int j) { return VecF(_mm512_castsi512_ps(c[j])); };
  VecF mx = col(0);
#pragma GCC unroll 16
  for (int j = 1; j < 16; ++j) mx = max(mx, col(j));
  VecF e[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) e[j] = exp_nonpositive(col(j) - mx);
  VecF s[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) s[j] = e[j] + e[j + 8];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) s[j] = s[j] + s[j + 4];
  s[0] = s[0] + s[2];
  s[1] = s[1] + s[3];
  // A row with nothing visible has mx -inf, so e = e^(-inf + inf) = NaN: all
  // of it NaN, as softmax_one_vector_rows makes it.
  const VecF inv = 1.0f / (s[0] + s[1]);
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) c[j] = _mm512_castps_si512((e[j] * inv).v);
  transpose_16x16(c);
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) VecF(_mm512_castsi512_ps(c[r])).store(y_out[r], len);
}
#endif

// A softmax's backward along one row: out = scale y (dy - sum(y dy)), y and
// dy with strides ys and ds (any value), out contiguous and possibly dy
// itself; f32 lanes for the dot product and the update.
inline void softmax_back_row(const float* y, int64_t ys, const float* dy, int64_t ds, int64_t len, float scale,
                             float* out) {
  const float dot =
      sum_lanes(len, [&](int64_t i, int64_t n) { return VecF::load(y + i * ys, ys, n) * VecF::load(dy + i * ds, ds, n); });
  map(out, y, ys, dy, ds, len, [&](VecF yv, VecF dv) { return scale * yv * (dv - dot); });
}

// The softmax of scale * y in place for n <= R rows: row r's y[r][0,
// visible[r]) replaced by e^(scale y - max) divided by the sum (in f32
// lanes), y[r][visible[r], len) by zeros, and the whole row NaN when its max
// is -inf (nothing visible; a NaN score makes the sum, so the row, NaN).
// given_max, when not null, holds each row's max of scale * y, taken by the
// caller on a pass of its own. The rows' passes run in lockstep over the
// vectors they all have, so R exp chains, sums, horizontal reductions and
// divisions overlap where one row alone waits on each in turn. Each row's
// arithmetic and summation order are the same whatever R, so are its bits.
// exp's argument is scale y - max in one rounding (an FMA, written out: the
// scaled score rounded first would add its error, |scale y| ulp/2, to e's).
template <int R>
inline void softmax_rows(float* const* y, const int64_t* visible, int n, int64_t len, float scale,
                         const float* given_max = nullptr) {
  constexpr int W = VecF::kWidth;
  constexpr float kNegInf = -__builtin_inff();
  if (n < R) {
    for (int r = 0; r < n; ++r) softmax_rows<1>(y + r, visible + r, 1, len, scale, given_max ? given_max + r : nullptr);
    return;
  }
  int64_t common = visible[0];
  for (int r = 0; r < R; ++r) common = visible[r] < common ? visible[r] : common;
  common = common / W * W;  // whole vectors every row has
  const VecF s = scale;
  std::array<VecF, R> mx, acc;
  if (given_max) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) mx[r] = given_max[r];
  } else {
    std::array<VecF, R> vmax;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) vmax[r] = kNegInf;
    for (int64_t j = 0; j < common; j += W) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) vmax[r] = max(vmax[r], VecF::load(y[r] + j) * s);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      for (int64_t j = common; j < visible[r]; j += W) {
        const int64_t t = visible[r] - j < W ? visible[r] - j : W;
        vmax[r] = max(vmax[r], select(first_lanes(t), VecF::load(y[r] + j, 1, t) * s, kNegInf));
      }
      mx[r] = reduce_max(vmax[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int64_t j = 0; j < common; j += W) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const VecF e = exp_nonpositive(fma(VecF::load(y[r] + j), s, -mx[r]));
      e.store(y[r] + j);
      acc[r] += e;
    }
  }
  std::array<VecF, R> inv;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    int64_t j = common;
    for (; j + W <= visible[r]; j += W) {
      const VecF e = exp_nonpositive(fma(VecF::load(y[r] + j), s, -mx[r]));
      e.store(y[r] + j);
      acc[r] += e;
    }
    if (j < visible[r]) {
      const int64_t t = visible[r] - j;
      const VecF e = exp_nonpositive(fma(VecF::load(y[r] + j, 1, t), s, -mx[r]));
      e.store(y[r] + j, t);
      acc[r] += select(first_lanes(t), e, 0.0f);
    }
    inv[r] = 1.0f / reduce_add(acc[r]);
  }
  for (int64_t j = 0; j < common; j += W) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) (VecF::load(y[r] + j) * inv[r]).store(y[r] + j);
  }
  for (int r = 0; r < R; ++r) {
    if (mx[r][0] == kNegInf) {  // every position hidden: NaN, as the composite gives
      for (int64_t j = 0; j < len; ++j) y[r][j] = __builtin_nanf("");
      continue;
    }
    map(y[r] + common, y[r] + common, 1, visible[r] - common, [&](VecF v) { return v * inv[r]; });
    for (int64_t j = visible[r]; j < len; ++j) y[r][j] = 0.0f;
  }
}

// The softmax of scale x + mask over x[r][0, visible[r]) written to y[r][0,
// len) for R rows (zeros past visible[r]; the whole row NaN when every score
// is -inf), each row held in NV vectors of registers ((NV - 1) kWidth <
// visible[r] <= NV kWidth): x is read once and y written once, where
// softmax_rows stores the scores, reloads them for exp, stores e and reloads
// it to normalize (rows are rarely 64-byte aligned, so each of those
// accesses is split in two). The rows' chains (max, exp, sum, division)
// interleave. ScaleInExp: exp's argument is x scale + (mask - max) in one
// rounding, as softmax_rows takes it (the fused attention's rows, mask 0);
// otherwise the score z = x scale + mask is rounded first and the argument
// is z - max, as the softmax op's other paths take it. Either way values,
// sums and their order are those paths', so the bits are too.
template <int NV, int R, bool ScaleInExp>
inline void softmax_rows_in_registers(const float* const* x, float scale, float mask, const int64_t* visible,
                                      int64_t len, float* const* y) {
  constexpr int W = VecF::kWidth;
  constexpr float kNegInf = -__builtin_inff();
  // The loaded x (ScaleInExp) or the scores z = x scale + mask, then e.
  std::array<std::array<VecF, NV>, R> z;
  std::array<VecF, R> inv;
  std::array<float, R> mx;
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      const VecF xv = VecF::load(x[r] + v * W, 1, v < NV - 1 ? W : visible[r] - (NV - 1) * W);
      z[r][v] = ScaleInExp ? xv : fma(xv, scale, mask);
    }
  }
  // a for vector v of row r with the lanes past visible[r] at -inf.
  const auto visible_only = [&](int r, int v, VecF a) {
    return v < NV - 1 ? a : select(first_lanes(visible[r] - (NV - 1) * W), a, kNegInf);
  };
  // The max in four chains: one chain of NV maxes would be much of a row's
  // latency.
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const auto at = [&](int v) { return visible_only(r, v, ScaleInExp ? fma(z[r][v], scale, mask) : z[r][v]); };
    VecF m0 = at(0), m1 = at(NV > 1 ? 1 : 0), m2 = at(NV > 2 ? 2 : 0), m3 = at(NV > 3 ? 3 : 0);
#pragma GCC unroll 16
    for (int v = 4; v < NV; v += 4) {
      m0 = max(m0, at(v));
      if (v + 1 < NV) m1 = max(m1, at(v + 1));
      if (v + 2 < NV) m2 = max(m2, at(v + 2));
      if (v + 3 < NV) m3 = max(m3, at(v + 3));
    }
    mx[r] = reduce_max(max(max(m0, m1), max(m2, m3)));
  }
  // A row whose max is -inf gets NaN from exp(-inf + inf), filled below.
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    VecF acc = 0.0f;
    const VecF shift = ScaleInExp ? mask - mx[r] : -mx[r];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      // 0 in the hidden lanes of the last vector.
      z[r][v] = exp_nonpositive(visible_only(r, v, ScaleInExp ? fma(z[r][v], scale, shift) : z[r][v] + shift));
      acc += z[r][v];
    }
    inv[r] = 1.0f / reduce_add(acc);
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v < NV - 1; ++v) (z[r][v] * inv[r]).store(y[r] + v * W);
    (z[r][NV - 1] * inv[r]).store(y[r] + (NV - 1) * W, visible[r] - (NV - 1) * W);
    const float rest = mx[r] == kNegInf ? __builtin_nanf("") : 0.0f;
    for (int64_t j = mx[r] == kNegInf ? 0 : visible[r]; j < len; ++j) y[r][j] = rest;
  }
}

// The most vectors softmax_rows_in_registers holds a row in: 256 keys in
// AVX-512 (GPT's context), 128 in AVX2.
constexpr int64_t kSoftmaxHeldVectors = 16;

// softmax_rows_in_registers for R rows of 1 <= visible <= kSoftmaxHeldVectors
// kWidth, all in the same number of vectors: one instantiation for each.
template <int R, bool ScaleInExp>
inline void softmax_rows_held(const float* const* x, float scale, float mask, const int64_t* visible, int64_t len,
                              float* const* y) {
  using Fn = void (*)(const float* const*, float, float, const int64_t*, int64_t, float* const*);
  static constexpr auto table = []<size_t... I>(std::index_sequence<I...>) {
    return std::array<Fn, sizeof...(I)>{&softmax_rows_in_registers<int(I) + 1, R, ScaleInExp>...};
  }(std::make_index_sequence<kSoftmaxHeldVectors>{});
  table[visible[0] > 0 ? (visible[0] - 1) / VecF::kWidth : 0](x, scale, mask, visible, len, y);
}

// Rows i = begin, begin + 1, ... of softmax(scale x + mask) with x row i at
// x + i ld, written to y + i ld (len values each, y may be x), row i's keys
// visible(i): those with at most kSoftmaxHeldVectors vectors visible, by
// softmax_rows_held (ScaleInExp as there), two at a time where they take as
// many vectors. Stops at `end` or at the first row too long; returns where
// it stopped.
template <bool ScaleInExp, class Visible>
inline int64_t softmax_held_rows(const float* x, float* y, int64_t ld, int64_t begin, int64_t end, int64_t len,
                                 float scale, float mask, Visible visible) {
  constexpr int64_t kHeld = kSoftmaxHeldVectors * VecF::kWidth;
  const auto vectors = [](int64_t v) { return (v + VecF::kWidth - 1) / VecF::kWidth; };
  int64_t i = begin;
  while (i < end) {
    const std::array<int64_t, 2> vis = {visible(i), i + 1 < end ? visible(i + 1) : -1};
    if (vis[0] > kHeld) break;
    const std::array<const float*, 2> xr = {x + i * ld, x + (i + 1) * ld};
    const std::array<float*, 2> yr = {y + i * ld, y + (i + 1) * ld};
    if (vis[1] >= 0 && vectors(vis[0]) == vectors(vis[1])) {
      softmax_rows_held<2, ScaleInExp>(xr.data(), scale, mask, vis.data(), len, yr.data());
      i += 2;
    } else {
      softmax_rows_held<1, ScaleInExp>(xr.data(), scale, mask, vis.data(), len, yr.data());
      i += 1;
    }
  }
  return i;
}

}  // namespace nabla::cpu
