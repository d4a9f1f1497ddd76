#include "train/factored_gradient.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>

#include "backend/cpu/gemm.h"
#include "backend/cpu/simd.h"
#include "core/node.h"
#include "core/op.h"
#include "nabla/error.h"
#include "nabla/ops.h"
#include "ops/matmul.h"

namespace nabla::train {

namespace {

// The compute node whose whole output t is, in t's row-major order (t itself,
// or a view such as a reshape or a double transpose of it); null otherwise.
const Node* producer(const Tensor& t) {
  const Node* root = t.node()->root();
  return covers_root(t) && !root->is_leaf() ? root : nullptr;
}

bool is_op(const Node* n, const char* name) { return n && std::strcmp(n->op->name, name) == 0; }

// t [R, width] = matmul(a [R, T] stored as a row-major [T, R] seen
// transposed, b [T, width] row-major): a linear layer's weight gradient.
bool add_product(const Tensor& t, int64_t col, FactoredGradient& f) {
  const Node* n = producer(t);
  if (!is_op(n, "matmul") || n->inputs.size() != 2) return false;
  const Tensor &a = n->inputs[0], &b = n->inputs[1];
  if (a.rank() != 2 || b.rank() != 2 || a.dtype() != DType::f32 || b.dtype() != DType::f32) return false;
  const Tensor left = transpose(a);
  if (!left.is_contiguous() || !b.is_contiguous()) return false;
  // The graph's product would run where range() cannot reproduce its bits.
  if (!ops::matmul_tiles_blocked(left.dim(1), b.dim(1), b.dim(0))) return false;
  if (!f.left.defined()) {
    f.left = left;
  } else if (left.node()->root() != f.left.node()->root() || left.offset() != f.left.offset() ||
             left.shape() != f.left.shape()) {
    return false;  // blocks with different left factors
  }
  f.blocks.push_back({b, col});
  return true;
}

// The column blocks of t [R, C]: one product, or products placed along the
// columns by scatter_slice and add_slice (step 1, disjoint).
bool add_blocks(const Tensor& t, FactoredGradient& f) {
  const Node* n = producer(t);
  const auto is_column_slice = [&] {
    const auto& a = n->attrs.ints;
    return a.size() >= 4 && a[0] == 1 && a[3] == 1 && t.rank() == 2;
  };
  if (is_op(n, "scatter_slice") && is_column_slice()) return add_product(n->inputs[0], n->attrs.ints[1], f);
  if (is_op(n, "add_slice") && is_column_slice()) {
    return add_blocks(n->inputs[0], f) && add_product(n->inputs[1], n->attrs.ints[1], f);
  }
  return add_product(t, 0, f);
}

}  // namespace

int64_t FactoredGradient::elements() const {
  int64_t n = left.numel() + (values.defined() ? values.numel() + indices.numel() : 0);
  for (const Block& b : blocks) n += b.right.numel();
  return n;
}

std::optional<FactoredGradient> factor_gradient(const Tensor& g) {
  if (g.rank() != 2 || g.dtype() != DType::f32) return std::nullopt;
  FactoredGradient f;
  const Node* n = producer(g);
  if (is_op(n, "add_rows")) {
    // A tied embedding: the output head's product, then the lookup's rows.
    const Tensor &values = n->inputs[1], &indices = n->inputs[2];
    if (!add_blocks(n->inputs[0], f) || values.dtype() != DType::f32 ||
        values.numel() != indices.numel() * g.dim(1)) {
      return std::nullopt;
    }
    f.values = values;
    f.indices = indices;
  } else if (!add_blocks(g, f)) {
    return std::nullopt;
  }
  // Every block T x width at its columns, disjoint, within C.
  std::sort(f.blocks.begin(), f.blocks.end(), [](const auto& a, const auto& b) { return a.col < b.col; });
  int64_t end = 0;
  for (const auto& b : f.blocks) {
    if (b.right.dim(0) != f.left.dim(0) || b.col < end) return std::nullopt;
    end = b.col + b.right.dim(1);
  }
  if (f.left.dim(1) != g.dim(0) || end > g.dim(1) || f.elements() >= g.numel()) return std::nullopt;
  return f;
}

GradientRows::GradientRows(const float* left, int64_t tokens, int64_t rows, int64_t cols, std::vector<Block> blocks,
                           const float* values, const int32_t* indices, int64_t n_indices, bool bf16)
    : left_(left), tokens_(tokens), rows_(rows), cols_(cols), blocks_(std::move(blocks)), values_(values),
      indices_(indices), n_indices_(n_indices), bf16_(bf16) {
  int64_t covered = 0;
  for (const Block& b : blocks_) covered += b.width;
  covered_ = covered == cols_;
}

void GradientRows::new_run() {
  static std::atomic<uint64_t> runs{0};
  run_ = ++runs;
}

void GradientRows::check_indices() const {
  for (int64_t q = 0; q < n_indices_; ++q) {
    if (indices_[q] < 0 || indices_[q] >= rows_) {
      throw ShapeError("add_rows: index " + std::to_string(indices_[q]) + " at position " + std::to_string(q) +
                       " is out of range for " + std::to_string(rows_) + " rows");
    }
  }
}

int64_t GradientRows::norm_pieces() const { return gram_pieces() + (n_indices_ > 0); }

// f32: a tile per pair of kGramRows-row blocks J <= I; bf16: a panel per I.
int64_t GradientRows::gram_pieces() const {
  const int64_t p = (tokens_ + kGramRows - 1) / kGramRows;
  return bf16_ ? p : p * (p + 1) / 2;
}

namespace {

// Sub-tiles of 4 x 4 Gram entries: 16 dot products in registers.
constexpr int64_t kSub = 4;
// Elements of a row per pass over a tile: 128 rows of 4 KiB stay in L2
// while every 4 x 4 sub-tile of the tile reads them (shorter passes measure
// slower, longer ones alike: docs/performance.md).
constexpr int64_t kDepth = 1024;

// c[i][j] += x_i . y_j over [0, n) for four rows x_i and four y_j (contiguous
// along the sum): sixteen dot products in vector lanes, folded once at the
// end. A Gram matrix's rows are long and few, so this reads them in place
// where a GEMM would first pack both operands (for T x T Grams over 768 to
// 50,257 columns it spent as long packing as multiplying).
void dots_4x4(const float* const* x, const float* const* y, int64_t n, float* c, int64_t ldc) {
  using cpu::VecF;
  constexpr int W = VecF::kWidth;
  std::array<VecF, 16> acc;
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) acc[r] = 0.0f;
  const auto step = [&](int64_t k, int64_t m) {
    std::array<VecF, kSub> a, b;
#pragma GCC unroll 4
    for (int i = 0; i < kSub; ++i) {
      a[i] = VecF::load(x[i] + k, 1, m), b[i] = VecF::load(y[i] + k, 1, m);
      // In registers: g++ otherwise reads one side again inside each of
      // its four FMAs, 20 loads where 8 do.
#if defined(__AVX512F__)
      asm("" : "+v"(a[i].v), "+v"(b[i].v));
#elif defined(__x86_64__)
      asm("" : "+x"(a[i].v), "+x"(b[i].v));
#endif
    }
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) acc[r] = cpu::fma(a[r / kSub], b[r % kSub], acc[r]);
  };
  int64_t k = 0;
  for (; k + W <= n; k += W) step(k, W);
  if (k < n) step(k, n - k);  // lanes past n load as 0
  const std::array<float, 16> sum = cpu::reduce_add_each<16>(acc);
  for (int r = 0; r < 16; ++r) c[(r / kSub) * ldc + r % kSub] += sum[r];
}

