// matmul: [..., M, K] x [..., K, N] -> [..., M, N]; batch axes broadcast.
// Operands reach GEMM without copies when their last two axes are row- or
// column-major (transposed views included); other layouts are packed first.
#include <algorithm>
#include <type_traits>
#include <utility>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/strided.h"
#include "core/op.h"
#include "ops/internal_ops.h"
#include "ops/matmul.h"

namespace nabla {
namespace ops {
namespace {

Meta matmul_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &a = in[0], &b = in[1];
  require_floating("matmul", a, "a");
  require_same_dtype("matmul", a, b);
  if (a.rank() < 2 || b.rank() < 2) {
    throw ShapeError("matmul: operands need at least 2 axes here, got a " + to_string(a.shape()) + " and b " +
                     to_string(b.shape()));
  }
  if (a.dim(-1) != b.dim(-2)) {
    throw ShapeError("matmul: inner dimensions differ: a is " + to_string(a.shape()) + ", b is " +
                     to_string(b.shape()));
  }
  Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                 Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
  batch.push_back(a.dim(-2));
  batch.push_back(b.dim(-1));
  return {a.dtype(), batch};
}

// [..., H, M, K] x [..., H, K, N] -> [..., M, H, N]: matmul's result with its
// last batch axis (attention's heads) moved after the rows.
Meta matmul_heads_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  if (in[0].rank() < 3 || in[1].rank() < 3) {
    throw ShapeError("matmul_heads: operands need a heads axis before their matrices, got a " +
                     to_string(in[0].shape()) + " and b " + to_string(in[1].shape()));
  }
  Meta m = matmul_infer(in, attrs);
  std::swap(m.shape[m.shape.size() - 3], m.shape[m.shape.size() - 2]);
  return m;
}

// [M, K] x [K, N] + c -> [M, N], c broadcast to [M, N] (a bias [N], or a
// tensor the product is added into).
Meta matmul_add_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  if (in[0].rank() != 2 || in[1].rank() != 2) {
    throw ShapeError("matmul_add: a and b must be matrices, got a " + to_string(in[0].shape()) + " and b " +
                     to_string(in[1].shape()));
  }
  Meta m = matmul_infer(in, attrs);
  require_same_dtype("matmul_add", in[0], in[2]);
  if (broadcast_shapes(in[2].shape(), m.shape, "matmul_add") != m.shape) {
    throw ShapeError("matmul_add: c " + to_string(in[2].shape()) + " does not broadcast to the product's " +
                     to_string(m.shape));
  }
  return m;
}

// How one operand's matrix reaches GEMM: row-major with leading dimension ld,
// or transposed; `packed` when neither layout fits and a copy is made.
struct Operand {
  bool trans = false;
  int64_t ld = 0;
  bool packed = false;
};

Operand gemm_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  // Strides of size-1 axes are irrelevant, so pretend they are the natural ones.
  if (rows == 1) row_stride = std::max<int64_t>(cols, 1);
  if (cols == 1) col_stride = 1;
  if (col_stride == 1 && row_stride >= std::max<int64_t>(cols, 1)) return {false, row_stride, false};
  if (rows == 1 && cols == 1) return {false, 1, false};
  if (row_stride == 1 && col_stride >= std::max<int64_t>(rows, 1)) return {true, col_stride, false};
  return {false, std::max<int64_t>(cols, 1), true};
}

// Multiply-adds below which a task is not worth handing to a thread (~5 us).
constexpr int64_t kMinTileWork = int64_t{1} << 19;

