// attention: softmax(scale q k^T, causal) v per (batch, head), fused, on
// token-major operands q [B, Tq, H, D], k [B, Tk, Hk, D], v [B, Tk, Hk, Dv]:
// the layout a qkv projection's output has once reshaped to heads, so no
// permute or copy happens on the way in or out. Grouped-query attention
// (Hk dividing H): query head h reads key/value head h / (H / Hk) in place,
// and the backward sums a group's dk and dv in one task, in head order. Per (batch, head) and block
// of queries, the scores live in a per-thread scratch and never in
// the arena; the backward recomputes them from q and k (flash attention's
// trade of FLOPs for memory) instead of keeping every layer's T x T
// probabilities alive until the backward pass. Causal attention skips the
// keys no query of a block can see, and a sliding window those before it.
// Soft-capped scores (Gemma 2) are capped in that scratch, their tanh kept
// beside them in the backward for its factor 1 - tanh^2.
// attention_back: dq, dk and dv packed in one flat tensor (q's, k's, then v's
// elements), which attention's backward splits into views.
// attention_probs: the probabilities alone, P = softmax(scale q k^T, causal)
// [B, H, Tq, Tk], for attention that keeps them for its backward (ViT's
// short bidirectional attention: recomputing them costs `attention` a
// seventh product there). Each query block's scores are softmaxed while in
// cache, where a matmul then a softmax wrote them out and read them back.
// attention_probs_back: its dq and dk packed flat from P and dP; dS = P (dP -
// rowsum(P dP)) scale stays in a per-thread scratch for dQ = dS K and dK =
// dS^T Q, where softmax_back wrote it out for two products to read.
// attention_probs_values_back: the same from P, the values v and the
// gradient dO of O = P v, with dP = dO v^T made in that scratch too: the
// backward of attention_probs takes this form when its dout is the values'
// product's dP, which then never reaches the arena.
// scaled_dot_product_attention: the composed form over [..., T, D] operands
// with an optional additive mask; attention's and attention_back's oracle.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/simd.h"
#include "core/graph_internal.h"
#include "core/op.h"
#include "nabla/graph.h"
#include "ops/internal_ops.h"
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

extern const OpDef op_attention;  // whose composite attention_back differentiates

namespace {

// attrs: ints {causal, segments, window}, reals {scale, softcap}. segments: attention
// and attention_back take an i32 [B, T] input (after v, or after dout), each
// query seeing only the keys of its own segment id (packed documents);
// without it that input is a placeholder, never read. window > 0 (causal
// only): a sliding window, each query seeing the last `window` keys up to its
// own position. softcap > 0: scores capped to softcap tanh(s / softcap)
// before the softmax.
bool causal_of(const Attrs& a) { return a.ints[0] != 0; }
bool segmented(const Attrs& a) { return a.ints.size() > 1 && a.ints[1] != 0; }
int64_t window_of(const Attrs& a) { return a.ints.size() > 2 ? a.ints[2] : 0; }
double scale_of(const Attrs& a) { return a.reals[0]; }
double softcap_of(const Attrs& a) { return a.reals.size() > 1 ? a.reals[1] : 0.0; }

// The first key query `row` sees: 0 without a window (causal_visible's end).
int64_t window_start(int64_t row, int64_t tq, int64_t tk, int64_t window) {
  return window > 0 ? std::clamp<int64_t>(row + (tk - tq) - window + 1, 0, tk) : 0;
}

// Queries per block: causal attention skips the keys no query of a block
// sees, so it takes blocks of at most 64; otherwise a block holds as many
// queries as keep its scores within 64k elements (256 KiB in f32, in L2).
// Blocks split the queries evenly.
int64_t query_block(int64_t tq, int64_t tk, bool causal) {
  int64_t blocks = std::max<int64_t>(1, (tq * tk + 65535) / 65536);
  if (causal) blocks = std::max(blocks, (tq + 63) / 64);
  return (tq + blocks - 1) / blocks;
}

// q [B, Tq, H, D] and k [B, Tk, Hk, D] of one dtype, Hk dividing H (Hk = H
// unless grouped); causal needs Tq <= Tk.
void check_qk(const char* op, const Tensor& q, const Tensor& k, bool causal, bool grouped = false) {
  require_floating(op, q, "q");
  require_same_dtype(op, q, k);
  if (q.rank() != 4 || k.rank() != 4) {
    throw ShapeError(std::string(op) + ": q, k must be [B, T, H, D], got q " + to_string(q.shape()) + ", k " +
                     to_string(k.shape()));
  }
  const bool heads_fit = grouped ? k.dim(2) > 0 && q.dim(2) % k.dim(2) == 0 : q.dim(2) == k.dim(2);
  if (q.dim(0) != k.dim(0) || !heads_fit || q.dim(3) != k.dim(3)) {
    throw ShapeError(std::string(op) + ": need q [B, Tq, H, D], k [B, Tk, " +
                     (grouped ? "Hk, D] with Hk dividing H" : "H, D]") + ", got q " + to_string(q.shape()) + ", k " +
                     to_string(k.shape()));
  }
  if (causal && q.dim(1) > k.dim(1)) {
    throw ShapeError(std::string(op) + ": causal with more queries (" + std::to_string(q.dim(1)) + ") than keys (" +
                     std::to_string(k.dim(1)) + ") hides whole rows; the composed scaled_dot_product_attention allows it");
  }
}

void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, bool causal, bool grouped = false) {
  check_qk(op, q, k, causal, grouped);
  require_same_dtype(op, q, v);
  if (v.rank() != 4 || v.dim(0) != k.dim(0) || v.dim(1) != k.dim(1) || v.dim(2) != k.dim(2)) {
    throw ShapeError(std::string(op) + ": need q [B, Tq, H, D], k [B, Tk, " + (grouped ? "Hk" : "H") +
                     ", D], v [B, Tk, " + (grouped ? "Hk" : "H") + ", Dv], got q " + to_string(q.shape()) + ", k " +
                     to_string(k.shape()) + ", v " + to_string(v.shape()));
  }
}

// Segment ids i32 [B, T] for self-attention (as many queries as keys).
void check_segments(const char* op, const Tensor& q, const Tensor& k, const Tensor& segments) {
  if (segments.dtype() != DType::i32) {
    throw DTypeError(std::string(op) + ": segments must be i32, got " + dtype_name(segments.dtype()));
  }
  if (q.dim(1) != k.dim(1) || segments.shape() != Shape{q.dim(0), q.dim(1)}) {
    throw ShapeError(std::string(op) + ": segments need as many queries as keys and [B, T] = " +
                     to_string(Shape{q.dim(0), q.dim(1)}) + ", got q " + to_string(q.shape()) + ", k " +
                     to_string(k.shape()) + ", segments " + to_string(segments.shape()));
  }
}

