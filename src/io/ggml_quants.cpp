// ggml's block formats: decoding as ggml defines them, and nabla's encoder.
#include "io/ggml_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "io/half.h"

namespace nabla::io {

namespace {

constexpr int64_t kQK = 32, kQKK = 256;

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
void put_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

// Q4_K's 6-bit scale and min of sub-block j (0..7), packed in 12 bytes:
// bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7,
// bytes 4-7 the same for mins, bytes 8-11 the low 4 bits of scale and min 4-7.
void q4k_scale_min(int j, const uint8_t* s, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void dequantize_q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < kQK; ++j) y[j] = d * float(int8_t(b[2 + j]));
}

void dequantize_q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * float((b[2 + j] & 0xF) - 8);
    y[j + kQK / 2] = d * float((b[2 + j] >> 4) - 8);
  }
}

void dequantize_q4_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t *scales = b + 4, *q = b + 16;
  // Four chunks of 64: the low nibbles of 32 bytes are sub-block 2c, the
  // high nibbles sub-block 2c + 1.
  for (int c = 0; c < 4; ++c, q += 32, y += 64) {
    int s0, m0, s1, m1;
    q4k_scale_min(2 * c, scales, s0, m0);
    q4k_scale_min(2 * c + 1, scales, s1, m1);
    const float d0 = d * float(s0), o0 = dmin * float(m0), d1 = d * float(s1), o1 = dmin * float(m1);
    for (int l = 0; l < 32; ++l) {
      y[l] = d0 * float(q[l] & 0xF) - o0;
      y[l + 32] = d1 * float(q[l] >> 4) - o1;
    }
  }
}

void dequantize_q6_k(const uint8_t* b, float* y) {
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  // Two halves of 128: element l + 32 k (k = 0..3) takes 4 low bits from
  // ql (byte l or l + 32, low or high nibble) and 2 high bits from qh[l].
  for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q0 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * float(sc[is]) * float(q0);
      y[l + 32] = d * float(sc[is + 2]) * float(q1);
      y[l + 64] = d * float(sc[is + 4]) * float(q2);
      y[l + 96] = d * float(sc[is + 6]) * float(q3);
    }
  }
}

// The element of largest magnitude, with its sign.
float signed_max(const float* x, int n) {
  float m = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(m)) m = x[i];
  return m;
}

int clamp_round(float v, int lo, int hi) { return std::clamp(int(std::lrintf(v)), lo, hi); }

void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  put_f16(b, d);
  const float dq = f16_at(b), inv = dq != 0 ? 1 / dq : 0;
  for (int j = 0; j < kQK; ++j) b[2 + j] = uint8_t(int8_t(clamp_round(x[j] * inv, -127, 127)));
}

// The signed extreme maps to -8, so the grid spans it exactly on that side.
void quantize_q4_0(const float* x, uint8_t* b) {
  const float d = signed_max(x, kQK) / -8;
  put_f16(b, d);
  const float dq = f16_at(b), inv = dq != 0 ? 1 / dq : 0;
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = clamp_round(x[j] * inv + 8, 0, 15), hi = clamp_round(x[j + kQK / 2] * inv + 8, 0, 15);
    b[2 + j] = uint8_t(lo | (hi << 4));
  }
}

// Per sub-block of 32: x ~ scale q - min, q in 0..15, over [min(x, 0), max(x)];
// the 8 scales and mins quantized to 6 bits against the super-block's d, dmin.
void quantize_q4_k(const float* x, uint8_t* b) {
  float scale[8], min[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* s = x + 32 * j;
    float lo = 0, hi = 0;
    for (int l = 0; l < 32; ++l) {
      lo = std::min(lo, s[l]);
      hi = std::max(hi, s[l]);
    }
    scale[j] = (hi - lo) / 15;
    min[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, min[j]);
  }
  put_f16(b, max_scale / 63);
  put_f16(b + 2, max_min / 63);
  const float d = f16_at(b), dmin = f16_at(b + 2);
  int sq[8], mq[8];
  for (int j = 0; j < 8; ++j) {
    sq[j] = d > 0 ? clamp_round(scale[j] / d, 0, 63) : 0;
    mq[j] = dmin > 0 ? clamp_round(min[j] / dmin, 0, 63) : 0;
  }
  uint8_t* packed = b + 4;
  for (int j = 0; j < 4; ++j) {
    packed[j] = uint8_t(sq[j] | ((sq[j + 4] >> 4) << 6));
    packed[j + 4] = uint8_t(mq[j] | ((mq[j + 4] >> 4) << 6));
    packed[j + 8] = uint8_t((sq[j + 4] & 0xF) | ((mq[j + 4] & 0xF) << 4));
  }
  uint8_t* q = b + 16;
  for (int c = 0; c < 4; ++c, q += 32) {
    int nib[2][32];
    for (int half = 0; half < 2; ++half) {
      const int j = 2 * c + half;
      const float step = d * float(sq[j]), offset = dmin * float(mq[j]);
      for (int l = 0; l < 32; ++l) nib[half][l] = step > 0 ? clamp_round((x[32 * j + l] + offset) / step, 0, 15) : 0;
    }
    for (int l = 0; l < 32; ++l) q[l] = uint8_t(nib[0][l] | (nib[1][l] << 4));
  }
}

