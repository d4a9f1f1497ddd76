// Attention on the GPU (definitions in src/ops/attention.cpp): q [B, Tq, H,
// D], k [B, Tk, Hk, D], v [B, Tk, Hk, Dv], token-major, any strides; query
// head h reads key/value head h / (H / Hk).
//
// attention: flash attention's online softmax, a warp per query row: the
// lanes take 32 keys at a time (each lane one key's score, its dot product
// over D), the warp's max and sum update the row's running max m and sum l,
// and each lane accumulates its own output dimensions (lane, lane + 32, ...,
// up to 256 per pass) from the 32 probabilities broadcast one by one. The
// scores never reach memory.
// attention_back: recomputes the scores. A warp per query row finds the
// row's log-sum-exp and D = sum_j P dP (dP = dO . v_j), then dq; a warp per
// key row sums dk and dv over the queries (and over its group's query
// heads, in head order): no atomics, the same sums every run.
// attention_probs and its backwards: P itself [B, H, Tq, Tk], a warp per
// row; dq and dk one thread per element.
#include "backend/cuda/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_attention, op_attention_back, op_attention_probs, op_attention_probs_back,
    op_attention_probs_values_back;
}  // namespace ops

namespace NABLA_GPU {
namespace {

constexpr int kPerLane = 8;               // output dimensions a lane holds
constexpr int64_t kChunk = 32 * kPerLane;  // dimensions per pass
constexpr int kWarps = 4;                  // warps (rows at a time) per block
constexpr int64_t kRowsPerBlock = 16;

struct Attn {
  View q, k, v, seg;
  bool segmented, causal;
  double scale;
  int64_t B, Tq, Tk, H, Hk, D, Dv;
};

Attn attn_of(const Operands& a, size_t segments_at, bool values = true) {
  Attn t{};
  t.q = make_view(a.in[0]);
  t.k = make_view(a.in[1]);
  if (values) t.v = make_view(a.in[2]);
  const std::vector<int64_t>& ints = a.attrs->ints;
  t.causal = !ints.empty() && ints[0] != 0;
  t.segmented = ints.size() > 1 && ints[1] != 0;
  if (t.segmented) t.seg = make_view(a.in[segments_at]);
  t.scale = a.attrs->reals[0];
  t.B = a.in[0].shape[0];
  t.Tq = a.in[0].shape[1];
  t.H = a.in[0].shape[2];
  t.D = a.in[0].shape[3];
  t.Tk = a.in[1].shape[1];
  t.Hk = a.in[1].shape[2];
  t.Dv = values ? a.in[2].shape[3] : 0;
  return t;
}

template <class T>
__device__ __forceinline__ const T* at4(const View& x, int64_t b, int64_t t, int64_t h) {
  return static_cast<const T*>(x.data) + b * x.strides[0] + t * x.strides[1] + h * x.strides[2];
}

// Keys [0, end) may be visible to query i.
__device__ __forceinline__ int64_t key_end(const Attn& a, int64_t i) {
  if (!a.causal) return a.Tk;
  const int64_t e = i + a.Tk - a.Tq + 1;
  return e < a.Tk ? e : a.Tk;
}
__device__ __forceinline__ bool visible(const Attn& a, int64_t b, int64_t i, int64_t j) {
  if (j >= key_end(a, i)) return false;
  if (!a.segmented) return true;
  const int32_t* s = static_cast<const int32_t*>(a.seg.data) + b * a.seg.strides[0];
  return s[i * a.seg.strides[1]] == s[j * a.seg.strides[1]];
}
// scale q_i . k_j, k read at query head h's key head.
template <class T>
__device__ __forceinline__ T score(const Attn& a, int64_t b, int64_t i, int64_t h, int64_t j) {
  const T* q = at4<T>(a.q, b, i, h);
  const T* k = at4<T>(a.k, b, j, h / (a.H / a.Hk));
  T s = T(0);
  for (int64_t d = 0; d < a.D; ++d) s += q[d * a.q.strides[3]] * k[d * a.k.strides[3]];
  return s * T(a.scale);
}
template <class T>
__device__ __forceinline__ T max_of(T a, T b) {
  return b > a || gpu_math::isnan(double(b)) ? b : a;
}

// grid: (row blocks, H, B * Dv chunks).
template <class T>
__global__ void attention_kernel(Attn a, T* out) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t chunks = (a.Dv + kChunk - 1) / kChunk;
  const int64_t h = blockIdx.y, b = blockIdx.z / chunks, d0 = (blockIdx.z % chunks) * kChunk;
  const int64_t hk = h / (a.H / a.Hk);
  const T lowest = -T(INFINITY);
  const int64_t first = int64_t(blockIdx.x) * kRowsPerBlock;
  const int64_t last = first + kRowsPerBlock < a.Tq ? first + kRowsPerBlock : a.Tq;
  for (int64_t i = first + warp; i < last; i += kWarps) {
    T m = lowest, l = T(0), o[kPerLane];
    for (int e = 0; e < kPerLane; ++e) o[e] = T(0);
    const int64_t end = key_end(a, i);
    for (int64_t j0 = 0; j0 < end; j0 += 32) {
      const int64_t j = j0 + lane;
      const T s = j < end && visible(a, b, i, j) ? score<T>(a, b, i, h, j) : lowest;
      const T m_new = max_of(m, warp_max(s));
      if (m_new == lowest) continue;  // nothing visible yet: the same on every lane
      const T alpha = gpu_math::exp(m - m_new);
      const T p = s == lowest ? T(0) : gpu_math::exp(s - m_new);
      l = l * alpha + warp_sum(p);
      for (int e = 0; e < kPerLane; ++e) o[e] *= alpha;
      for (int src = 0; src < 32; ++src) {
        const T ps = shuffle_from(p, src);
        if (ps == T(0)) continue;
        const T* vr = at4<T>(a.v, b, j0 + src, hk);
        for (int e = 0; e < kPerLane; ++e) {
          const int64_t d = d0 + lane + 32 * e;
          if (d < a.Dv) o[e] += ps * vr[d * a.v.strides[3]];
        }
      }
      m = m_new;
    }
    T* orow = out + ((b * a.Tq + i) * a.H + h) * a.Dv;
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t d = d0 + lane + 32 * e;
      if (d < a.Dv) orow[d] = o[e] / l;
    }
  }
}