// Tile sizes of C for a batch of n_batch GEMMs [M, K] x [K, N], from the
// shapes alone (never the thread count: determinism). Tiles start at most
// kMaxTile square and are halved, the longer side first, until the call has
// kTasks tasks, as long as a tile keeps kMinTileWork multiply-adds and 128
// rows and columns, or 64 while there are fewer than kTasks / 2 tasks: a
// weight gradient (small M and N, K the batch of tokens) still splits over
// its output, and small GEMMs stay whole. Sizes are multiples of 16 (GEMM
// micro-kernel widths) and split their dimension evenly. Each tile repacks
// its panels of A and B, K (mt + nt) moves against K mt nt multiply-adds.
// kTasks = 4 suits 2 cores: fewer, larger GEMM calls than 8, and larger tiles
// gain nothing (docs/performance.md). A machine with many more cores would
// want more; being a constant, not the thread count, it keeps results
// bit-identical across thread counts.
std::pair<int64_t, int64_t> matmul_tiles(int64_t n_batch, int64_t M, int64_t N, int64_t K) {
  constexpr int64_t kMaxTile = 512, kMinTile = 64, kTasks = 4;
  const auto tile = [](int64_t dim, int64_t parts) {
    const int64_t t = (dim + parts - 1) / parts;
    return parts == 1 ? std::max<int64_t>(dim, 1) : (t + 15) / 16 * 16;
  };
  int64_t parts_m = std::max<int64_t>(1, (M + kMaxTile - 1) / kMaxTile);
  int64_t parts_n = std::max<int64_t>(1, (N + kMaxTile - 1) / kMaxTile);
  for (;;) {
    const int64_t tm = tile(M, parts_m), tn = tile(N, parts_n);
    const int64_t tasks = n_batch * ((M + tm - 1) / tm) * ((N + tn - 1) / tn);
    if (tasks >= kTasks) break;
    // Halve the longer side, or the other one when the longer cannot split.
    // Tiles narrower than 2 * kMinTile only to reach kTasks / 2 tasks.
    const int64_t min_tile = tasks < kTasks / 2 ? kMinTile : 2 * kMinTile;
    const int64_t tm2 = tile(M, 2 * parts_m), tn2 = tile(N, 2 * parts_n);
    const bool m_ok = tm2 >= min_tile && tm2 * tn * K >= kMinTileWork;
    const bool n_ok = tn2 >= min_tile && tm * tn2 * K >= kMinTileWork;
    if (m_ok && (tm >= tn || !n_ok)) {
      parts_m *= 2;
    } else if (n_ok) {
      parts_n *= 2;
    } else {
      break;
    }
  }
  return {tile(M, parts_m), tile(N, parts_n)};
}

// A long reduction into a small output (a weight gradient: [out, in] <- X^T dY
// summed over every token) has too few output tiles to keep big tiles busy
// on every thread: it splits K instead. Each task multiplies one K chunk of
// the whole output (up to kMaxTile square) into its own partial product, and
// the partials are added in chunk order. The chunk length (K split evenly in
// about kSplitChunk rows, a multiple of 16: even for bf16 pairs) comes from
// the shapes alone, so results do not depend on the threads. 0: no split.
// A wider output with K at least 16 times its sides (GPT-2's output head's
// input gradient, [256, 768] summed over the 50,257-word vocabulary) splits
// K in kWideParts: its output tiles would each pack the whole of A again
// (four tiles, four times 51 MB), where each chunk packs its part once
// (docs/performance.md); 2 to 16 parts measure alike.
constexpr int64_t kSplitChunk = 512;
constexpr int64_t kWideParts = 4;
int64_t split_k_chunk(int64_t n_batch, int64_t M, int64_t N, int64_t K) {
  if (n_batch != 1 || K < 2 * kSplitChunk) return 0;
  int64_t parts = (K + kSplitChunk - 1) / kSplitChunk;
  if (M > 512 || N > 512) {
    if (K < 16 * std::max(M, N) || M * N > (int64_t{1} << 20)) return 0;  // partials up to 4 MiB each
    parts = kWideParts;
  }
  return ((K + parts - 1) / parts + 15) / 16 * 16;
}

// matmul_add's addend c seen as [M, N] (broadcast strides), or none.
struct Addend {
  const void* data = nullptr;
  int64_t row_stride = 0, col_stride = 0;
  bool in_place = false;  // c is the output's own memory: the product accumulates onto it
};