Meta attention_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  check_qkv("attention", q, k, v, causal_of(attrs), /*grouped=*/true);
  if (segmented(attrs)) check_segments("attention", q, k, in[3]);
  return {q.dtype(), {q.dim(0), q.dim(1), q.dim(2), v.dim(3)}};
}

// dout: the gradient of the output p v, [B, Tq, H, Dv] in q's dtype.
void check_output_gradient(const char* op, const Tensor& q, const Tensor& v, const Tensor& dout) {
  require_same_dtype(op, q, dout);
  const Shape expect{q.dim(0), q.dim(1), q.dim(2), v.dim(3)};
  if (dout.shape() != expect) {
    throw ShapeError(std::string(op) + ": dout is " + to_string(dout.shape()) + ", the output's shape is " +
                     to_string(expect));
  }
}

Meta attention_back_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &q = in[0], &k = in[1], &v = in[2], &dout = in[3];
  check_qkv("attention_back", q, k, v, causal_of(attrs), /*grouped=*/true);
  check_output_gradient("attention_back", q, v, dout);
  if (segmented(attrs)) check_segments("attention_back", q, k, in[4]);
  return {q.dtype(), {q.numel() + k.numel() + v.numel()}};
}

// The probabilities' shape for q and k: [B, H, Tq, Tk].
Shape probs_shape(const Tensor& q, const Tensor& k) { return {q.dim(0), q.dim(2), q.dim(1), k.dim(1)}; }

Meta attention_probs_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &q = in[0], &k = in[1];
  check_qk("attention_probs", q, k, causal_of(attrs));
  return {q.dtype(), probs_shape(q, k)};
}

Meta attention_probs_back_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &q = in[0], &k = in[1], &p = in[2], &dp = in[3];
  check_qk("attention_probs_back", q, k, false);
  require_same_dtype("attention_probs_back", q, p);
  require_same_dtype("attention_probs_back", q, dp);
  const Shape expect = probs_shape(q, k);
  if (p.shape() != expect || dp.shape() != expect) {
    throw ShapeError("attention_probs_back: p and dp must be the probabilities' shape " + to_string(expect) +
                     ", got p " + to_string(p.shape()) + ", dp " + to_string(dp.shape()));
  }
  return {q.dtype(), {q.numel() + k.numel()}};
}

// q, k, p as attention_probs_back's; v [B, Tk, H, Dv] and dout [B, Tq, H, Dv].
Meta attention_probs_values_back_infer(const std::vector<Tensor>& in, const Attrs&) {
  const char* op = "attention_probs_values_back";
  const Tensor &q = in[0], &k = in[1], &p = in[2], &v = in[3], &dout = in[4];
  check_qkv(op, q, k, v, false);
  check_output_gradient(op, q, v, dout);
  require_same_dtype(op, q, p);
  const Shape expect = probs_shape(q, k);
  if (p.shape() != expect) {
    throw ShapeError(std::string(op) + ": p must be the probabilities' shape " + to_string(expect) + ", got " +
                     to_string(p.shape()));
  }
  return {q.dtype(), {q.numel() + k.numel()}};
}

// buf's first n elements, which the caller overwrites: the buffer only grows,
// so the blocks of one head (kv growing and shrinking again) do not zero-fill
// it each time.
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
// pack again for each (docs/performance.md); else handed to cpu::product each
// time.
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

  // The operand from key `key` on: keys are op(B)'s columns (K^T, V^T) or
  // rows (K, V). Key 0, or an unpacked operand (a sliding window's blocks).
  HeadOperand from_key(int64_t key, bool keys_are_columns) const {
    HeadOperand o = *this;
    o.p += key * (keys_are_columns == trans ? ld : 1);
    return o;
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
  std::vector<T> capped;            // tanh(s / softcap) of capped scores, for the backward
  cpu::PackedB k_t, v_n, v_t, k_n;  // K^T, V, V^T, K packed (f32)
};
template <class T>
Scratch<T>& scratch() {
  thread_local Scratch<T> s;
  return s;
}

// Rows of scores s [rows, kv] (row r at s + r * ld; queries row0..) turned
// into probabilities in place: softmax of scale * s over each row's visible
// keys, zeros after them.
// Column c of s is key k0 + c (a sliding window's block starts past key 0).
template <class T>
void softmax_rows(T* s, int64_t ld, int64_t rows, int64_t kv, int64_t row0, int64_t tq, int64_t tk, bool causal,
                  double scale, int64_t k0 = 0) {
  if constexpr (std::is_same_v<T, float>) {
    // Rows of up to cpu::kSoftmaxHeldVectors vectors held in registers, two
    // at a time; longer ones four at a time, their chains interleaved
    // (cpu::softmax_rows).
    const auto visible = [&](int64_t r) { return (causal ? causal_visible(row0 + r, tq, tk) : tk) - k0; };
    constexpr int kTogether = 4;
    for (int64_t r0 = 0; r0 < rows;) {
      r0 = cpu::softmax_held_rows<true>(s, s, ld, r0, rows, kv, float(scale), 0.0f, visible);
      const int n = int(std::min<int64_t>(kTogether, rows - r0));
      if (n == 0) break;
      std::array<float*, kTogether> y{};
      std::array<int64_t, kTogether> vis{};
      for (int i = 0; i < n; ++i) {
        y[i] = s + (r0 + i) * ld;
        vis[i] = visible(r0 + i);
      }
      cpu::softmax_rows<kTogether>(y.data(), vis.data(), n, kv, float(scale));
      r0 += n;
    }
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      T* y = s + r * ld;
      const int64_t visible = (causal ? causal_visible(row0 + r, tq, tk) : tk) - k0;
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

// One row of dS = P (dP - rowsum(P dP)) scale into ds, P and dP read with
// strides ps and dps (dP may be ds itself).
template <class T>
void score_gradient_row(const T* p, int64_t ps, const T* dp, int64_t dps, T* ds, int64_t kv, double scale) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::softmax_back_row(p, ps, dp, dps, kv, float(scale), ds);
  } else {
    T dot = T(0);
    for (int64_t j = 0; j < kv; ++j) dot += p[j * ps] * dp[j * dps];
    const T sc = T(scale);
    for (int64_t j = 0; j < kv; ++j) ds[j] = p[j * ps] * (dp[j * dps] - dot) * sc;
  }
}

// ds [count] times 1 - t^2: the gradient of capped scores' softmax input
// (softcap t) carried to the scores.
template <class T>
void through_cap(T* ds, const T* t, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    using cpu::VecF;
    for (int64_t i = 0; i < count; i += VecF::kWidth) {
      const int64_t n = std::min<int64_t>(VecF::kWidth, count - i);
      const VecF y = VecF::load(t + i, 1, n);
      VecF(VecF::load(ds + i, 1, n) * (1.0f - y * y)).store(ds + i, n);
    }
  } else {
    for (int64_t i = 0; i < count; ++i) ds[i] *= T(1) - t[i] * t[i];
  }
}

