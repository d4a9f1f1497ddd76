// attention: softmax(scale q k^T, causal) v per (batch, head), fused, on
// token-major operands q [B, Tq, H, D], k [B, Tk, H, D], v [B, Tk, H, Dv]:
// the layout a qkv projection's output has once reshaped to heads, so no
// permute or copy happens on the way in or out. Per (batch, head) and block
// of queries, the scores live in a per-thread scratch and never in
// the arena; the backward recomputes them from q and k (flash attention's
// trade of FLOPs for memory) instead of keeping every layer's T x T
// probabilities alive until the backward pass. Causal attention skips the
// keys no query of a block can see.
// attention_back: dq, dk and dv packed in one flat tensor (q's, k's, then v's
// elements), which attention's backward splits into views.
// scaled_dot_product_attention: the composed form over [..., T, D] operands
// with an optional additive mask; attention's and attention_back's oracle.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cpu/gemm.h"
#include "backend/cpu/simd.h"
#include "core/op.h"
#include "nabla/graph.h"
#include "ops/last_axis.h"

namespace nabla {

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, bool causal, std::optional<double> scale) {
  for (const Tensor* t : {&q, &k, &v}) {
    if (!t->defined())
      throw UsageError("scaled_dot_product_attention: an input is an undefined tensor");
  }
  if (q.rank() < 2 || k.rank() < 2 || v.rank() < 2) {
    throw ShapeError("scaled_dot_product_attention: q, k, v must be [..., T, D], got q " +
                     to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " +
                     to_string(v.shape()));
  }
  if (q.dim(-1) != k.dim(-1) || k.dim(-2) != v.dim(-2)) {
    throw ShapeError(
        "scaled_dot_product_attention: need q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv], got "
        "q " +
        to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " + to_string(v.shape()));
  }
  double s = scale ? *scale : 1.0 / std::sqrt(double(q.dim(-1)));
  // [..., Tq, D] x [..., D, Tk] -> [..., Tq, Tk]; rows over keys.
  Tensor p = softmax(matmul(q, transpose(k)), s, mask, causal);
  return matmul(p, v);  // [..., Tq, Dv]
}

namespace ops {
namespace {

// attrs: ints {causal}, reals {scale}.
bool causal_of(const Attrs& a) { return a.ints[0] != 0; }
double scale_of(const Attrs& a) { return a.reals[0]; }

// Queries per block: causal attention skips the keys no query of a block
// sees, so it takes blocks of at most 64; otherwise a block holds as many
// queries as keep its scores within 64k elements (256 KiB in f32, in L2).
// Blocks split the queries evenly.
int64_t query_block(int64_t tq, int64_t tk, bool causal) {
  int64_t blocks = std::max<int64_t>(1, (tq * tk + 65535) / 65536);
  if (causal) blocks = std::max(blocks, (tq + 63) / 64);
  return (tq + blocks - 1) / blocks;
}

void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  require_floating(op, q, "q");
  require_same_dtype(op, q, k);
  require_same_dtype(op, q, v);
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) {
    throw ShapeError(std::string(op) + ": q, k, v must be [B, T, H, D], got q " + to_string(q.shape()) + ", k " +
                     to_string(k.shape()) + ", v " + to_string(v.shape()));
  }
  const bool ok = q.dim(0) == k.dim(0) && k.dim(0) == v.dim(0) && q.dim(2) == k.dim(2) && k.dim(2) == v.dim(2) &&
                  q.dim(3) == k.dim(3) && k.dim(1) == v.dim(1);
  if (!ok) {
    throw ShapeError(std::string(op) + ": need q [B, Tq, H, D], k [B, Tk, H, D], v [B, Tk, H, Dv], got q " +
                     to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " + to_string(v.shape()));
  }
  if (causal && q.dim(1) > k.dim(1)) {
    throw ShapeError(std::string(op) + ": causal with more queries (" + std::to_string(q.dim(1)) + ") than keys (" +
                     std::to_string(k.dim(1)) + ") hides whole rows; use scaled_dot_product_attention");
  }
}

Meta attention_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  check_qkv("attention", q, k, v, causal_of(attrs));
  return {q.dtype(), {q.dim(0), q.dim(1), q.dim(2), v.dim(3)}};
}

Meta attention_back_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &q = in[0], &k = in[1], &v = in[2], &dout = in[3];
  check_qkv("attention_back", q, k, v, causal_of(attrs));
  require_same_dtype("attention_back", q, dout);
  const Shape expect{q.dim(0), q.dim(1), q.dim(2), v.dim(3)};
  if (dout.shape() != expect) {
    throw ShapeError("attention_back: dout is " + to_string(dout.shape()) + ", the output's shape is " +
                     to_string(expect));
  }
  return {q.dtype(), {q.numel() + k.numel() + v.numel()}};
}