template <class T>
T addend_at(const Addend& c, int64_t i, int64_t j) {
  return static_cast<const T*>(c.data)[i * c.row_stride + j * c.col_stride];
}

// C[M, N] = A B in K chunks of `chunk` rows (see split_k_chunk); la, lb unpacked.
template <class T>
void matmul_split_k(const KernelArgs& args, const T* a, Operand la, const T* b, Operand lb, T* C, int64_t M,
                    int64_t N, int64_t K, int64_t chunk, const Addend& addend) {
  const int64_t chunks = (K + chunk - 1) / chunk;
  // Grow-only scratch of the calling thread, which outlives the parallel_for.
  thread_local std::vector<T> partials;
  partials.resize(size_t(chunks * M * N));
  T* P = partials.data();
  args.parallel_for(chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      const int64_t k0 = c * chunk, kc = std::min(chunk, K - k0);
      // op(A) columns k0.. and op(B) rows k0..: A^T stored [K, M], B^T stored [N, K].
      const T* a_chunk = a + (la.trans ? k0 * la.ld : k0);
      const T* b_chunk = b + (lb.trans ? k0 : k0 * lb.ld);
      cpu::product<T>(args.bf16_matmul, la.trans, lb.trans, M, N, kc, a_chunk, la.ld, b_chunk, lb.ld, P + c * M * N, N);
    }
  });
  // Runs of kRun elements through a buffer, each loop over a run a vector
  // loop, with no division per element to find the addend's row. The addend
  // is read before C is written: it may be C itself.
  args.parallel_for(M * N, cpu::grain_for(chunks), [&](int64_t b0, int64_t e0) {
    constexpr int64_t kRun = 256;
    T acc[kRun];
    for (int64_t r0 = b0; r0 < e0; r0 += kRun) {
      const int64_t n = std::min(kRun, e0 - r0);
      std::copy(P + r0, P + r0 + n, acc);
      for (int64_t c = 1; c < chunks; ++c) {
        const T* part = P + c * M * N + r0;
        for (int64_t i = 0; i < n; ++i) acc[i] += part[i];
      }
      if (addend.data) {
        for (int64_t i = 0, row = r0 / N, col = r0 % N; i < n; ++i) {
          acc[i] += addend_at<T>(addend, row, col);
          if (++col == N) col = 0, ++row;
        }
      }
      std::copy(acc, acc + n, C + r0);
    }
  });
}