// Hk: key/value heads (H / Hk query heads to each).
struct Dims {
  int64_t B, Tq, Tk, H, D, Dv, Hk;
};

Dims dims_of(const TensorView& q, const TensorView& v) {
  return {q.shape[0], q.shape[1], v.shape[1], q.shape[2], q.shape[3], v.shape[3], v.shape[2]};
}

// (batch, head) pairs per parallel chunk: about 2^17 multiply-adds each.
int64_t head_grain(const Dims& d) {
  return std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, d.Tq * d.Tk * (d.D + d.Dv)));
}

// The keys [begin, end) some query of a block sees.
struct KeyRange {
  int64_t begin, end;
  int64_t count() const { return end - begin; }
};

// What hides keys from a query beyond causality: a sliding window, segments
// (a row's ids, element t at seg[t * seg_stride]; null: none).
struct Hiding {
  int64_t window;
  const int32_t* seg;
  int64_t seg_stride;
};

// Scores x [count] (unscaled products) capped in place: x = softcap
// tanh(scale x / softcap), softmax's input at scale 1; the tanh into t where
// given (the backward's factor 1 - t^2).
template <class T>
void cap_scores(T* x, int64_t count, double scale, double softcap, T* t) {
  if constexpr (std::is_same_v<T, float>) {
    using cpu::VecF;
    const float in = float(scale / softcap), out = float(softcap);
    for (int64_t i = 0; i < count; i += VecF::kWidth) {
      const int64_t n = std::min<int64_t>(VecF::kWidth, count - i);
      const VecF y = cpu::tanh(VecF::load(x + i, 1, n) * in);
      if (t) y.store(t + i, n);
      VecF(y * out).store(x + i, n);
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      const T y = T(std::tanh(double(x[i]) * scale / softcap));
      if (t) t[i] = y;
      x[i] = T(double(y) * softcap);
    }
  }
}

// Queries [i0, i0 + rows) of one head: P = softmax(scale Q K^T) in s.p over
// the keys any of them sees, which it returns (P's columns). bf16: the bf16
// matmul option (every product of the op rounds its operands, as a matmul's
// do). Keys a window or another segment hides from a query are -inf scores,
// which the softmax turns into zeros (a query always sees itself, so no row
// is all hidden). softcap > 0: the scores capped first (cap_scores), their
// tanh kept in s.capped where keep_tanh.
template <class T>
KeyRange block_probabilities(const TensorView& q, int64_t b, int64_t h, int64_t i0, int64_t rows,
                             const HeadOperand<T>& Kt, const Dims& d, bool causal, const Hiding& hide, double scale,
                             double softcap, bool keep_tanh, bool bf16, Scratch<T>& s, HeadRows<T>& Q) {
  const KeyRange keys{window_start(i0, d.Tq, d.Tk, hide.window),
                      causal ? causal_visible(i0 + rows - 1, d.Tq, d.Tk) : d.Tk};
  const int64_t n = keys.count();
  Q = head_rows(q, b, h, i0, rows, s.q);
  T* p = uninitialized(s.p, rows * n);
  Kt.from_key(keys.begin, true).multiply(bf16, Q.trans, rows, n, d.D, Q.p, Q.ld, p, n);
  if (softcap > 0) {
    cap_scores(p, rows * n, scale, softcap, keep_tanh ? uninitialized(s.capped, rows * n) : nullptr);
    scale = 1;
  }
  if (hide.seg || hide.window > 0) {
    const T hidden = -std::numeric_limits<T>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
      T* row = p + r * n;  // row[j - keys.begin] for key j
      const int64_t start = window_start(i0 + r, d.Tq, d.Tk, hide.window);
      std::fill(row, row + (std::clamp(start, keys.begin, keys.end) - keys.begin), hidden);
      if (!hide.seg) continue;
      const int32_t mine = hide.seg[(i0 + r) * hide.seg_stride];
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        if (hide.seg[j * hide.seg_stride] != mine) row[j - keys.begin] = hidden;
      }
    }
  }
  softmax_rows(p, n, rows, n, i0, d.Tq, d.Tk, causal, scale, keys.begin);
  return keys;
}

// What hides keys in row b: the window, and the row's segment ids (input
// `input`) if any.
Hiding hiding(const KernelArgs& a, size_t input, int64_t b) {
  if (!segmented(*a.attrs)) return {window_of(*a.attrs), nullptr, 0};
  const TensorView& s = a.in[input];
  return {window_of(*a.attrs), s.ptr<int32_t>() + b * s.strides[0], s.strides[1]};
}

template <class T>
void attention_kernel(const KernelArgs& a) {
  const TensorView &q = a.in[0], &k = a.in[1], &v = a.in[2];
  const Dims d = dims_of(q, v);
  const bool causal = causal_of(*a.attrs);
  const double scale = scale_of(*a.attrs), softcap = softcap_of(*a.attrs);
  const bool bf16 = a.bf16_matmul;
  T* out = a.out.ptr<T>();
  const int64_t block = query_block(d.Tq, d.Tk, causal);
  // A window's blocks start at other keys: operands packed whole do not serve them.
  const bool share = !bf16 && block < d.Tq && window_of(*a.attrs) == 0;
  a.parallel_for(d.B * d.H, head_grain(d), [&](int64_t t0, int64_t t1) {
    Scratch<T>& s = scratch<T>();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / d.H, h = t % d.H, kh = h / (d.H / d.Hk);
      const HeadRows<T> K = head_rows(k, b, kh, 0, d.Tk, s.k), V = head_rows(v, b, kh, 0, d.Tk, s.v);
      // op(B) = K^T for the scores: K stored [Tk, D] is B transposed.
      const HeadOperand<T> Kt = head_operand(!K.trans, K, d.D, d.Tk, share, s.k_t);
      const HeadOperand<T> Vn = head_operand(V.trans, V, d.Tk, d.Dv, share, s.v_n);
      for (int64_t i0 = 0; i0 < d.Tq; i0 += block) {
        const int64_t rows = std::min(block, d.Tq - i0);
        HeadRows<T> Q{};
        const KeyRange keys =
            block_probabilities(q, b, h, i0, rows, Kt, d, causal, hiding(a, 3, b), scale, softcap, false, bf16, s, Q);
        const int64_t n = keys.count();
        // O rows = P V, written into out [B, Tq, H, Dv] in place.
        T* o = out + ((b * d.Tq + i0) * d.H + h) * d.Dv;
        Vn.from_key(keys.begin, false).multiply(bf16, false, rows, d.Dv, n, s.p.data(), n, o, d.H * d.Dv);
      }
    }
  });
}