// buf's first n elements, which the caller overwrites: the buffer only grows,
// so the blocks of one head (kv growing and shrinking again) do not zero-fill
// it each time, which cost 5% of the causal attention's time.
template <class T>
T* uninitialized(std::vector<T>& buf, int64_t n) {
  if (buf.size() < size_t(n)) buf.resize(size_t(n));
  return buf.data();
}

// One head's rows [row0, row0 + rows) of a [B, T, H, C] operand as cpu::gemm
// reads a matrix: row-major or transposed in place, else gathered.
template <class T>
struct HeadRows {
  const T* p;
  int64_t ld;
  bool trans;
};

template <class T>
HeadRows<T> head_rows(const TensorView& t, int64_t b, int64_t h, int64_t row0, int64_t rows, std::vector<T>& buf) {
  const Strides& s = t.strides;
  const int64_t cols = t.shape[3];
  const T* p = t.ptr<T>() + b * s[0] + h * s[2] + row0 * s[1];
  if (s[3] == 1 || cols == 1) return {p, s[1], false};
  if (s[1] == 1 || rows == 1) return {p, s[3], true};
  T* out = uninitialized(buf, rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = p[r * s[1] + c * s[3]];
  return {out, cols, false};
}

// The B operand of a product that every query block of a head repeats (K^T
// for the scores, V for the output, V^T for dP, K for dQ), as the product
// reads it: packed once per head (cpu::PackedB) for f32 on the AVX-512
// kernel when the head has several blocks, which a product would otherwise
// pack again for each (a quarter of GPT-2 small's causal attention time went
// to packing); else handed to cpu::product each time.
template <class T>
struct HeadOperand {
  bool trans;
  const T* p;
  int64_t ld;
  const cpu::PackedB* packed;

  // C [M, n] = op(A) times this operand's first k rows and n columns.
  void multiply(bool bf16, bool trans_a, int64_t M, int64_t n, int64_t k, const T* A, int64_t lda, T* C,
                int64_t ldc) const {
    if constexpr (std::is_same_v<T, float>) {
      if (packed) return packed->multiply(trans_a, M, n, k, A, lda, C, ldc);
    }
    cpu::product<T>(bf16, trans_a, trans, M, n, k, A, lda, p, ld, C, ldc);
  }
};

// op(B) [K, N] from a head's rows (transposed with trans), packed into buf
// when share.
template <class T>
HeadOperand<T> head_operand(bool trans, const HeadRows<T>& rows, int64_t K, int64_t N, bool share,
                            cpu::PackedB& buf) {
  HeadOperand<T> op{trans, rows.p, rows.ld, nullptr};
  if constexpr (std::is_same_v<T, float>) {
    if (share && buf.pack(trans, K, N, rows.p, rows.ld)) op.packed = &buf;
  }
  return op;
}

// Per-thread buffers. NOTE: a function-level thread_local (see
// cpu::gather_buffer for why not one inside the kernel's lambda).
template <class T>
struct Scratch {
  std::vector<T> q, k, v, dout, p, dp;
  cpu::PackedB k_t, v_n, v_t, k_n;  // K^T, V, V^T, K packed (f32)
};
template <class T>
Scratch<T>& scratch() {
  thread_local Scratch<T> s;
  return s;
}

// Rows of scores s [rows, kv] (queries row0..) turned into probabilities in
// place: softmax of scale * s over each row's visible keys, zeros after them.
template <class T>
void softmax_rows(T* s, int64_t rows, int64_t kv, int64_t row0, int64_t tq, int64_t tk, bool causal, double scale) {
  for (int64_t r = 0; r < rows; ++r) {
    T* y = s + r * kv;
    const int64_t visible = causal ? causal_visible(row0 + r, tq, tk) : tk;
    if constexpr (std::is_same_v<T, float>) {
      cpu::softmax_in_place(y, visible, kv, float(scale));
    } else {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        y[j] = T(double(y[j]) * scale);
        mx = (double(y[j]) > mx || y[j] != y[j]) ? double(y[j]) : mx;
      }
      double total = 0;
      for (int64_t j = 0; j < visible; ++j) {
        const double e = std::exp(double(y[j]) - mx);
        y[j] = T(e);
        total += e;
      }
      for (int64_t j = 0; j < visible; ++j) y[j] = T(double(y[j]) / total);
      std::fill(y + visible, y + kv, T(0));
    }
  }
}