// g[i][j] += x_{i0 + i} . x_{j0 + j} (rows of x, ld apart, `width` long;
// g's rows ldg apart) for i < m, j < n, the sub-tiles on and below the
// diagonal only when `lower` (a diagonal tile). Rows past m or n repeat the
// last row; their entries of g (rows and columns up to a multiple of 4)
// are written but not meant.
void gram_tile(const float* x, int64_t ld, int64_t width, int64_t i0, int64_t m, int64_t j0, int64_t n, bool lower,
               float* g, int64_t ldg) {
  for (int64_t k0 = 0; k0 < width; k0 += kDepth) {
    const int64_t depth = std::min(kDepth, width - k0);
    for (int64_t ib = 0; ib < m; ib += kSub) {
      std::array<const float*, kSub> xi;
      for (int64_t i = 0; i < kSub; ++i) xi[i] = x + (i0 + std::min(ib + i, m - 1)) * ld + k0;
      for (int64_t jb = 0; jb < (lower ? ib + kSub : n); jb += kSub) {
        std::array<const float*, kSub> yj;
        for (int64_t j = 0; j < kSub; ++j) yj[j] = x + (j0 + std::min(jb + j, n - 1)) * ld + k0;
        dots_4x4(xi.data(), yj.data(), depth, g + ib * ldg + jb, ldg);
      }
    }
  }
}

}  // namespace