// heads_out: the output is [..., M, H, N] (matmul_heads) rather than
// [..., H, M, N]: each product of the batch writes rows of stride H N.
// addend: matmul_add's c, added to the product (read in the AVX-512 kernels'
// store, or by beta = 1 onto C holding c: no zeroed output either way).
template <class T>
void matmul_kernel(const KernelArgs& args, bool heads_out, const Addend& addend = {}) {
  const TensorView &A = args.in[0], &B = args.in[1];
  Shape out_shape = args.out.shape;
  int r = static_cast<int>(out_shape.size());
  if (heads_out) std::swap(out_shape[r - 3], out_shape[r - 2]);
  int64_t M = out_shape[r - 2], N = out_shape[r - 1], K = A.shape[A.shape.size() - 1];
  Shape batch(out_shape.begin(), out_shape.end() - 2);
  int64_t n_batch = numel(batch);
  // Where product bi of the batch starts in the output, and its row stride.
  const int64_t heads = heads_out ? out_shape[r - 3] : 1, ldc = heads * N;
  const auto c_offset = [&](int64_t bi) { return (bi / heads) * M * ldc + (bi % heads) * N; };
  Shape a_batch(A.shape.begin(), A.shape.end() - 2), b_batch(B.shape.begin(), B.shape.end() - 2);
  Strides a_bs = cpu::broadcast_strides(a_batch, Strides(A.strides.begin(), A.strides.end() - 2), batch);
  Strides b_bs = cpu::broadcast_strides(b_batch, Strides(B.strides.begin(), B.strides.end() - 2), batch);
  size_t ar = A.shape.size(), br = B.shape.size();
  Operand la = gemm_layout(M, K, A.strides[ar - 2], A.strides[ar - 1]);
  Operand lb = gemm_layout(K, N, B.strides[br - 2], B.strides[br - 1]);

  // Batch offsets of each operand, in output order.
  const std::vector<int64_t> a_off = cpu::position_offsets(batch, a_bs), b_off = cpu::position_offsets(batch, b_bs);

  // One product: heads is 1 and the output is plain row-major.
  if (const int64_t chunk = split_k_chunk(n_batch, M, N, K); chunk > 0 && !la.packed && !lb.packed) {
    return matmul_split_k<T>(args, A.ptr<T>() + a_off[0], la, B.ptr<T>() + b_off[0], lb, args.out.ptr<T>(), M, N,
                             K, chunk, addend);
  }

  // Tiles chosen from the shapes alone, never the thread count: the same GEMM
  // calls run whichever thread takes a tile, so results are bit-identical.
  // NOTE: not a structured binding: the lambda below captures these, which
  // clang before 16 (the fuzz build's clang 14) rejects.
  const std::pair<int64_t, int64_t> tiles = matmul_tiles(n_batch, M, N, K);
  const int64_t tile_m = tiles.first, tile_n = tiles.second;
  int64_t tiles_m = (M + tile_m - 1) / tile_m, tiles_n = (N + tile_n - 1) / tile_n;
  int64_t tasks = n_batch * tiles_m * tiles_n;
  T* C = args.out.ptr<T>();
  const T* Ap = A.ptr<T>();
  const T* Bp = B.ptr<T>();
  // Small batched GEMMs (attention heads) go several to a chunk. Larger
  // ones too, four chunks per thread: a chunk's neighbouring products (the
  // heads of one image) share lines and stream from memory together, and
  // each one's successor is known, to prefetch.
  // The grain may follow the thread count here, unlike in reductions: every
  // task writes its own tile, whoever runs it.
  const int64_t grain = std::max({int64_t{1}, kMinTileWork / std::max<int64_t>(1, tile_m * tile_n * K),
                                  tasks / (4 * int64_t{std::max(args.threads, 1)})});
  const bool small = M * N * K <= cpu::kSmallGemmWork;
  args.parallel_for(tasks, grain, [&](int64_t tb, int64_t te) {
    std::vector<T> pack_a, pack_b;
    for (int64_t t = tb; t < te; ++t) {
      int64_t bi = t / (tiles_m * tiles_n), rem = t % (tiles_m * tiles_n);
      int64_t m0 = (rem / tiles_n) * tile_m, n0 = (rem % tiles_n) * tile_n;
      int64_t mt = std::min(tile_m, M - m0), nt = std::min(tile_n, N - n0);
      const T* a = Ap + a_off[bi];
      const T* b = Bp + b_off[bi];
      // Rows m0.. of A and columns n0.. of B.
      const T* a_tile;
      Operand oa = la;
      if (la.packed) {
        pack_a.resize(mt * K);
        for (int64_t i = 0; i < mt; ++i)
          for (int64_t k = 0; k < K; ++k) pack_a[i * K + k] = a[(m0 + i) * A.strides[ar - 2] + k * A.strides[ar - 1]];
        a_tile = pack_a.data();
        oa = {false, std::max<int64_t>(K, 1), false};
      } else {
        a_tile = a + m0 * A.strides[ar - 2];
      }
      const T* b_tile;
      Operand ob = lb;
      if (lb.packed) {
        pack_b.resize(K * nt);
        for (int64_t k = 0; k < K; ++k)
          for (int64_t j = 0; j < nt; ++j) pack_b[k * nt + j] = b[k * B.strides[br - 2] + (n0 + j) * B.strides[br - 1]];
        b_tile = pack_b.data();
        ob = {false, std::max<int64_t>(nt, 1), false};
      } else {
        b_tile = b + n0 * B.strides[br - 1];
      }
      T* c_tile = C + c_offset(bi) + m0 * ldc + n0;
      // A later product of the chunk, requested before this one runs: the
      // next (one head's q and k: 100 KB, read by GEMM's packing a line at a
      // time at its start), or for small ones (attention at 16 tokens: a few
      // lines of each operand, 100-200 ns of arithmetic) the one after it,
      // output included, since the next one's lines would arrive too late.
      if (const int64_t next = bi + (small ? 2 : 1);
          rem == tiles_m * tiles_n - 1 && next * tiles_m * tiles_n < te && !la.packed && !lb.packed) {
        const int64_t e = sizeof(T);
        cpu::prefetch_matrix(Ap + a_off[next], la.trans ? K : M, (la.trans ? M : K) * e, la.ld * e, false);
        cpu::prefetch_matrix(Bp + b_off[next], lb.trans ? N : K, (lb.trans ? K : N) * e, lb.ld * e, false);
        if (small) cpu::prefetch_matrix(C + c_offset(next), M, N * e, ldc * e, true);
      }
      // The tile starts as c (unless c is the output's own memory) and the
      // product accumulates onto it.
      const T* d = addend.data && !addend.in_place
                       ? static_cast<const T*>(addend.data) + m0 * addend.row_stride + n0 * addend.col_stride
                       : nullptr;
      cpu::product<T>(args.bf16_matmul, oa.trans, ob.trans, mt, nt, K, a_tile, oa.ld, b_tile, ob.ld, c_tile, ldc,
                      addend.data != nullptr, d, addend.row_stride, addend.col_stride);
    }
  });
}

