// What the matmul op's kernel decides from shapes alone, for code that must
// reproduce its results elsewhere (train/factored_gradient.cpp).
#pragma once

#include <cstdint>

namespace nabla::ops {

// True when the matmul op runs one product [M, K] x [K, N] (no batch) on the
// blocked GEMM in every tile: none is small enough for gemm_small and K is
// not split. Then each element's value depends on K's order alone, not on
// the tile that computes it, and a block of rows computed elsewhere by the
// same kernel holds the same bits.
bool matmul_tiles_blocked(int64_t M, int64_t N, int64_t K);

}  // namespace nabla::ops