double GradientRows::norm_piece(int64_t piece) const {
  if (piece == gram_pieces()) return lookup_terms();
  // Rows [i0, i0 + m) of A and B against rows [j0, j0 + n), which end at or
  // before the diagonal block [i0, i0 + m). In f32 a tile of 64 rows each,
  // J <= I. Under bf16 a panel, rows I against every row up to I's last: the
  // graph's product multiplies bf16-rounded factors (exactly, summing in
  // f32), and so do the Gram matrices, on gemm_bf16, which runs them faster
  // in panels than in tiles (docs/performance.md).
  int64_t ti = piece, tj = 0;
  if (!bf16_) {
    ti = 0;
    while ((ti + 1) * (ti + 2) / 2 <= piece) ++ti;
    tj = piece - ti * (ti + 1) / 2;
  }
  const int64_t i0 = ti * kGramRows, m = std::min(kGramRows, tokens_ - i0);
  const int64_t j0 = tj * kGramRows, n = bf16_ ? i0 + m : std::min(kGramRows, tokens_ - j0);
  const int64_t ldg = (n + kSub - 1) / kSub * kSub;
  thread_local std::vector<float> a, b;
  a.assign(size_t(kGramRows * ldg), 0.0f);
  b.assign(size_t(kGramRows * ldg), 0.0f);
  const auto gram = [&](const float* x, int64_t width, float* out) {
    if (!bf16_) return gram_tile(x, width, width, i0, m, j0, n, j0 == i0, out, ldg);
    cpu::gemm_bf16(false, true, m, n, width, 1.0f, x + i0 * width, width, x + j0 * width, width, 1.0f, out, ldg);
  };
  gram(left_, rows_, a.data());
  for (const Block& block : blocks_) gram(block.right, block.width, b.data());
  // A and B are symmetric: an entry left of the diagonal block stands for
  // its mirror too, and so does one in a 4 x 4 sub-tile below the diagonal
  // ones within the block; those above are their mirrors (and not made in
  // f32).
  double sum = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      const int64_t d = j0 + c - i0;  // column within the diagonal block; < 0 left of it
      if (d >= 0 && d / kSub > r / kSub) break;
      const double term = double(a[r * ldg + c]) * double(b[r * ldg + c]);
      sum += d >= 0 && d / kSub == r / kSub ? term : 2 * term;
    }
  }
  return sum;
}

