// Low-memory training (TrainStep's low_memory): a weight gradient kept as the
// factors autodiff makes it from, multiplied out a chunk at a time inside the
// optimizer step instead of being held whole.
//
// A linear layer's weight gradient over T tokens is dW [R, C] = L^T G, L [T, R]
// and G [T, C] (its output gradients and inputs, or the reverse); a fused
// projection (GPT-2's c_attn: q, k and v) places one such product per block
// of columns, all with the same L, and a tied embedding adds the lookup's
// gradient rows at the token ids. Where T is small against the layer (GPT-2
// 124M at 4 x 64 tokens: T (R + C) is 0.1-0.4 of R C), the factors take much
// less memory than dW. The global-norm clip needs every gradient's norm
// before the first update; that comes from the factors too (Gram matrices,
// see squared_norm), and the update multiplies dW out a chunk at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "nabla/tensor.h"

namespace nabla::train {

// dW [R, C]: columns [col, col + right.dim(1)) of each block are
// left^T right, then values are added to the rows at indices, in index order.
struct FactoredGradient {
  struct Block {
    Tensor right;  // [T, width], row-major
    int64_t col = 0;
  };
  Tensor left;  // [T, R], row-major
  std::vector<Block> blocks;
  Tensor values, indices;  // optional add_rows term: [..., C] f32 and i32 [...]

  int64_t elements() const;  // what the factors hold
};

// The factors of gradient g (f32 [R, C]) when autodiff built it as such a
// product (matmuls of one transposed [T, R] and a [T, C] or [T, width] each,
// placed by scatter_slice and add_slice along the columns and possibly under
// an add_rows) and the factors hold fewer elements than g; nullopt otherwise.
std::optional<FactoredGradient> factor_gradient(const Tensor& g);

// A factored gradient over the factors' memory after a run: row-major
// elements [begin, end) of dW on request, computed from the rows covering
// them with the same product (cpu::product or a PackedB: the same kernel and
// per-element summation order as the graph's matmul tiles) and the same row
// additions as the graph would have run, so the values are the ones the full
// gradient would hold (a zero's sign aside: add_slice's 0 + x).
class GradientRows {
 public:
  struct Block {
    const float* right;
    int64_t col, width;
  };
  GradientRows(const float* left, int64_t tokens, int64_t rows, int64_t cols, std::vector<Block> blocks,
               const float* values, const int32_t* indices, int64_t n_indices, bool bf16);
  // Call once the factors hold a run's values, before range().
  void new_run();
  // ||dW||^2 from the factors, without dW: with A = L L^T and B = G G^T
  // ([T, T], G the blocks side by side), ||L^T G||^2 = sum_ij A_ij B_ij;
  // a lookup's rows S add 2 <L^T G, S> + ||S||^2. The "ghost norm" of
  // per-example clipping: T^2 (R + C) multiply-adds against dW's T R C, and
  // about half of that here, since A and B are symmetric: the sum comes in
  // pieces, one per tile of kGramRows rows I against kGramRows rows J <= I
  // of A and B (a tile left of the diagonal counted twice; under bf16 one
  // per panel of rows I against the rows up to I's last), and the lookup's
  // terms as the last.
  // The pieces are independent (several threads can run them) and their sum
  // equals the materialised sum of squares up to f32 rounding (relative 1e-6
  // here), not bit for bit.
  static constexpr int64_t kGramRows = 64;
  int64_t norm_pieces() const;
  double norm_piece(int64_t piece) const;
  // Valid until this thread's next call; safe from several threads at once.
  const float* range(int64_t begin, int64_t end) const;
  // ShapeError when an index is outside [0, rows), as the graph's add_rows
  // would have thrown.
  void check_indices() const;

 private:
  double lookup_terms() const;  // 2 <L^T G, S> + ||S||^2
  int64_t gram_pieces() const;   // the norm pieces before lookup_terms
  const float* left_;
  int64_t tokens_, rows_, cols_;
  std::vector<Block> blocks_;
  bool covered_;  // the blocks cover every column
  const float* values_;
  const int32_t* indices_;
  int64_t n_indices_;
  bool bf16_;
  uint64_t run_ = 0;  // which run's right factors a thread's packed copies hold
};

}  // namespace nabla::train