Launch rows_grid(int64_t rows, int64_t heads, int64_t z) {
  return {dim3(unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(heads), unsigned(z)),
          dim3(32 * kWarps), 0, true};
}

void attention(const Operands& a, const Context& ctx) {
  const Attn t = attn_of(a, 3);
  if (a.out.numel() == 0) return;
  const int64_t chunks = (t.Dv + kChunk - 1) / kChunk;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, rows_grid(t.Tq, t.H, t.B * chunks), attention_kernel<T>, t, a.out.ptr<T>());
  });
}

// ---- attention_back: flat [dq, dk, dv]; inputs q, k, v, dout, segments.

// dO_i . v_j.
template <class T>
__device__ __forceinline__ T dout_dot_v(const Attn& a, const View& dout, int64_t b, int64_t i, int64_t h, int64_t j) {
  const T* g = at4<T>(dout, b, i, h);
  const T* v = at4<T>(a.v, b, j, h / (a.H / a.Hk));
  T s = T(0);
  for (int64_t d = 0; d < a.Dv; ++d) s += g[d * dout.strides[3]] * v[d * a.v.strides[3]];
  return s;
}

// A warp per query row: its log-sum-exp and D (into stats [B, H, Tq, 2]),
// then dq.
template <class T>
__global__ void attention_rows_back_kernel(Attn a, View dout, T* stats, T* dq) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t hk = h / (a.H / a.Hk);
  const T lowest = -T(INFINITY);
  const int64_t first = int64_t(blockIdx.x) * kRowsPerBlock;
  const int64_t last = first + kRowsPerBlock < a.Tq ? first + kRowsPerBlock : a.Tq;
  for (int64_t i = first + warp; i < last; i += kWarps) {
    const int64_t end = key_end(a, i);
    // The row's max and sum, online.
    T m = lowest, l = T(0);
    for (int64_t j0 = 0; j0 < end; j0 += 32) {
      const int64_t j = j0 + lane;
      const T s = j < end && visible(a, b, i, j) ? score<T>(a, b, i, h, j) : lowest;
      const T m_new = max_of(m, warp_max(s));
      if (m_new == lowest) continue;
      l = l * gpu_math::exp(m - m_new) + warp_sum(s == lowest ? T(0) : gpu_math::exp(s - m_new));
      m = m_new;
    }
    const T lse = m + gpu_math::log(l);
    // D = sum_j P dP.
    T dd = T(0);
    for (int64_t j0 = 0; j0 < end; j0 += 32) {
      const int64_t j = j0 + lane;
      if (j < end && visible(a, b, i, j)) {
        dd += gpu_math::exp(score<T>(a, b, i, h, j) - lse) * dout_dot_v<T>(a, dout, b, i, h, j);
      }
    }
    dd = warp_sum(dd);
    T* st = stats + ((b * a.H + h) * a.Tq + i) * 2;
    if (lane == 0) {
      st[0] = lse;
      st[1] = dd;
    }
    // dq_i = scale sum_j dS_ij k_j, dS = P (dP - D).
    T* dqr = dq + ((b * a.Tq + i) * a.H + h) * a.D;
    for (int64_t d0 = 0; d0 < a.D; d0 += kChunk) {
      T acc[kPerLane];
      for (int e = 0; e < kPerLane; ++e) acc[e] = T(0);
      for (int64_t j0 = 0; j0 < end; j0 += 32) {
        const int64_t j = j0 + lane;
        T ds = T(0);
        if (j < end && visible(a, b, i, j)) {
          const T p = gpu_math::exp(score<T>(a, b, i, h, j) - lse);
          ds = p * (dout_dot_v<T>(a, dout, b, i, h, j) - dd);
        }
        for (int src = 0; src < 32; ++src) {
          const T dss = shuffle_from(ds, src);
          if (dss == T(0)) continue;
          const T* kr = at4<T>(a.k, b, j0 + src, hk);
          for (int e = 0; e < kPerLane; ++e) {
            const int64_t d = d0 + lane + 32 * e;
            if (d < a.D) acc[e] += dss * kr[d * a.k.strides[3]];
          }
        }
      }
      for (int e = 0; e < kPerLane; ++e) {
        const int64_t d = d0 + lane + 32 * e;
        if (d < a.D) dqr[d] = acc[e] * T(a.scale);
      }
    }
  }
}