// Keys [j0, j1) of one key/value head's dk and dv (at dk_h, dv_h) zeroed.
template <class T>
void zero_keys(T* dk_h, T* dv_h, const Dims& d, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    std::fill(dk_h + j * d.Hk * d.D, dk_h + j * d.Hk * d.D + d.D, T(0));
    std::fill(dv_h + j * d.Hk * d.Dv, dv_h + j * d.Hk * d.Dv + d.Dv, T(0));
  }
}

// dS = P (dP - rowsum(P dP)) scale, with dP = dO V^T (times 1 - t^2 for
// scores capped to softcap t, t = tanh(scale s / softcap)); then dQ = dS K,
// dK += dS^T Q, dV += P^T dO, query block by query block in order, and a
// group's query heads in order, so each key/value head's sums run in a
// fixed order whatever the threads.
template <class T>
void attention_back_kernel(const KernelArgs& a) {
  const TensorView &q = a.in[0], &k = a.in[1], &v = a.in[2], &dout = a.in[3];
  const Dims d = dims_of(q, v);
  const int64_t group = d.H / d.Hk;
  const bool causal = causal_of(*a.attrs);
  const double scale = scale_of(*a.attrs), softcap = softcap_of(*a.attrs);
  const bool bf16 = a.bf16_matmul;
  T* dq = a.out.ptr<T>();
  T* dk = dq + d.B * d.Tq * d.H * d.D;
  T* dv = dk + d.B * d.Tk * d.Hk * d.D;
  const int64_t block = query_block(d.Tq, d.Tk, causal);
  const bool share = !bf16 && block < d.Tq && window_of(*a.attrs) == 0;
  const int64_t grain = std::max<int64_t>(1, head_grain(d) / group);
  a.parallel_for(d.B * d.Hk, grain, [&](int64_t t0, int64_t t1) {
    Scratch<T>& s = scratch<T>();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / d.Hk, kh = t % d.Hk;
      T* dk_h = dk + (b * d.Tk * d.Hk + kh) * d.D;
      T* dv_h = dv + (b * d.Tk * d.Hk + kh) * d.Dv;
      // Keys [0, written) of dk and dv hold sums; the blocks' key ranges
      // never move back, and after the group's first head every key holds one.
      int64_t written = 0;
      const HeadRows<T> K = head_rows(k, b, kh, 0, d.Tk, s.k), V = head_rows(v, b, kh, 0, d.Tk, s.v);
      const HeadOperand<T> Kt = head_operand(!K.trans, K, d.D, d.Tk, share, s.k_t);
      const HeadOperand<T> Vt = head_operand(!V.trans, V, d.Dv, d.Tk, share, s.v_t);
      const HeadOperand<T> Kn = head_operand(K.trans, K, d.Tk, d.D, share, s.k_n);
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < d.Tq; i0 += block) {
          const int64_t rows = std::min(block, d.Tq - i0);
          HeadRows<T> Q{};
          const KeyRange keys = block_probabilities(q, b, h, i0, rows, Kt, d, causal, hiding(a, 4, b), scale,
                                                    softcap, true, bf16, s, Q);
          const int64_t k0 = keys.begin, n = keys.count();
          zero_keys(dk_h, dv_h, d, written, k0);  // keys before the window, no query of the head sees
          written = std::max(written, k0);
          const HeadRows<T> dO = head_rows(dout, b, h, i0, rows, s.dout);
          T* P = s.p.data();
          T* dS = uninitialized(s.dp, rows * n);
          Vt.from_key(k0, true).multiply(bf16, dO.trans, rows, n, d.Dv, dO.p, dO.ld, dS, n);
          for (int64_t r = 0; r < rows; ++r) score_gradient_row(P + r * n, 1, dS + r * n, 1, dS + r * n, n, scale);
          if (softcap > 0) through_cap(dS, s.capped.data(), rows * n);
          T* dq_rows = dq + ((b * d.Tq + i0) * d.H + h) * d.D;
          Kn.from_key(k0, false).multiply(bf16, false, rows, d.D, n, dS, n, dq_rows, d.H * d.D);
          // dK += dS^T Q and dV += P^T dO over the keys written before, and
          // written (no pass zeroing them first) over the keys new to this block.
          for (const bool add : {true, false}) {
            const int64_t j0 = add ? k0 : written, j1 = add ? std::min(written, keys.end) : keys.end;
            if (j1 <= j0) continue;
            cpu::product<T>(bf16, true, Q.trans, j1 - j0, d.D, rows, dS + (j0 - k0), n, Q.p, Q.ld,
                            dk_h + j0 * d.Hk * d.D, d.Hk * d.D, add);
            cpu::product<T>(bf16, true, dO.trans, j1 - j0, d.Dv, rows, P + (j0 - k0), n, dO.p, dO.ld,
                            dv_h + j0 * d.Hk * d.Dv, d.Hk * d.Dv, add);
          }
          written = std::max(written, keys.end);
        }
        zero_keys(dk_h, dv_h, d, written, d.Tk);  // keys no query of the head sees
        written = d.Tk;
      }
    }
  });
}

// Requests one head's rows of a [B, T, H, C] operand (rows along axis 1,
// the head on axis 2) or, heads_first, of a [B, H, Tq, Tk] score tensor,
// when its rows are contiguous. The fused kernels request the operands and
// outputs of the head kAheadHeads after the one they compute where a head's
// operands are small (kPrefetchHead bytes): a head of 16 tokens is a few
// lines in scattered rows, which otherwise arrive one miss at a time, and
// takes less time to compute than a miss from memory, hence two heads ahead
// (as matmul does for its small batched products). Long rows stream in on
// the hardware prefetcher.
constexpr int64_t kPrefetchHead = int64_t{64} << 10;
constexpr int64_t kAheadHeads = 2;
template <class T>
void prefetch_head(const TensorView& x, int64_t t, int64_t heads, bool heads_first, bool for_write = false) {
  const Strides& s = x.strides;
  if (s[3] != 1) return;
  const int64_t b = t / heads, h = t % heads;
  const int64_t row_axis = heads_first ? 2 : 1, head_axis = heads_first ? 1 : 2;
  const int64_t e = sizeof(T);
  cpu::prefetch_matrix(x.ptr<T>() + b * s[0] + h * s[head_axis], x.shape[row_axis], x.shape[3] * e,
                       s[row_axis] * e, for_write);
}

// Calls request(u) for the heads u of [t0, t1) that head t's turn brings
// kAheadHeads ahead: the first kAheadHeads too at the chunk's start.
template <class F>
void request_ahead(int64_t t, int64_t t0, int64_t t1, F&& request) {
  if (t == t0) {
    for (int64_t u = t0; u < std::min(t1, t0 + kAheadHeads); ++u) request(u);
  }
  if (t + kAheadHeads < t1) request(t + kAheadHeads);
}

