// What dequantize and matmul_quantized share: the storage's row layout, its
// checks, and dequantizing part of it while a kernel runs.
#pragma once

#include <cstdint>
#include <vector>

#include "core/op.h"
#include "nabla/gguf.h"

namespace nabla::ops {

// Bytes in a row of K elements of storage type `type` (a GgmlType);
// DTypeError / ShapeError naming `op` for another type or a K that is not
// whole blocks.
int64_t quantized_row_bytes(const char* op, int64_t type, int64_t K);
// w: u8 [N, quantized_row_bytes(type, K)].
void check_quantized_weight(const char* op, const Tensor& w, int64_t type, int64_t K);
// Rows [row, row + rows) of w, elements [k0, k1) (block-aligned), as f32
// into dst with leading dimension ld. `gather`: scratch for strided bytes.
void dequantize_rows(const TensorView& w, int64_t type, int64_t K, int64_t row, int64_t rows, int64_t k0, int64_t k1,
                     float* dst, int64_t ld, std::vector<uint8_t>& gather);
// A fixed u8 [N, row bytes] weight of N x K values in `type`, for cases.
Tensor quantized_fixture(GgmlType type, int64_t N, int64_t K);

}  // namespace nabla::ops