// One row of dS = P (dP - rowsum(P dP)) scale, dP in place of dS.
template <class T>
void score_gradient_row(const T* p, T* ds, int64_t kv, double scale) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::softmax_back_row(p, 1, ds, 1, kv, float(scale), ds);
  } else {
    T dot = T(0);
    for (int64_t j = 0; j < kv; ++j) dot += p[j] * ds[j];
    const T sc = T(scale);
    for (int64_t j = 0; j < kv; ++j) ds[j] = p[j] * (ds[j] - dot) * sc;
  }
}

struct Dims {
  int64_t B, Tq, Tk, H, D, Dv;
};

Dims dims_of(const TensorView& q, const TensorView& v) {
  return {q.shape[0], q.shape[1], v.shape[1], q.shape[2], q.shape[3], v.shape[3]};
}

// (batch, head) pairs per parallel chunk: about 2^17 multiply-adds each.
int64_t head_grain(const Dims& d) {
  return std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, d.Tq * d.Tk * (d.D + d.Dv)));
}

// Queries [i0, i0 + rows) of one head: P = softmax(scale Q K^T) in s.p, and
// the number of keys any of these queries sees. bf16: the bf16 matmul option
// (every product of the op rounds its operands, as a matmul's do).
template <class T>
int64_t block_probabilities(const TensorView& q, int64_t b, int64_t h, int64_t i0, int64_t rows,
                            const HeadOperand<T>& Kt, const Dims& d, bool causal, double scale, bool bf16,
                            Scratch<T>& s, HeadRows<T>& Q) {
  const int64_t kv = causal ? causal_visible(i0 + rows - 1, d.Tq, d.Tk) : d.Tk;
  Q = head_rows(q, b, h, i0, rows, s.q);
  T* p = uninitialized(s.p, rows * kv);
  Kt.multiply(bf16, Q.trans, rows, kv, d.D, Q.p, Q.ld, p, kv);
  softmax_rows(p, rows, kv, i0, d.Tq, d.Tk, causal, scale);
  return kv;
}

template <class T>
void attention_kernel(const KernelArgs& a) {
  const TensorView &q = a.in[0], &k = a.in[1], &v = a.in[2];
  const Dims d = dims_of(q, v);
  const bool causal = causal_of(*a.attrs);
  const double scale = scale_of(*a.attrs);
  const bool bf16 = a.bf16_matmul;
  T* out = a.out.ptr<T>();
  const int64_t block = query_block(d.Tq, d.Tk, causal);
  const bool share = !bf16 && block < d.Tq;
  a.parallel_for(d.B * d.H, head_grain(d), [&](int64_t t0, int64_t t1) {
    Scratch<T>& s = scratch<T>();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / d.H, h = t % d.H;
      const HeadRows<T> K = head_rows(k, b, h, 0, d.Tk, s.k), V = head_rows(v, b, h, 0, d.Tk, s.v);
      // op(B) = K^T for the scores: K stored [Tk, D] is B transposed.
      const HeadOperand<T> Kt = head_operand(!K.trans, K, d.D, d.Tk, share, s.k_t);
      const HeadOperand<T> Vn = head_operand(V.trans, V, d.Tk, d.Dv, share, s.v_n);
      for (int64_t i0 = 0; i0 < d.Tq; i0 += block) {
        const int64_t rows = std::min(block, d.Tq - i0);
        HeadRows<T> Q{};
        const int64_t kv = block_probabilities(q, b, h, i0, rows, Kt, d, causal, scale, bf16, s, Q);
        // O rows = P V, written into out [B, Tq, H, Dv] in place.
        T* o = out + ((b * d.Tq + i0) * d.H + h) * d.Dv;
        Vn.multiply(bf16, false, rows, d.Dv, kv, s.p.data(), kv, o, d.H * d.Dv);
      }
    }
  });
}