// Per (batch, head), query block by query block: S = Q K^T into the block's
// rows of P (only the keys a causal block sees), softmaxed there at once,
// while they are in cache.
template <class T>
void attention_probs_kernel(const KernelArgs& a) {
  const TensorView &q = a.in[0], &k = a.in[1];
  const Dims d{q.shape[0], q.shape[1], k.shape[1], q.shape[2], q.shape[3], 0, q.shape[2]};
  const bool causal = causal_of(*a.attrs);
  const double scale = scale_of(*a.attrs);
  T* out = a.out.ptr<T>();
  const int64_t block = query_block(d.Tq, d.Tk, causal);
  const bool ahead = int64_t(sizeof(T)) * (d.Tq + d.Tk) * d.D <= kPrefetchHead;
  a.parallel_for(d.B * d.H, head_grain(d), [&](int64_t t0, int64_t t1) {
    Scratch<T>& s = scratch<T>();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / d.H, h = t % d.H;
      if (ahead) {
        request_ahead(t, t0, t1, [&](int64_t u) {
          prefetch_head<T>(q, u, d.H, false);
          prefetch_head<T>(k, u, d.H, false);
          prefetch_head<T>(a.out, u, d.H, true, true);
        });
      }
      const HeadRows<T> K = head_rows(k, b, h, 0, d.Tk, s.k);
      T* p_head = out + t * d.Tq * d.Tk;  // P [b, h]
      for (int64_t i0 = 0; i0 < d.Tq; i0 += block) {
        const int64_t rows = std::min(block, d.Tq - i0);
        const int64_t kv = causal ? causal_visible(i0 + rows - 1, d.Tq, d.Tk) : d.Tk;
        const HeadRows<T> Q = head_rows(q, b, h, i0, rows, s.q);
        T* p = p_head + i0 * d.Tk;
        // K stored [Tk, D] is op(B) = K^T transposed.
        cpu::product<T>(a.bf16_matmul, Q.trans, !K.trans, rows, kv, d.D, Q.p, Q.ld, K.p, K.ld, p, d.Tk);
        softmax_rows(p, d.Tk, rows, d.Tk, i0, d.Tq, d.Tk, causal, scale);
      }
    }
  });
}

// Per (batch, head), query block by query block: dS into a scratch, then
// dQ's rows = dS K and dK += dS^T Q (written by the first block), so each
// head's sums run in a fixed order whatever the threads. Every key of a row
// takes part (P is zero where causal attention hid a key, and the op has no
// causal rule of its own). dP is read from in[3], or with values made first
// in the scratch as dO V^T from in[3] = v and in[4] = dO.
template <class T>
void attention_probs_back_kernel(const KernelArgs& a, bool values) {
  const TensorView &q = a.in[0], &k = a.in[1], &p = a.in[2];
  const TensorView& dp = a.in[3];  // without values
  const TensorView& v = a.in[3];   // with values, and dO:
  const TensorView* dout = values ? &a.in[4] : nullptr;
  const Dims d{q.shape[0], q.shape[1], k.shape[1], q.shape[2], q.shape[3], values ? v.shape[3] : 0, q.shape[2]};
  const double scale = scale_of(*a.attrs);
  const bool bf16 = a.bf16_matmul;
  T* dq = a.out.ptr<T>();
  T* dk = dq + d.B * d.Tq * d.H * d.D;
  const int64_t block = query_block(d.Tq, d.Tk, false);
  const bool share = values && !bf16 && block < d.Tq;
  const Strides &ps = p.strides, &dps = dp.strides;
  Dims work = d;
  work.Dv = d.D + d.Dv;  // dQ's and dK's products per score, and dP's with values
  const int64_t operands = values ? (d.Tq + d.Tk) * (d.D + d.Dv) + d.Tq * d.Tk : (d.Tq + d.Tk) * d.D + 2 * d.Tq * d.Tk;
  const bool ahead = int64_t(sizeof(T)) * operands <= kPrefetchHead;
  a.parallel_for(d.B * d.H, head_grain(work), [&](int64_t t0, int64_t t1) {
    Scratch<T>& s = scratch<T>();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / d.H, h = t % d.H;
      if (ahead) {
        request_ahead(t, t0, t1, [&](int64_t u) {
          prefetch_head<T>(q, u, d.H, false);
          prefetch_head<T>(k, u, d.H, false);
          prefetch_head<T>(p, u, d.H, true);
          if (values) {
            prefetch_head<T>(v, u, d.H, false);
            prefetch_head<T>(*dout, u, d.H, false);
          } else {
            prefetch_head<T>(dp, u, d.H, true);
          }
          // dq and dk, token-major as q and k are.
          const int64_t e = sizeof(T), ub = u / d.H, uh = u % d.H;
          cpu::prefetch_matrix(dq + (ub * d.Tq * d.H + uh) * d.D, d.Tq, d.D * e, d.H * d.D * e, true);
          cpu::prefetch_matrix(dk + (ub * d.Tk * d.H + uh) * d.D, d.Tk, d.D * e, d.H * d.D * e, true);
        });
      }
      const HeadRows<T> K = head_rows(k, b, h, 0, d.Tk, s.k);
      HeadOperand<T> Vt{};  // V stored [Tk, Dv] is op(B) = V^T transposed
      if (values) {
        const HeadRows<T> V = head_rows(v, b, h, 0, d.Tk, s.v);
        Vt = head_operand(!V.trans, V, d.Dv, d.Tk, share, s.v_t);
      }
      T* dk_h = dk + (b * d.Tk * d.H + h) * d.D;
      for (int64_t i0 = 0; i0 < d.Tq; i0 += block) {
        const int64_t rows = std::min(block, d.Tq - i0);
        const HeadRows<T> Q = head_rows(q, b, h, i0, rows, s.q);
        T* dS = uninitialized(s.dp, rows * d.Tk);
        const T* dp_rows = dS;  // values: dP's rows, made here
        int64_t dp_row = d.Tk, dp_col = 1;
        if (values) {
          const HeadRows<T> dO = head_rows(*dout, b, h, i0, rows, s.dout);
          Vt.multiply(bf16, dO.trans, rows, d.Tk, d.Dv, dO.p, dO.ld, dS, d.Tk);
        } else {
          dp_rows = dp.ptr<T>() + b * dps[0] + h * dps[1] + i0 * dps[2];
          dp_row = dps[2];
          dp_col = dps[3];
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          score_gradient_row(p.ptr<T>() + b * ps[0] + h * ps[1] + i * ps[2], ps[3], dp_rows + r * dp_row, dp_col,
                             dS + r * d.Tk, d.Tk, scale);
        }
        T* dq_rows = dq + ((b * d.Tq + i0) * d.H + h) * d.D;
        cpu::product<T>(bf16, false, K.trans, rows, d.D, d.Tk, dS, d.Tk, K.p, K.ld, dq_rows, d.H * d.D);
        cpu::product<T>(bf16, true, Q.trans, d.Tk, d.D, rows, dS, d.Tk, Q.p, Q.ld, dk_h, d.H * d.D, i0 > 0);
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

void attention_probs_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "attention_probs", [&]<class T>() { attention_probs_kernel<T>(a); });
}

void attention_probs_back_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "attention_probs_back", [&]<class T>() { attention_probs_back_kernel<T>(a, false); });
}