// A warp per key row j of key head hk: dk_j = scale sum dS q_i and dv_j =
// sum P dO_i over the group's query heads (in order) and their queries.
// grid: (row blocks over Tk, Hk, B * chunks of max(D, Dv)).
template <class T>
__global__ void attention_keys_back_kernel(Attn a, View dout, const T* stats, T* dk, T* dv) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t width = a.D > a.Dv ? a.D : a.Dv, chunks = (width + kChunk - 1) / kChunk;
  const int64_t hk = blockIdx.y, b = blockIdx.z / chunks, d0 = (blockIdx.z % chunks) * kChunk;
  const int64_t group = a.H / a.Hk;
  const int64_t first = int64_t(blockIdx.x) * kRowsPerBlock;
  const int64_t last = first + kRowsPerBlock < a.Tk ? first + kRowsPerBlock : a.Tk;
  for (int64_t j = first + warp; j < last; j += kWarps) {
    T gk[kPerLane], gv[kPerLane];
    for (int e = 0; e < kPerLane; ++e) gk[e] = gv[e] = T(0);
    // Causal: the queries that see key j start at j - (Tk - Tq).
    int64_t i_begin = a.causal ? j - (a.Tk - a.Tq) : 0;
    if (i_begin < 0) i_begin = 0;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (int64_t i0 = i_begin; i0 < a.Tq; i0 += 32) {
        const int64_t i = i0 + lane;
        T p = T(0), ds = T(0);
        if (i < a.Tq && visible(a, b, i, j)) {
          const T* st = stats + ((b * a.H + h) * a.Tq + i) * 2;
          p = gpu_math::exp(score<T>(a, b, i, h, j) - st[0]);
          ds = p * (dout_dot_v<T>(a, dout, b, i, h, j) - st[1]);
        }
        for (int src = 0; src < 32; ++src) {
          const T ps = shuffle_from(p, src), dss = shuffle_from(ds, src);
          if (ps == T(0) && dss == T(0)) continue;
          const T* qr = at4<T>(a.q, b, i0 + src, h);
          const T* gr = at4<T>(dout, b, i0 + src, h);
          for (int e = 0; e < kPerLane; ++e) {
            const int64_t d = d0 + lane + 32 * e;
            if (d < a.D) gk[e] += dss * qr[d * a.q.strides[3]];
            if (d < a.Dv) gv[e] += ps * gr[d * dout.strides[3]];
          }
        }
      }
    }
    T* dkr = dk + ((b * a.Tk + j) * a.Hk + hk) * a.D;
    T* dvr = dv + ((b * a.Tk + j) * a.Hk + hk) * a.Dv;
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t d = d0 + lane + 32 * e;
      if (d < a.D) dkr[d] = gk[e] * T(a.scale);
      if (d < a.Dv) dvr[d] = gv[e];
    }
  }
}