void matmul_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "matmul", [&]<class T>() { matmul_kernel<T>(a, false); });
}

void matmul_add_forward(const KernelArgs& a) {
  const TensorView& c = a.in[2];
  const Shape& out = a.out.shape;
  const Strides st = cpu::broadcast_strides(c.shape, c.strides, out);
  Addend addend{c.data, st[0], st[1], false};
  addend.in_place = c.data == a.out.data && st[0] == out[1] && st[1] == 1;
  dispatch_floating(a.out.dtype, "matmul_add", [&]<class T>() { matmul_kernel<T>(a, false, addend); });
}

void matmul_heads_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "matmul_heads", [&]<class T>() { matmul_kernel<T>(a, true); });
}

// A matrix stored transposed: a view like a linear layer's transpose(weight).
bool column_major(const Tensor& t) {
  return t.rank() == 2 && !t.is_contiguous() && t.strides()[0] == 1 && t.dim(0) > 1 && t.dim(1) > 1;
}

Tensor swap_rows_and_heads(const Tensor& t) {
  std::vector<int64_t> perm(static_cast<size_t>(t.rank()));
  for (int i = 0; i < t.rank(); ++i) perm[i] = i;
  std::swap(perm[t.rank() - 3], perm[t.rank() - 2]);
  return permute(t, perm);
}

// [..., H, R, C] whose memory is a contiguous [..., R, H, C]: token-major
// heads seen heads-first, as attention reads q, k and v. `transposed`: the
// same for t's transpose (its last two axes swapped), as attention reads k^T.
bool heads_first(const Tensor& t, bool transposed) {
  if (t.rank() < 3) return false;
  const Tensor u = transposed ? transpose(t) : t;
  return u.dim(-3) > 1 && u.dim(-2) > 1 && swap_rows_and_heads(u).is_contiguous();
}

// True when t has no batch axes of its own (rank 2, or every batch axis 1)
// while the product [..., M, N] has some: a weight every product shares.
bool shared_by_batch(const Tensor& t, const Tensor& dout) {
  if (dout.rank() <= 2) return false;
  for (int i = 0; i + 2 < t.rank(); ++i) {
    if (t.dim(i) != 1) return false;
  }
  return true;
}