void attention_probs_values_back_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "attention_probs_values_back",
                    [&]<class T>() { attention_probs_back_kernel<T>(a, true); });
}

// [B, T, H, C] <-> [B, H, T, C].
Tensor heads_first(const Tensor& x) { return permute(x, {0, 2, 1, 3}); }

// Each of x's Hk heads [B, T, Hk, C] repeated for its group of `heads`
// query heads: [B, T, heads, C].
Tensor per_query_head(const Tensor& x, int64_t heads) {
  const int64_t B = x.dim(0), T = x.dim(1), Hk = x.dim(2), C = x.dim(3);
  if (Hk == heads) return x;
  return reshape(expand(reshape(x, {B, T, Hk, 1, C}), {B, T, Hk, heads / Hk, C}), {B, T, heads, C});
}

// Segments as an additive mask [B, 1, T, T]: 0 within a segment, -inf across.
Tensor segment_mask(const Tensor& segments, DType dtype) {
  const int64_t B = segments.dim(0), T = segments.dim(1);
  const Tensor ids = cast(segments, dtype);  // exact: ids are far below 2^24
  const Tensor same = eq(reshape(ids, {B, 1, T, 1}), reshape(ids, {B, 1, 1, T}));
  return where(same, Tensor::scalar(0.0, dtype), Tensor::scalar(-std::numeric_limits<double>::infinity(), dtype));
}

// A sliding window as an additive mask [Tq, Tk]: -inf before each query's
// window (causality hides the keys after it).
Tensor window_mask(int64_t tq, int64_t tk, int64_t window, DType dtype) {
  std::vector<double> m(size_t(tq * tk), 0.0);
  for (int64_t i = 0; i < tq; ++i) {
    std::fill_n(m.begin() + i * tk, window_start(i, tq, tk, window), -std::numeric_limits<double>::infinity());
  }
  return cast(Tensor::from_vector<double>({tq, tk}, m), dtype);
}

Tensor attention_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  const int64_t H = in[0].dim(2), window = window_of(attrs);
  Tensor mask = segmented(attrs) ? segment_mask(in[3], in[0].dtype()) : Tensor();
  if (window > 0) {
    const Tensor w = window_mask(in[0].dim(1), in[1].dim(1), window, in[0].dtype());
    mask = mask.defined() ? mask + w : w;
  }
  const Tensor q = heads_first(in[0]), k = heads_first(per_query_head(in[1], H)),
               v = heads_first(per_query_head(in[2], H));
  const double cap = softcap_of(attrs);
  if (cap <= 0) return heads_first(scaled_dot_product_attention(q, k, v, mask, causal_of(attrs), scale_of(attrs)));
  const Tensor capped = scale(tanh(scale(matmul(q, transpose(k)), scale_of(attrs) / cap)), cap);
  return heads_first(matmul(softmax(capped, 1.0, mask, causal_of(attrs)), v));
}

// The vector-Jacobian product of attention's composite, with q, k, v and dout
// held as leaves: in a graph, dout itself depends on q, k and v (through the
// layers above), and a plain grad() would differentiate it too.
Tensor attention_back_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  const std::vector<Tensor> inputs{in[0], in[1], in[2], in[4]};
  const std::vector<bool> needed{true, true, true, false};
  std::vector<Tensor> g = composite_backward({inputs, in[3], in[3], attrs, needed}, op_attention);
  g.resize(3);
  for (Tensor& t : g) t = reshape(contiguous(t), {-1});
  return concat(g, 0);
}

Grads attention_backward(const BackwardArgs& g) {
  const Tensor &q = g.inputs[0], &k = g.inputs[1], &v = g.inputs[2];
  Tensor flat = attention_back(q, k, v, g.dout, causal_of(g.attrs), scale_of(g.attrs),
                               segmented(g.attrs) ? g.inputs[3] : Tensor(), window_of(g.attrs), softcap_of(g.attrs));
  const int64_t nq = q.numel(), nk = k.numel(), nv = v.numel();
  return {reshape(slice(flat, 0, 0, nq), q.shape()), reshape(slice(flat, 0, nq, nq + nk), k.shape()),
          reshape(slice(flat, 0, nq + nk, nq + nk + nv), v.shape()), Tensor()};
}

// Segment ids [2, 5]: documents of 2 and 3 tokens; of 1, 3 and padding.
Tensor row_segments() { return Tensor::from_vector<int32_t>({2, 5}, {0, 0, 1, 1, 1, 0, 1, 1, 1, -1}); }
// Segment ids [1, 67] over two query blocks (of 34 and 33 queries):
// documents of 40 and 27 tokens, the second starting in the second block.
Tensor long_segments() {
  std::vector<int32_t> ids(67);
  for (int64_t t = 0; t < 67; ++t) ids[size_t(t)] = t < 40 ? 0 : 1;
  return Tensor::from_vector<int32_t>({1, 67}, ids);
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
      // Grouped-query: 6 query heads on 2 key/value heads, 3 to each.
      {"grouped_causal", {normal({2, 4, 6, 3}), normal({2, 4, 2, 3}), normal({2, 4, 2, 2})},
       [](const V& x) { return attention(x[0], x[1], x[2], true); }},
      {"grouped_fewer_keys", {normal({1, 3, 4, 2}), normal({1, 2, 1, 2}), normal({1, 2, 1, 3})},
       [](const V& x) { return attention(x[0], x[1], x[2], false, 0.8); }},
      // Packed documents: each row's segments, the last one padding (-1).
      {"segments_causal_grouped", {normal({2, 5, 4, 3}), normal({2, 5, 2, 3}), normal({2, 5, 2, 2})},
       [](const V& x) { return attention(x[0], x[1], x[2], true, std::nullopt, row_segments()); }},
      {"segments", {normal({2, 5, 2, 2}), normal({2, 5, 2, 2}), normal({2, 5, 2, 3})},
       [](const V& x) { return attention(x[0], x[1], x[2], false, 0.9, row_segments()); }},
      // Sliding windows: each query sees its last 3 keys (Mistral, Gemma).
      {"window_grouped", {normal({2, 7, 4, 3}), normal({2, 7, 2, 3}), normal({2, 7, 2, 2})},
       [](const V& x) { return attention(x[0], x[1], x[2], true, std::nullopt, Tensor(), 3); }},
      // Fewer queries than keys (decoding past a prompt): keys before every
      // query's window get no gradient.
      {"window_more_keys", {normal({1, 2, 2, 3}), normal({1, 6, 2, 3}), normal({1, 6, 2, 2})},
       [](const V& x) { return attention(x[0], x[1], x[2], true, 0.8, Tensor(), 2); }},
      // Two query blocks, the second's keys starting past key 0.
      {"window_two_blocks", {normal({1, 67, 1, 2}), normal({1, 67, 1, 2}), normal({1, 67, 1, 3})},
       [](const V& x) { return attention(x[0], x[1], x[2], true, std::nullopt, Tensor(), 5); }},
      {"window_segments", {normal({2, 5, 2, 2}), normal({2, 5, 2, 2}), normal({2, 5, 2, 3})},
       [](const V& x) { return attention(x[0], x[1], x[2], true, std::nullopt, row_segments(), 2); }},
      // Scores soft-capped (Gemma 2), the cap small enough to bend them.
      {"softcap", {normal({2, 3, 2, 4}), normal({2, 4, 2, 4}), normal({2, 4, 2, 3})},
       [](const V& x) { return attention(x[0], x[1], x[2], false, 1.5, Tensor(), 0, 0.8); }},
      {"softcap_window_grouped", {normal({2, 7, 4, 3}), normal({2, 7, 2, 3}), normal({2, 7, 2, 2})},
       [](const V& x) { return attention(x[0], x[1], x[2], true, 1.2, Tensor(), 3, 0.7); }},
      {"softcap_two_blocks_segments", {normal({1, 67, 1, 2}), normal({1, 67, 1, 2}), normal({1, 67, 1, 2})},
       [](const V& x) { return attention(x[0], x[1], x[2], true, 1.5, long_segments(), 0, 0.9); }},
  };
}