// dS = P (dP - rowsum(P dP)) scale, with dP = dO V^T; then dQ = dS K,
// dK += dS^T Q, dV += P^T dO, query block by query block in order, so each
// head's sums run in a fixed order whatever the threads.
template <class T>
void attention_back_kernel(const KernelArgs& a) {
  const TensorView &q = a.in[0], &k = a.in[1], &v = a.in[2], &dout = a.in[3];
  const Dims d = dims_of(q, v);
  const bool causal = causal_of(*a.attrs);
  const double scale = scale_of(*a.attrs);
  const bool bf16 = a.bf16_matmul;
  T* dq = a.out.ptr<T>();
  T* dk = dq + d.B * d.Tq * d.H * d.D;
  T* dv = dk + d.B * d.Tk * d.H * d.D;
  const int64_t block = query_block(d.Tq, d.Tk, causal);
  const bool share = !bf16 && block < d.Tq;
  a.parallel_for(d.B * d.H, head_grain(d), [&](int64_t t0, int64_t t1) {
    Scratch<T>& s = scratch<T>();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / d.H, h = t % d.H;
      T* dk_h = dk + (b * d.Tk * d.H + h) * d.D;
      T* dv_h = dv + (b * d.Tk * d.H + h) * d.Dv;
      // Keys [0, written) of dk and dv hold sums; the blocks' kv never shrinks.
      int64_t written = 0;
      const HeadRows<T> K = head_rows(k, b, h, 0, d.Tk, s.k), V = head_rows(v, b, h, 0, d.Tk, s.v);
      const HeadOperand<T> Kt = head_operand(!K.trans, K, d.D, d.Tk, share, s.k_t);
      const HeadOperand<T> Vt = head_operand(!V.trans, V, d.Dv, d.Tk, share, s.v_t);
      const HeadOperand<T> Kn = head_operand(K.trans, K, d.Tk, d.D, share, s.k_n);
      for (int64_t i0 = 0; i0 < d.Tq; i0 += block) {
        const int64_t rows = std::min(block, d.Tq - i0);
        HeadRows<T> Q{};
        const int64_t kv = block_probabilities(q, b, h, i0, rows, Kt, d, causal, scale, bf16, s, Q);
        const HeadRows<T> dO = head_rows(dout, b, h, i0, rows, s.dout);
        T* P = s.p.data();
        T* dS = uninitialized(s.dp, rows * kv);
        Vt.multiply(bf16, dO.trans, rows, kv, d.Dv, dO.p, dO.ld, dS, kv);
        for (int64_t r = 0; r < rows; ++r) score_gradient_row(P + r * kv, dS + r * kv, kv, scale);
        T* dq_rows = dq + ((b * d.Tq + i0) * d.H + h) * d.D;
        Kn.multiply(bf16, false, rows, d.D, kv, dS, kv, dq_rows, d.H * d.D);
        // dK += dS^T Q and dV += P^T dO over the keys written before, and
        // written (no pass zeroing them first) over the keys new to this block.
        for (const bool add : {true, false}) {
          const int64_t j0 = add ? 0 : written, j1 = add ? written : kv;
          if (j1 <= j0) continue;
          cpu::product<T>(bf16, true, Q.trans, j1 - j0, d.D, rows, dS + j0, kv, Q.p, Q.ld, dk_h + j0 * d.H * d.D,
                          d.H * d.D, add);
          cpu::product<T>(bf16, true, dO.trans, j1 - j0, d.Dv, rows, P + j0, kv, dO.p, dO.ld,
                          dv_h + j0 * d.H * d.Dv, d.H * d.Dv, add);
        }
        written = std::max(written, kv);
      }
      for (int64_t j = written; j < d.Tk; ++j) {  // keys no query sees
        std::fill(dk_h + j * d.H * d.D, dk_h + j * d.H * d.D + d.D, T(0));
        std::fill(dv_h + j * d.H * d.Dv, dv_h + j * d.H * d.Dv + d.Dv, T(0));
      }
    }
  });
}

void attention_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "attention", [&]<class T>() { attention_kernel<T>(a); });
}

void attention_back_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "attention_back", [&]<class T>() { attention_back_kernel<T>(a); });
}

// [B, T, H, C] <-> [B, H, T, C].
Tensor heads_first(const Tensor& x) { return permute(x, {0, 2, 1, 3}); }

Tensor attention_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  Tensor o = scaled_dot_product_attention(heads_first(in[0]), heads_first(in[1]), heads_first(in[2]), Tensor(),
                                          causal_of(attrs), scale_of(attrs));
  return heads_first(o);
}