// Per sub-block of 16: the signed extreme maps to -32 (q - 32 in -32..31);
// the 16 scales quantized to 8 bits against the super-block's d.
void quantize_q6_k(const float* x, uint8_t* b) {
  float scale[16], max_scale = 0;
  for (int j = 0; j < 16; ++j) {
    scale[j] = signed_max(x + 16 * j, 16) / -32;
    if (std::fabs(scale[j]) > std::fabs(max_scale)) max_scale = scale[j];
  }
  put_f16(b + 208, max_scale / -128);
  const float d = f16_at(b + 208);
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  int q[256];
  for (int j = 0; j < 16; ++j) {
    sc[j] = int8_t(d != 0 ? clamp_round(scale[j] / d, -128, 127) : 0);
    const float step = d * float(sc[j]);
    for (int l = 0; l < 16; ++l) q[16 * j + l] = step != 0 ? clamp_round(x[16 * j + l] / step, -32, 31) + 32 : 32;
  }
  uint8_t *ql = b, *qh = b + 128;
  std::memset(b, 0, 192);
  for (int h = 0; h < 2; ++h, ql += 64, qh += 32) {
    const int* v = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[l] = uint8_t((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
      ql[l + 32] = uint8_t((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
      qh[l] = uint8_t((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
    }
  }
}

}  // namespace

GgmlBlock ggml_block(GgmlType t) {
  switch (t) {
    case GgmlType::f32:
    case GgmlType::i32:
      return {1, 4};
    case GgmlType::f64:
      return {1, 8};
    case GgmlType::f16:
    case GgmlType::bf16:
      return {1, 2};
    case GgmlType::q8_0:
      return {kQK, 34};
    case GgmlType::q4_0:
      return {kQK, 18};
    case GgmlType::q4_k:
      return {kQKK, 144};
    case GgmlType::q6_k:
      return {kQKK, 210};
  }
  return {0, 0};
}

void dequantize(GgmlType t, const uint8_t* src, int64_t n, float* dst) {
  const GgmlBlock blk = ggml_block(t);
  for (int64_t i = 0; i < n / blk.elements; ++i, src += blk.bytes, dst += blk.elements) {
    switch (t) {
      case GgmlType::f32:
        std::memcpy(dst, src, 4);
        break;
      case GgmlType::f16:
        *dst = f16_at(src);
        break;
      case GgmlType::bf16: {
        uint16_t h;
        std::memcpy(&h, src, 2);
        *dst = bf16_to_f32(h);
        break;
      }
      case GgmlType::q8_0:
        dequantize_q8_0(src, dst);
        break;
      case GgmlType::q4_0:
        dequantize_q4_0(src, dst);
        break;
      case GgmlType::q4_k:
        dequantize_q4_k(src, dst);
        break;
      case GgmlType::q6_k:
        dequantize_q6_k(src, dst);
        break;
      case GgmlType::f64:
      case GgmlType::i32:
        break;  // not float storage: the reader keeps them as they are
    }
  }
}

std::string quantize(GgmlType t, const float* src, int64_t n) {
  const GgmlBlock blk = ggml_block(t);
  std::string out(size_t(n / blk.elements) * blk.bytes, '\0');
  uint8_t* b = reinterpret_cast<uint8_t*>(out.data());
  for (int64_t i = 0; i < n / blk.elements; ++i, b += blk.bytes, src += blk.elements) {
    switch (t) {
      case GgmlType::f32:
        std::memcpy(b, src, 4);
        break;
      case GgmlType::f16:
        put_f16(b, *src);
        break;
      case GgmlType::bf16: {
        const uint16_t h = f32_to_bf16(*src);
        std::memcpy(b, &h, 2);
        break;
      }
      case GgmlType::q8_0:
        quantize_q8_0(src, b);
        break;
      case GgmlType::q4_0:
        quantize_q4_0(src, b);
        break;
      case GgmlType::q4_k:
        quantize_q4_k(src, b);
        break;
      case GgmlType::q6_k:
        quantize_q6_k(src, b);
        break;
      case GgmlType::f64:
      case GgmlType::i32:
        break;
    }
  }
  return out;
}

}  // namespace nabla::io