void attention_back(const Operands& a, const Context& ctx) {
  const Attn t = attn_of(a, 4);
  const int64_t nq = a.in[0].numel(), nk = a.in[1].numel();
  if (a.out.numel() == 0) return;
  const View dout = make_view(a.in[3]);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    T* out = a.out.ptr<T>();
    if (t.Tq > 0) {
      T* stats = static_cast<T*>(scratch(ctx, size_t(t.B * t.H * t.Tq * 2) * sizeof(T)));
      launch(ctx, rows_grid(t.Tq, t.H, t.B), attention_rows_back_kernel<T>, t, dout, stats, out);
      const int64_t width = t.D > t.Dv ? t.D : t.Dv, chunks = (width + kChunk - 1) / kChunk;
      if (t.Tk > 0 && chunks > 0) {
        launch(ctx, rows_grid(t.Tk, t.Hk, t.B * chunks), attention_keys_back_kernel<T>, t, dout,
               static_cast<const T*>(stats), out + nq, out + nq + nk);
      }
    } else {
      fill(ctx, a.out, 0.0);
    }
  });
}

// ---- attention_probs: P [B, H, Tq, Tk] = softmax(scale q k^T, causal).
template <class T>
__global__ void probs_kernel(Attn a, T* out) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const T lowest = -T(INFINITY);
  const int64_t first = int64_t(blockIdx.x) * kRowsPerBlock;
  const int64_t last = first + kRowsPerBlock < a.Tq ? first + kRowsPerBlock : a.Tq;
  for (int64_t i = first + warp; i < last; i += kWarps) {
    T* row = out + ((b * a.H + h) * a.Tq + i) * a.Tk;
    T m = lowest;
    for (int64_t j = lane; j < a.Tk; j += 32) {
      const T s = visible(a, b, i, j) ? score<T>(a, b, i, h, j) : lowest;
      row[j] = s;
      m = max_of(m, s);
    }
    m = warp_max(m);
    T l = T(0);
    for (int64_t j = lane; j < a.Tk; j += 32) l += gpu_math::exp(row[j] - m);
    l = warp_sum(l);
    for (int64_t j = lane; j < a.Tk; j += 32) row[j] = gpu_math::exp(row[j] - m) / l;
  }
}

void attention_probs(const Operands& a, const Context& ctx) {
  const Attn t = attn_of(a, 0, false);
  if (a.out.numel() == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, rows_grid(t.Tq, t.H, t.B), probs_kernel<T>, t, a.out.ptr<T>());
  });
}

// r_i = sum_j P_ij dP_ij into r [B, H, Tq].
template <class T>
__device__ __forceinline__ T at_probs(const View& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  return static_cast<const T*>(p.data)[b * p.strides[0] + h * p.strides[1] + i * p.strides[2] + j * p.strides[3]];
}