std::vector<GradCase> attention_back_cases() {
  using V = std::vector<Tensor>;
  return {
      {"plain", {normal({2, 3, 2, 2}), normal({2, 3, 2, 2}), normal({2, 3, 2, 3}), normal({2, 3, 2, 3})},
       [](const V& x) { return attention_back(x[0], x[1], x[2], x[3], false, 0.6); }},
      {"causal_more_keys", {normal({1, 2, 2, 3}), normal({1, 4, 2, 3}), normal({1, 4, 2, 2}), normal({1, 2, 2, 2})},
       [](const V& x) { return attention_back(x[0], x[1], x[2], x[3], true, 0.5); }},
      // dout computed from q, as in a model, where the layers above make it
      // from the attention's output: still a constant to the backward.
      {"dout_from_q", {normal({1, 3, 2, 2}), normal({1, 3, 2, 2}), normal({1, 3, 2, 2}), normal({1, 3, 2, 2})},
       [](const V& x) { return attention_back(x[0], x[1], x[2], x[3] * tanh(x[0]), true, 0.7); }},
      // Grouped-query, causal with more keys: a group's dk and dv summed
      // over its heads, and keys no query sees.
      {"grouped", {normal({1, 2, 4, 2}), normal({1, 3, 2, 2}), normal({1, 3, 2, 3}), normal({1, 2, 4, 3})},
       [](const V& x) { return attention_back(x[0], x[1], x[2], x[3], true, 0.6); }},
      {"segments_grouped", {normal({2, 5, 4, 2}), normal({2, 5, 2, 2}), normal({2, 5, 2, 3}), normal({2, 5, 4, 3})},
       [](const V& x) { return attention_back(x[0], x[1], x[2], x[3], true, 0.6, row_segments()); }},
      {"window_more_keys",
       {normal({1, 3, 4, 2}), normal({1, 6, 2, 2}), normal({1, 6, 2, 3}), normal({1, 3, 4, 3})},
       [](const V& x) { return attention_back(x[0], x[1], x[2], x[3], true, 0.6, Tensor(), 2); }},
      {"softcap_grouped",
       {normal({1, 3, 4, 2}), normal({1, 5, 2, 2}), normal({1, 5, 2, 3}), normal({1, 3, 4, 3})},
       [](const V& x) { return attention_back(x[0], x[1], x[2], x[3], true, 1.4, Tensor(), 0, 0.8); }},
  };
}

Tensor attention_probs_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  return softmax(matmul(heads_first(in[0]), transpose(heads_first(in[1]))), scale_of(attrs), Tensor(),
                 causal_of(attrs));
}

// dS = softmax_back(P, dP); dq = dS K and dk = dS^T Q, token-major, packed flat.
Tensor attention_probs_back_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  Tensor ds = softmax_back(in[2], in[3], scale_of(attrs));
  Tensor dq = heads_first(matmul(ds, heads_first(in[1])));
  Tensor dk = heads_first(matmul(transpose(ds), heads_first(in[0])));
  return concat({reshape(contiguous(dq), {-1}), reshape(contiguous(dk), {-1})}, 0);
}

// dP = dO v^T on heads-first views, then attention_probs_back's composite.
Tensor attention_probs_values_back_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  Tensor dp = matmul(heads_first(in[4]), transpose(heads_first(in[3])));
  return attention_probs_back_composite({in[0], in[1], in[2], dp}, attrs);
}

Grads attention_probs_backward(const BackwardArgs& g) {
  const Tensor &q = g.inputs[0], &k = g.inputs[1];
  const double scale = scale_of(g.attrs);
  // The CPU backend's rewrite makes this attention_probs_values_back when dP
  // is the values' product dO v^T.
  Tensor flat = attention_probs_back(q, k, g.out, g.dout, scale);
  const int64_t nq = q.numel(), nk = k.numel();
  return {reshape(slice(flat, 0, 0, nq), q.shape()), reshape(slice(flat, 0, nq, nq + nk), k.shape())};
}

std::vector<GradCase> attention_probs_cases() {
  using V = std::vector<Tensor>;
  return {
      {"plain", {normal({2, 3, 2, 4}), normal({2, 3, 2, 4})},
       [](const V& x) { return attention_probs(x[0], x[1]); }},
      {"causal_more_keys", {normal({1, 2, 2, 3}), normal({1, 5, 2, 3})},
       [](const V& x) { return attention_probs(x[0], x[1], true); }},
      {"fewer_keys_scaled", {normal({2, 4, 1, 2}), normal({2, 3, 1, 2})},
       [](const V& x) { return attention_probs(x[0], x[1], false, 0.7); }},
      // Two query blocks, causal: the second sees keys the first does not.
      {"causal_two_blocks", {normal({1, 67, 1, 2}), normal({1, 67, 1, 2})},
       [](const V& x) { return attention_probs(x[0], x[1], true); }},
  };
}

