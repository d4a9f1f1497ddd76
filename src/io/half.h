// 16-bit float storage widened to f32, shared by the safetensors and GGUF readers.
#pragma once

#include <cstdint>
#include <cstring>

namespace nabla::io {

// IEEE 754 binary16, subnormals, infinities and NaN included.
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0 && mant == 0) {
    bits = sign;
  } else if (exp == 0) {  // subnormal: normalise
    exp = 127 - 15 + 1;
    while (!(mant & 0x400)) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// bfloat16: the top half of an f32.
inline float bf16_to_f32(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// f32 -> bfloat16, rounded to nearest even (NaN stays a quiet NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1);
  return uint16_t(bits >> 16);
}

// f32 -> binary16, rounded to nearest even: overflow to infinity, subnormals
// below 2^-14, NaN kept quiet.
inline uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00;                 // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00;                // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {                                     // below 2^-14: subnormal or zero
    if (abs < 0x33000000u) return sign;                        // below 2^-25: rounds to zero
    const uint32_t exp = abs >> 23, mant = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - exp;                          // 14..24 (value = mant * 2^(exp-150))
    uint32_t q = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1))) ++q;
    return sign | uint16_t(q);
  }
  uint32_t r = abs - 0x38000000u;  // rebias the exponent by 127 - 15
  r += 0xfffu + ((r >> 13) & 1);
  return sign | uint16_t(r >> 13);
}

}  // namespace nabla::io