double GradientRows::lookup_terms() const {
  // <L^T G, S> = sum_q sum_t L[t, idx_q] (G V^T)[t, q], V the lookup's rows
  // (which add_rows adds in f32: only L and G are rounded under bf16).
  const int64_t T = tokens_, n = n_indices_;
  thread_local std::vector<float> m, g_rounded;
  m.resize(size_t(T * n));
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& g = blocks_[i];
    const float* right = g.right;
    if (bf16_) {
      g_rounded.assign(g.right, g.right + T * g.width);
      cpu::round_to_bf16(g_rounded.data(), int64_t(g_rounded.size()));
      right = g_rounded.data();
    }
    cpu::gemm<float>(false, true, T, n, g.width, 1.0f, right, g.width, values_ + g.col, cols_, i ? 1.0f : 0.0f,
                     m.data(), n);
  }
  double cross = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t q = 0; q < n; ++q) {
      const float l = left_[t * rows_ + indices_[q]];
      cross += double(bf16_ ? cpu::round_to_bf16(l) : l) * double(m[t * n + q]);
    }
  }
  // ||S||^2, each row's additions summed first.
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t q = 0; q < n; ++q) order[q] = q;
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return indices_[x] < indices_[y]; });
  std::vector<double> row(static_cast<size_t>(cols_));
  double rows_sq = 0;
  for (size_t k = 0; k < order.size();) {
    std::fill(row.begin(), row.end(), 0.0);
    const int32_t r = indices_[order[k]];
    for (; k < order.size() && indices_[order[k]] == r; ++k) {
      const float* v = values_ + order[k] * cols_;
      for (int64_t j = 0; j < cols_; ++j) row[j] += v[j];
    }
    for (double x : row) rows_sq += x * x;
  }
  return 2 * cross + rows_sq;
}

const float* GradientRows::range(int64_t begin, int64_t end) const {
  const int64_t r0 = begin / cols_, r1 = (end + cols_ - 1) / cols_, n_rows = r1 - r0;
  thread_local std::vector<float> scratch;
  scratch.resize(size_t(n_rows * cols_));
  float* out = scratch.data();
  if (!covered_) std::fill(scratch.begin(), scratch.end(), 0.0f);  // scatter_slice's zeros
  // Rows r0.. of left^T right, block by block: the graph's matmul computes
  // each element with the same kernel and order whichever tile it falls in.
  // A range is a few rows (32K elements), so packing a whole right factor
  // for each would cost as much as the product (GPT-2's c_fc: 11 rows
  // against 256 x 3072): each thread packs each block once per run (the
  // ranges of one parameter come in order) and keeps the last parameter's.
  thread_local std::vector<std::unique_ptr<cpu::PackedB>> packed;
  thread_local std::vector<uint64_t> packed_run;
  while (packed.size() < blocks_.size()) {
    packed.push_back(std::make_unique<cpu::PackedB>());
    packed_run.push_back(0);
  }
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    float* c = out + b.col;
    // The blocked kernel, as the graph's tiles ran (factor_gradient checked
    // they all do), even where these few rows would be gemm_small's size.
    if (packed_run[i] == run_ || packed[i]->pack(false, tokens_, b.width, b.right, b.width, bf16_)) {
      packed_run[i] = run_;
      packed[i]->multiply(true, n_rows, b.width, tokens_, left_ + r0, rows_, c, cols_);
    } else if (bf16_) {
      cpu::gemm_bf16(true, false, n_rows, b.width, tokens_, 1.0f, left_ + r0, rows_, b.right, b.width, 0.0f, c, cols_);
    } else {  // no AVX-512 kernel: OpenBLAS or the built-in one, as gemm<float> runs the graph's
      cpu::gemm<float>(true, false, n_rows, b.width, tokens_, 1.0f, left_ + r0, rows_, b.right, b.width, 0.0f, c,
                       cols_);
    }
  }
  // add_rows' additions that land here, in index order as it makes them.
  for (int64_t q = 0; q < n_indices_; ++q) {
    const int64_t r = indices_[q];
    if (r < r0 || r >= r1) continue;
    float* o = out + (r - r0) * cols_;
    const float* v = values_ + q * cols_;
    for (int64_t j = 0; j < cols_; ++j) o[j] += v[j];
  }
  return out + (begin - r0 * cols_);
}

}  // namespace nabla::train