std::vector<GradCase> attention_probs_back_cases() {
  using V = std::vector<Tensor>;
  return {
      {"plain", {normal({2, 3, 2, 2}), normal({2, 3, 2, 2}), normal({2, 2, 3, 3}), normal({2, 2, 3, 3})},
       [](const V& x) { return attention_probs_back(x[0], x[1], x[2], x[3], 0.6); }},
      {"more_keys", {normal({1, 2, 2, 3}), normal({1, 4, 2, 3}), normal({1, 2, 2, 4}), normal({1, 2, 2, 4})},
       [](const V& x) { return attention_probs_back(x[0], x[1], x[2], x[3], 0.5); }},
  };
}

std::vector<GradCase> attention_probs_values_back_cases() {
  using V = std::vector<Tensor>;
  return {
      {"plain",
       {normal({2, 3, 2, 2}), normal({2, 3, 2, 2}), normal({2, 2, 3, 3}), normal({2, 3, 2, 4}), normal({2, 3, 2, 4})},
       [](const V& x) { return attention_probs_values_back(x[0], x[1], x[2], x[3], x[4], 0.6); }},
      {"more_keys",
       {normal({1, 2, 2, 3}), normal({1, 4, 2, 3}), normal({1, 2, 2, 4}), normal({1, 4, 2, 2}), normal({1, 2, 2, 2})},
       [](const V& x) { return attention_probs_values_back(x[0], x[1], x[2], x[3], x[4], 0.5); }},
  };
}

}  // namespace

extern const OpDef op_attention{
    .name = "attention",
    .summary = "softmax(scale q k^T, causal) v over [B, T, H, D] heads (k, v: H or fewer, grouped), optionally "
               "within i32 segments [B, T] or a sliding window, scores optionally soft-capped; fused, scores "
               "recomputed in the backward",
    .inputs = {{"q", Diff::yes}, {"k", Diff::yes}, {"v", Diff::yes}, {"segments", Diff::no}},
    .fused = true,
    .infer = attention_infer,
    .backward = attention_backward,
    .composite = attention_composite,
    .cases = attention_cases,
};
NABLA_CPU_KERNEL(op_attention, attention_forward);

extern const OpDef op_attention_back{
    .name = "attention_back",
    .summary = "attention's dq, dk, dv, packed flat; fused (its own gradient through the composite)",
    .inputs = {{"q", Diff::yes}, {"k", Diff::yes}, {"v", Diff::yes}, {"dout", Diff::yes}, {"segments", Diff::no}},
    .fused = true,
    .infer = attention_back_infer,
    .composite = attention_back_composite,
    .cases = attention_back_cases,
};
NABLA_CPU_KERNEL(op_attention_back, attention_back_forward);

extern const OpDef op_attention_probs{
    .name = "attention_probs",
    .summary = "softmax(scale q k^T, causal) over [B, T, H, D] heads, as [B, H, Tq, Tk]; fused, kept for the backward",
    .inputs = {{"q", Diff::yes}, {"k", Diff::yes}},
    .fused = true,
    .infer = attention_probs_infer,
    .backward = attention_probs_backward,
    .composite = attention_probs_composite,
    .cases = attention_probs_cases,
};
NABLA_CPU_KERNEL(op_attention_probs, attention_probs_forward);

extern const OpDef op_attention_probs_back{
    .name = "attention_probs_back",
    .summary = "attention_probs' dq, dk from p and dp, packed flat; fused (its own gradient through the composite)",
    .inputs = {{"q", Diff::yes}, {"k", Diff::yes}, {"p", Diff::yes}, {"dp", Diff::yes}},
    .fused = true,
    .infer = attention_probs_back_infer,
    .composite = attention_probs_back_composite,
    .cases = attention_probs_back_cases,
};
NABLA_CPU_KERNEL(op_attention_probs_back, attention_probs_back_forward);

extern const OpDef op_attention_probs_values_back{
    .name = "attention_probs_values_back",
    .summary = "attention_probs' dq, dk from p, v and the gradient of p v, packed flat; fused (gradient through the "
               "composite)",
    .inputs = {{"q", Diff::yes}, {"k", Diff::yes}, {"p", Diff::yes}, {"v", Diff::yes}, {"dout", Diff::yes}},
    .fused = true,
    .infer = attention_probs_values_back_infer,
    .composite = attention_probs_values_back_composite,
    .cases = attention_probs_values_back_cases,
};
NABLA_CPU_KERNEL(op_attention_probs_values_back, attention_probs_values_back_forward);

}  // namespace ops

namespace {
Attrs attention_attrs(const char* op, const Tensor& q, bool causal, std::optional<double> scale,
                      bool segments = false, int64_t window = 0, double softcap = 0) {
  if (!q.defined()) throw UsageError(std::string(op) + ": q is an undefined tensor");
  if (q.rank() != 4) throw ShapeError(std::string(op) + ": q must be [B, T, H, D], got " + to_string(q.shape()));
  if (window < 0 || (window > 0 && !causal)) {
    throw UsageError(std::string(op) + ": window must be 0 (none) or, with causal attention, positive; got " +
                     std::to_string(window) + (causal ? "" : " without causal"));
  }
  if (!(softcap >= 0) || !std::isfinite(softcap)) {
    throw UsageError(std::string(op) + ": softcap must be 0 (none) or positive and finite, got " +
                     std::to_string(softcap));
  }
  return Attrs{{causal ? 1 : 0, segments ? 1 : 0, window},
               {scale ? *scale : 1.0 / std::sqrt(double(q.dim(3))), softcap}};
}

// The segments input, or an i32 placeholder (as softmax's missing mask).
Tensor segments_or_placeholder(const Tensor& segments) {
  return segments.defined() ? segments : Tensor::scalar(0.0, DType::i32);
}
}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, std::optional<double> scale,
                 const Tensor& segments, int64_t window, double softcap) {
  return apply(ops::op_attention, {q, k, v, segments_or_placeholder(segments)},
               attention_attrs("attention", q, causal, scale, segments.defined(), window, softcap));
}

Tensor attention_back(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, bool causal,
                      double scale, const Tensor& segments, int64_t window, double softcap) {
  return apply(ops::op_attention_back, {q, k, v, dout, segments_or_placeholder(segments)},
               attention_attrs("attention_back", q, causal, scale, segments.defined(), window, softcap));
}

Tensor attention_probs(const Tensor& q, const Tensor& k, bool causal, std::optional<double> scale) {
  return apply(ops::op_attention_probs, {q, k}, attention_attrs("attention_probs", q, causal, scale));
}

Tensor attention_probs_back(const Tensor& q, const Tensor& k, const Tensor& p, const Tensor& dp, double scale) {
  return apply(ops::op_attention_probs_back, {q, k, p, dp}, attention_attrs("attention_probs_back", q, false, scale));
}

Tensor attention_probs_values_back(const Tensor& q, const Tensor& k, const Tensor& p, const Tensor& v,
                                   const Tensor& dout, double scale) {
  return apply(ops::op_attention_probs_values_back, {q, k, p, v, dout},
               attention_attrs("attention_probs_values_back", q, false, scale));
}

}  // namespace nabla