// lhs^T rhs over the batch folded into the rows: lhs [..., R, P] and rhs
// [..., R, Q] with the same leading shape as one product [P, B R] x [B R, Q];
// undefined unless rhs is contiguous (lhs is copied when it is not). A shared
// operand's gradient is the sum over the batch of one product per entry,
// which this computes as one long product (K-split, like any weight
// gradient) instead of a batch of short ones and a sum over them: the copy
// of lhs, when there is one, costs less than that sum reads.
Tensor folded_product(const Tensor& lhs, const Tensor& rhs) {
  if (!rhs.is_contiguous() || lhs.rank() != rhs.rank() ||
      !std::equal(lhs.shape().begin(), lhs.shape().end() - 1, rhs.shape().begin())) {
    return {};
  }
  const int64_t p = lhs.dim(-1), q = rhs.dim(-1);
  return matmul(transpose(reshape(contiguous(lhs), {-1, p})), reshape(rhs, {-1, q}));
}

// dA = dC B^T, dB = A^T dC, each summed over the batch axes it was broadcast
// on; an operand shared by the whole batch (conv_2d's kernel) gets that sum
// as one product over the folded batch where the layouts allow. A 2-D
// operand stored transposed gets its gradient computed transposed
// (dB^T = dC^T A), for the same cost: the gradient reaching the stored matrix
// (the weight) is then contiguous, with no copy for the optimizer and no
// strided sum where a tied embedding adds its own part. Likewise an operand
// that is token-major heads seen heads-first (or its transpose) gets its
// gradient from matmul_heads, written token-major: it reaches the projection
// that made it without a copy.
Grads matmul_grads(const BackwardArgs& g, const Tensor& dout) {
  const Tensor &a = g.inputs[0], &b = g.inputs[1];
  const bool plain = a.rank() == 2 && b.rank() == 2;
  const Shape& batch_shape = dout.shape();
  const auto unbroadcast = [&](const Tensor& t) {
    return t.rank() == dout.rank() && std::equal(t.shape().begin(), t.shape().end() - 2, batch_shape.begin());
  };
  Grads d(2);
  if (g.needs(0)) {
    if (plain && column_major(a)) {
      d[0] = transpose(matmul(b, transpose(dout)));
    } else if (unbroadcast(a) && heads_first(a, false)) {
      d[0] = swap_rows_and_heads(matmul_heads(dout, transpose(b)));
    } else if (unbroadcast(a) && heads_first(a, true)) {
      d[0] = transpose(swap_rows_and_heads(matmul_heads(b, transpose(dout))));
    } else if (Tensor f = shared_by_batch(a, dout) ? folded_product(transpose(dout), transpose(b)) : Tensor();
               f.defined()) {
      d[0] = reshape(f, a.shape());  // (dC^T)^T B^T, [M, K]
    } else {
      d[0] = sum_to(matmul(dout, transpose(b)), a.shape());
    }
  }
  if (g.needs(1)) {
    if (plain && column_major(b)) {
      d[1] = transpose(matmul(transpose(dout), a));
    } else if (unbroadcast(b) && heads_first(b, false)) {
      d[1] = swap_rows_and_heads(matmul_heads(transpose(a), dout));
    } else if (unbroadcast(b) && heads_first(b, true)) {
      d[1] = transpose(swap_rows_and_heads(matmul_heads(transpose(dout), a)));
    } else if (Tensor f = shared_by_batch(b, dout) ? folded_product(a, dout) : Tensor(); f.defined()) {
      d[1] = reshape(f, b.shape());  // A^T dC, [K, N]
    } else {
      d[1] = sum_to(matmul(transpose(a), dout), b.shape());
    }
  }
  return d;
}

Grads matmul_backward(const BackwardArgs& g) { return matmul_grads(g, g.dout); }

// The output gradient seen [..., H, M, N] is a matmul's.
Grads matmul_heads_backward(const BackwardArgs& g) { return matmul_grads(g, swap_rows_and_heads(g.dout)); }

