// ggml's block formats (ggml-common.h), as GGUF files store tensors: each
// row of ne0 elements is ne0 / block elements blocks, little-endian.
//   Q8_0  32 elements, 34 bytes:  f16 d; i8 q[32]                x = d q
//   Q4_0  32 elements, 18 bytes:  f16 d; u8 q[16]                x[j] = d (lo(q[j]) - 8),
//                                                                x[j + 16] = d (hi(q[j]) - 8)
//   Q4_K  256 elements, 144 bytes: f16 d, dmin; u8 scales[12]; u8 q[128]
//         8 sub-blocks of 32 with 6-bit scale s and min m:       x = d s q - dmin m
//   Q6_K  256 elements, 210 bytes: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
//         16 sub-blocks of 16 with an 8-bit scale s, q in 6 bits: x = d s (q - 32)
// quantize() is nabla's own encoder (round to nearest on per-block scales):
// any valid encoding loads in llama.cpp; it is not llama.cpp's error-search.
#pragma once

#include <cstdint>
#include <string>

#include "nabla/gguf.h"

namespace nabla::io {

struct GgmlBlock {
  int64_t elements;  // per block; 1 for F32, F16, BF16, F64, I32
  size_t bytes;      // per block
};
// The block of a type nabla reads; {0, 0} for the others.
GgmlBlock ggml_block(GgmlType t);

// n elements (a multiple of the block) of type t at src, as f32.
void dequantize(GgmlType t, const uint8_t* src, int64_t n, float* dst);
// n f32 values (a multiple of the block) as type t's bytes (F32, F16, BF16
// or a block format).
std::string quantize(GgmlType t, const float* src, int64_t n);

}  // namespace nabla::io