template <class T>
__global__ void probs_rowsum_kernel(int64_t rows, View p, View dp, T* r) {
  const int64_t row = block_row() * kWarps + int64_t(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  const int64_t H = p.shape[1], Tq = p.shape[2], Tk = p.shape[3];
  const int64_t i = row % Tq, h = row / Tq % H, b = row / (Tq * H);
  T s = T(0);
  if (row < rows) {
    for (int64_t j = lane; j < Tk; j += 32) s += at_probs<T>(p, b, h, i, j) * at_probs<T>(dp, b, h, i, j);
  }
  s = warp_sum(s);
  if (row < rows && lane == 0) r[row] = s;
}

// dq [B, Tq, H, D]: dq_i = sum_j dS_ij k_j; dk [B, Tk, H, D]: dk_j = sum_i
// dS_ij q_i; dS = scale P (dP - r).
template <class T>
__global__ void probs_dq_kernel(int64_t n, Attn a, View p, View dp, const T* r, T* dq) {
  NABLA_GRID_STRIDE(x, n) {
    const int64_t d = x % a.D, h = x / a.D % a.H, i = x / (a.D * a.H) % a.Tq, b = x / (a.D * a.H * a.Tq);
    const T ri = r[(b * a.H + h) * a.Tq + i];
    T acc = T(0);
    for (int64_t j = 0; j < a.Tk; ++j) {
      const T ds = at_probs<T>(p, b, h, i, j) * (at_probs<T>(dp, b, h, i, j) - ri);
      acc += ds * at4<T>(a.k, b, j, h)[d * a.k.strides[3]];
    }
    dq[x] = acc * T(a.scale);
  }
}
template <class T>
__global__ void probs_dk_kernel(int64_t n, Attn a, View p, View dp, const T* r, T* dk) {
  NABLA_GRID_STRIDE(x, n) {
    const int64_t d = x % a.D, h = x / a.D % a.H, j = x / (a.D * a.H) % a.Tk, b = x / (a.D * a.H * a.Tk);
    T acc = T(0);
    for (int64_t i = 0; i < a.Tq; ++i) {
      const T ds = at_probs<T>(p, b, h, i, j) * (at_probs<T>(dp, b, h, i, j) - r[(b * a.H + h) * a.Tq + i]);
      acc += ds * at4<T>(a.q, b, i, h)[d * a.q.strides[3]];
    }
    dk[x] = acc * T(a.scale);
  }
}

// q, k, p, dp -> flat [dq, dk].
void probs_back_from(const Operands& a, const Context& ctx, const View& p, const View& dp) {
  const Attn t = attn_of(a, 0, false);
  const int64_t nq = a.in[0].numel(), nk = a.in[1].numel(), rows = t.B * t.H * t.Tq;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    T* out = a.out.ptr<T>();
    T* r = static_cast<T*>(scratch(ctx, size_t(rows > 0 ? rows : 1) * sizeof(T)));
    if (rows > 0) {
      launch(ctx, rows_launch((rows + kWarps - 1) / kWarps, 32 * kWarps), probs_rowsum_kernel<T>, rows, p, dp, r);
    }
    if (nq > 0) launch(ctx, elementwise_launch(nq), probs_dq_kernel<T>, nq, t, p, dp, static_cast<const T*>(r), out);
    if (nk > 0) {
      launch(ctx, elementwise_launch(nk), probs_dk_kernel<T>, nk, t, p, dp, static_cast<const T*>(r), out + nq);
    }
  });
}

void attention_probs_back(const Operands& a, const Context& ctx) {
  probs_back_from(a, ctx, make_view(a.in[2]), make_view(a.in[3]));
}

// dP [B, H, Tq, Tk] = dO v^T, then as attention_probs_back.
template <class T>
__global__ void values_dp_kernel(int64_t n, View dout, View v, int64_t H, int64_t Tq, int64_t Tk, T* dp) {
  const int64_t Dv = v.shape[3];
  NABLA_GRID_STRIDE(x, n) {
    const int64_t j = x % Tk, i = x / Tk % Tq, h = x / (Tk * Tq) % H, b = x / (Tk * Tq * H);
    const T* g = at4<T>(dout, b, i, h);
    const T* vr = at4<T>(v, b, j, h);
    T s = T(0);
    for (int64_t d = 0; d < Dv; ++d) s += g[d * dout.strides[3]] * vr[d * v.strides[3]];
    dp[x] = s;
  }
}

void attention_probs_values_back(const Operands& a, const Context& ctx) {
  const TensorView& p = a.in[2];
  const int64_t n = p.numel();
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    T* dp = static_cast<T*>(scratch(ctx, size_t(n > 0 ? n : 1) * sizeof(T)));
    if (n > 0) {
      launch(ctx, elementwise_launch(n), values_dp_kernel<T>, n, make_view(a.in[4]), make_view(a.in[3]), p.shape[1],
             p.shape[2], p.shape[3], dp);
    }
    const TensorView dpv{dp, p.dtype, p.shape, contiguous_strides(p.shape), true};
    probs_back_from(a, ctx, make_view(p), make_view(dpv));
  });
}

}  // namespace

void register_attention_kernels() {
  register_kernel(ops::op_attention, attention);
  register_kernel(ops::op_attention_back, attention_back);
  register_kernel(ops::op_attention_probs, attention_probs);
  register_kernel(ops::op_attention_probs_back, attention_probs_back);
  register_kernel(ops::op_attention_probs_values_back, attention_probs_values_back);
}

}  // namespace NABLA_GPU
}  // namespace nabla