// The product's gradients as matmul's; c's is the output gradient summed
// over the axes it was broadcast on (a bias: over the rows).
Grads matmul_add_backward(const BackwardArgs& g) {
  Grads d = matmul_grads(g, g.dout);
  d.resize(3);
  if (g.needs(2)) d[2] = sum_to(g.dout, g.inputs[2].shape());
  return d;
}

Tensor matmul_add_composite(const std::vector<Tensor>& in, const Attrs&) { return add(matmul(in[0], in[1]), in[2]); }

Tensor matmul_heads_composite(const std::vector<Tensor>& in, const Attrs&) {
  return contiguous(swap_rows_and_heads(matmul(in[0], in[1])));
}

std::vector<GradCase> matmul_cases() {
  auto mm = [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); };
  return {
      {"matrix", {normal({3, 4}), normal({4, 5})}, mm},
      {"batched", {normal({2, 3, 4}), normal({2, 4, 2})}, mm},
      {"broadcast_batch", {normal({2, 1, 3, 4}), normal({3, 4, 2})}, mm},
      {"vector", {normal({4}), normal({4, 3})}, mm},
      {"outer", {normal({3, 1}), normal({1, 4})}, mm},
      // Token-major [N, T, H, D] operands seen heads-first, as attention
      // reads them: their gradients come back token-major.
      {"heads_first", {normal({2, 4, 3, 5}), normal({2, 4, 3, 5})},
       [](const std::vector<Tensor>& x) {
         return matmul(permute(x[0], {0, 2, 1, 3}), transpose(permute(x[1], {0, 2, 1, 3})));
       }},
  };
}

std::vector<GradCase> matmul_add_cases() {
  auto ma = [](const std::vector<Tensor>& x) { return matmul_add(x[0], x[1], x[2]); };
  return {
      {"bias", {normal({3, 4}), normal({4, 5}), normal({5})}, ma},
      {"full", {normal({3, 4}), normal({4, 5}), normal({3, 5})}, ma},
      {"column", {normal({3, 4}), normal({4, 5}), normal({3, 1})}, ma},
      // A linear layer: x W^T + bias, W stored [out, in].
      {"linear", {normal({6, 4}), normal({5, 4}), normal({5})},
       [](const std::vector<Tensor>& x) { return matmul_add(x[0], transpose(x[1]), x[2]); }},
      // Tokens [2, 3, 4] through a linear layer: folded to one product.
      {"batched_rows", {normal({2, 3, 4}), normal({4, 5}), normal({2, 3, 5})}, ma},
  };
}

std::vector<GradCase> matmul_heads_cases() {
  auto mh = [](const std::vector<Tensor>& x) { return matmul_heads(x[0], x[1]); };
  auto heads = [](const Tensor& t) { return permute(t, {0, 2, 1, 3}); };
  return {
      {"heads", {normal({2, 3, 4, 5}), normal({2, 3, 5, 2})}, mh},
      {"one_head", {normal({2, 1, 4, 3}), normal({2, 1, 3, 2})}, mh},
      {"broadcast_batch", {normal({3, 4, 5}), normal({2, 3, 5, 2})}, mh},
      // Attention's output and its gradients: p [N, H, T, T] against
      // token-major v seen heads-first.
      {"attention_values", {normal({2, 3, 4, 4}), normal({2, 4, 3, 5})},
       [=](const std::vector<Tensor>& x) { return matmul_heads(x[0], heads(x[1])); }},
  };
}

}  // namespace

bool matmul_tiles_blocked(int64_t M, int64_t N, int64_t K) {
  if (split_k_chunk(1, M, N, K) > 0) return false;
  const std::pair<int64_t, int64_t> tiles = matmul_tiles(1, M, N, K);
  // The smallest tile is the last row's last one.
  const int64_t edge_m = M % tiles.first ? M % tiles.first : tiles.first;
  const int64_t edge_n = N % tiles.second ? N % tiles.second : tiles.second;
  return edge_m * edge_n * K > cpu::kSmallGemmWork;
}