Tensor attention_back_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  Tensor o = attention_composite({in[0], in[1], in[2]}, attrs);
  std::vector<Tensor> g = grad(sum(o * in[3]), {in[0], in[1], in[2]});
  for (Tensor& t : g) t = reshape(contiguous(t), {-1});
  return concat(g, 0);
}

Grads attention_backward(const BackwardArgs& g) {
  const Tensor &q = g.inputs[0], &k = g.inputs[1], &v = g.inputs[2];
  Tensor flat = attention_back(q, k, v, g.dout, causal_of(g.attrs), scale_of(g.attrs));
  const int64_t nq = q.numel(), nk = k.numel(), nv = v.numel();
  return {reshape(slice(flat, 0, 0, nq), q.shape()), reshape(slice(flat, 0, nq, nq + nk), k.shape()),
          reshape(slice(flat, 0, nq + nk, nq + nk + nv), v.shape())};
}

std::vector<GradCase> attention_cases() {
  using V = std::vector<Tensor>;
  return {
      {"plain", {normal({2, 3, 2, 4}), normal({2, 3, 2, 4}), normal({2, 3, 2, 4})},
       [](const V& x) { return attention(x[0], x[1], x[2]); }},
      {"causal_more_keys", {normal({1, 2, 2, 3}), normal({1, 5, 2, 3}), normal({1, 5, 2, 2})},
       [](const V& x) { return attention(x[0], x[1], x[2], true); }},
      {"fewer_keys_scaled", {normal({2, 4, 1, 2}), normal({2, 3, 1, 2}), normal({2, 3, 1, 5})},
       [](const V& x) { return attention(x[0], x[1], x[2], false, 0.7); }},
      // Two query blocks, causal: the second sees keys the first does not.
      {"causal_two_blocks", {normal({1, 67, 1, 2}), normal({1, 67, 1, 2}), normal({1, 67, 1, 3})},
       [](const V& x) { return attention(x[0], x[1], x[2], true); }},
  };
}

std::vector<GradCase> attention_back_cases() {
  using V = std::vector<Tensor>;
  return {
      {"plain", {normal({2, 3, 2, 2}), normal({2, 3, 2, 2}), normal({2, 3, 2, 3}), normal({2, 3, 2, 3})},
       [](const V& x) { return attention_back(x[0], x[1], x[2], x[3], false, 0.6); }},
      {"causal_more_keys", {normal({1, 2, 2, 3}), normal({1, 4, 2, 3}), normal({1, 4, 2, 2}), normal({1, 2, 2, 2})},
       [](const V& x) { return attention_back(x[0], x[1], x[2], x[3], true, 0.5); }},
  };
}

}  // namespace

extern const OpDef op_attention{
    .name = "attention",
    .summary = "softmax(scale q k^T, causal) v over [B, T, H, D] heads; fused, scores recomputed in the backward",
    .inputs = {{"q", Diff::yes}, {"k", Diff::yes}, {"v", Diff::yes}},
    .fused = true,
    .infer = attention_infer,
    .forward = attention_forward,
    .backward = attention_backward,
    .composite = attention_composite,
    .cases = attention_cases,
};

extern const OpDef op_attention_back{
    .name = "attention_back",
    .summary = "attention's dq, dk, dv, packed flat; fused (its own gradient through the composite)",
    .inputs = {{"q", Diff::yes}, {"k", Diff::yes}, {"v", Diff::yes}, {"dout", Diff::yes}},
    .fused = true,
    .infer = attention_back_infer,
    .forward = attention_back_forward,
    .composite = attention_back_composite,
    .cases = attention_back_cases,
};

}  // namespace ops

namespace {
Attrs attention_attrs(const Tensor& q, bool causal, std::optional<double> scale) {
  if (!q.defined()) throw UsageError("attention: q is an undefined tensor");
  if (q.rank() != 4) throw ShapeError("attention: q must be [B, T, H, D], got " + to_string(q.shape()));
  return Attrs{{causal ? 1 : 0}, {scale ? *scale : 1.0 / std::sqrt(double(q.dim(3)))}};
}
}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, std::optional<double> scale) {
  return apply(ops::op_attention, {q, k, v}, attention_attrs(q, causal, scale));
}

Tensor attention_back(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, bool causal,
                      double scale) {
  return apply(ops::op_attention_back, {q, k, v, dout}, attention_attrs(q, causal, scale));
}

}  // namespace nabla