extern const OpDef op_matmul{
    .name = "matmul",
    .summary = "[..., M, K] x [..., K, N] -> [..., M, N], batch axes broadcast",
    .inputs = {{"a", Diff::yes}, {"b", Diff::yes}},
    .infer = matmul_infer,
    .backward = matmul_backward,
    .cases = matmul_cases,
};
NABLA_CPU_KERNEL(op_matmul, matmul_forward);

extern const OpDef op_matmul_add{
    .name = "matmul_add",
    .summary = "[M, K] x [K, N] + c, c broadcast (a bias): the product accumulated onto c in one pass",
    .inputs = {{"a", Diff::yes}, {"b", Diff::yes}, {"c", Diff::yes}},
    .inplace_input = 2,
    .fused = true,
    .infer = matmul_add_infer,
    .backward = matmul_add_backward,
    .composite = matmul_add_composite,
    .cases = matmul_add_cases,
};
NABLA_CPU_KERNEL(op_matmul_add, matmul_add_forward);

extern const OpDef op_matmul_heads{
    .name = "matmul_heads",
    .summary = "[..., H, M, K] x [..., H, K, N] -> [..., M, H, N]: matmul with heads moved after rows, no copy",
    .inputs = {{"a", Diff::yes}, {"b", Diff::yes}},
    .fused = true,
    .infer = matmul_heads_infer,
    .backward = matmul_heads_backward,
    .composite = matmul_heads_composite,
    .cases = matmul_heads_cases,
};
NABLA_CPU_KERNEL(op_matmul_heads, matmul_heads_forward);

}  // namespace ops

Tensor matmul_heads(const Tensor& a, const Tensor& b) { return apply(ops::op_matmul_heads, {a, b}); }

// Rows of a batch against one matrix fold into one product, as in matmul.
Tensor matmul_add(const Tensor& a, const Tensor& b, const Tensor& c) {
  if (a.rank() > 2 && b.rank() == 2 && a.dim(-1) == b.dim(0)) {
    Shape out = a.shape();
    out.back() = b.dim(1);
    Tensor c2 = c.rank() <= 1 ? c : reshape(expand(c, out), {-1, b.dim(1)});
    return reshape(apply(ops::op_matmul_add, {reshape(a, {-1, a.dim(-1)}), b, c2}), out);
  }
  if (a.rank() == 2 && b.rank() == 2) return apply(ops::op_matmul_add, {a, b, c});
  return matmul(a, b) + c;
}

// 1-D operands follow NumPy: a vector a is a row [1, K], a vector b a column
// [K, 1], and the added axis is dropped from the result.
Tensor matmul(const Tensor& a, const Tensor& b) {
  if (a.rank() == 0 || b.rank() == 0) {
    throw ShapeError("matmul: operands need at least 1 axis, got a " + to_string(a.shape()) + " and b " +
                     to_string(b.shape()));
  }
  Tensor a2 = a.rank() == 1 ? reshape(a, {1, a.dim(0)}) : a;
  Tensor b2 = b.rank() == 1 ? reshape(b, {b.dim(0), 1}) : b;
  Tensor c;
  if (a2.rank() > 2 && b2.rank() == 2 && a2.dim(-1) == b2.dim(0)) {
    // A batch against one matrix (a linear layer): one GEMM with the batch
    // folded into M instead of many small ones, and a backward whose weight
    // gradient is one GEMM over all rows, with no per-batch partial products.
    Shape out = a2.shape();
    out.back() = b2.dim(1);
    c = reshape(apply(ops::op_matmul, {reshape(a2, {-1, a2.dim(-1)}), b2}), out);
  } else {
    c = apply(ops::op_matmul, {a2, b2});
  }
  if (a.rank() == 1 || b.rank() == 1) {
    Shape s = c.shape();
    if (b.rank() == 1) s.erase(s.end() - 1);
    if (a.rank() == 1) s.erase(s.end() - (b.rank() == 1 ? 1 : 2));
    c = reshape(c, s);
  }
  return c;
}

}  // namespace nabla
