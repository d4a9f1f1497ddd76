// Attention on the GPU (definitions in src/ops/attention.cpp): q [B, Tq, H,
// D], k [B, Tk, Hk, D], v [B, Tk, Hk, Dv], token-major, any strides; query
// head h reads key/value head h / (H / Hk). Under the bf16 matmul option
// every product rounds its operands to bf16, as the CPU's do. Soft-capped
// scores (capped()) are capped where they are made, and the backward, which
// makes them again, multiplies dS by 1 - tanh^2 there.
//
// attention and attention_back run on tiles (below: flash attention 2's
// blocks of queries and keys in shared memory, their products on tensor
// cores under the bf16 option); heads too wide for the tiles take the
// warp-per-row kernels first here:
// attention: flash attention's online softmax, a warp per query row: the
// lanes take 32 keys at a time (each lane one key's score, its dot product
// over D), the warp's max and sum update the row's running max m and sum l,
// and each lane accumulates its own output dimensions (lane, lane + 32, ...,
// up to 256 per pass) from the 32 probabilities broadcast one by one.
// attention_back: recomputes the scores. A warp per query row finds the
// row's log-sum-exp and D = sum_j P dP (dP = dO . v_j), then dq; a warp per
// key row sums dk and dv over the queries (and over its group's query
// heads, in head order): no atomics, the same sums every run.
// attention_probs and its backwards: P itself [B, H, Tq, Tk], a warp per
// row; dq and dk one thread per element.
#include <type_traits>

#include "backend/cuda/kernel.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/tiles.h"

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
  int64_t window;  // > 0: a sliding window (causal), the last `window` keys
  bool bf16;  // products round their operands to bf16 (the bf16 matmul option)
  double scale;
  double softcap;  // > 0: scores capped to softcap tanh(s / softcap) before the softmax
  int64_t B, Tq, Tk, H, Hk, D, Dv;
};

Attn attn_of(const Operands& a, const Context& ctx, size_t segments_at, bool values = true) {
  Attn t{};
  t.bf16 = ctx.bf16_matmul;
  t.q = make_view(a.in[0]);
  t.k = make_view(a.in[1]);
  if (values) t.v = make_view(a.in[2]);
  const std::vector<int64_t>& ints = a.attrs->ints;
  t.causal = !ints.empty() && ints[0] != 0;
  t.segmented = ints.size() > 1 && ints[1] != 0;
  t.window = ints.size() > 2 ? ints[2] : 0;
  if (t.segmented) t.seg = make_view(a.in[segments_at]);
  t.scale = a.attrs->reals[0];
  t.softcap = a.attrs->reals.size() > 1 ? a.attrs->reals[1] : 0.0;
  t.B = a.in[0].shape[0];
  t.Tq = a.in[0].shape[1];
  t.H = a.in[0].shape[2];
  t.D = a.in[0].shape[3];
  t.Tk = a.in[1].shape[1];
  t.Hk = a.in[1].shape[2];
  t.Dv = values ? a.in[2].shape[3] : 0;
  return t;
}

// x as a product's operand: rounded to bf16 under the bf16 matmul option.
template <class T>
__device__ __forceinline__ T operand(const Attn& a, T x) {
  return a.bf16 ? round_bf16(x) : x;
}

template <class T>
__device__ __forceinline__ const T* at4(const View& x, int64_t b, int64_t t, int64_t h) {
  return static_cast<const T*>(x.data) + b * x.strides[0] + t * x.strides[1] + h * x.strides[2];
}

// Keys [key_begin, key_end) may be visible to query i.
__device__ __forceinline__ int64_t key_end(const Attn& a, int64_t i) {
  if (!a.causal) return a.Tk;
  const int64_t e = i + a.Tk - a.Tq + 1;
  return e < a.Tk ? e : a.Tk;
}
__device__ __forceinline__ int64_t key_begin(const Attn& a, int64_t i) {
  if (a.window <= 0) return 0;
  const int64_t s = i + a.Tk - a.Tq - a.window + 1;
  return s > 0 ? (s < a.Tk ? s : a.Tk) : 0;
}
// Queries [query_begin, query_end) may see key j.
__device__ __forceinline__ int64_t query_begin(const Attn& a, int64_t j) {
  const int64_t s = a.causal ? j - (a.Tk - a.Tq) : 0;
  return s > 0 ? s : 0;
}
__device__ __forceinline__ int64_t query_end(const Attn& a, int64_t j) {
  if (a.window <= 0) return a.Tq;
  const int64_t e = j - (a.Tk - a.Tq) + a.window;
  return e < a.Tq ? (e > 0 ? e : 0) : a.Tq;
}
__device__ __forceinline__ bool visible(const Attn& a, int64_t b, int64_t i, int64_t j) {
  if (j >= key_end(a, i) || j < key_begin(a, i)) return false;
  if (!a.segmented) return true;
  const int32_t* s = static_cast<const int32_t*>(a.seg.data) + b * a.seg.strides[0];
  return s[i * a.seg.strides[1]] == s[j * a.seg.strides[1]];
}
// The softmax's input from a product x = q_i . k_j: scale x, capped where
// softcap > 0; *slope (given) its derivative in scale x, 1 - tanh^2.
template <class T>
__device__ __forceinline__ T capped(const Attn& a, T x, T* slope = nullptr) {
  const T s = x * T(a.scale);
  if (a.softcap <= 0) {
    if (slope) *slope = T(1);
    return s;
  }
  const T t = gpu_math::tanh(s / T(a.softcap));
  if (slope) *slope = T(1) - t * t;
  return t * T(a.softcap);
}
// The softmax's input for q_i . k_j (capped), k read at query head h's key head.
template <class T>
__device__ __forceinline__ T score(const Attn& a, int64_t b, int64_t i, int64_t h, int64_t j, T* slope = nullptr) {
  const T* q = at4<T>(a.q, b, i, h);
  const T* k = at4<T>(a.k, b, j, h / (a.H / a.Hk));
  T s = T(0);
  for (int64_t d = 0; d < a.D; ++d) s += operand(a, q[d * a.q.strides[3]]) * operand(a, k[d * a.k.strides[3]]);
  return capped(a, s, slope);
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
    for (int64_t j0 = key_begin(a, i); j0 < end; j0 += 32) {
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
          if (d < a.Dv) o[e] += operand(a, ps) * operand(a, vr[d * a.v.strides[3]]);
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

// ---- attention_back: flat [dq, dk, dv]; inputs q, k, v, dout, segments.

// dO_i . v_j.
template <class T>
__device__ __forceinline__ T dout_dot_v(const Attn& a, const View& dout, int64_t b, int64_t i, int64_t h, int64_t j) {
  const T* g = at4<T>(dout, b, i, h);
  const T* v = at4<T>(a.v, b, j, h / (a.H / a.Hk));
  T s = T(0);
  for (int64_t d = 0; d < a.Dv; ++d) s += operand(a, g[d * dout.strides[3]]) * operand(a, v[d * a.v.strides[3]]);
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
    const int64_t begin = key_begin(a, i), end = key_end(a, i);
    // The row's max and sum, online.
    T m = lowest, l = T(0);
    for (int64_t j0 = begin; j0 < end; j0 += 32) {
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
    for (int64_t j0 = begin; j0 < end; j0 += 32) {
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
      for (int64_t j0 = begin; j0 < end; j0 += 32) {
        const int64_t j = j0 + lane;
        T ds = T(0);
        if (j < end && visible(a, b, i, j)) {
          T slope;
          const T p = gpu_math::exp(score<T>(a, b, i, h, j, &slope) - lse);
          ds = p * (dout_dot_v<T>(a, dout, b, i, h, j) - dd) * slope;
        }
        for (int src = 0; src < 32; ++src) {
          const T dss = shuffle_from(ds, src);
          if (dss == T(0)) continue;
          const T* kr = at4<T>(a.k, b, j0 + src, hk);
          for (int e = 0; e < kPerLane; ++e) {
            const int64_t d = d0 + lane + 32 * e;
            if (d < a.D) acc[e] += operand(a, dss) * operand(a, kr[d * a.k.strides[3]]);
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
    const int64_t i_begin = query_begin(a, j), i_end = query_end(a, j);
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (int64_t i0 = i_begin; i0 < i_end; i0 += 32) {
        const int64_t i = i0 + lane;
        T p = T(0), ds = T(0);
        if (i < a.Tq && visible(a, b, i, j)) {
          const T* st = stats + ((b * a.H + h) * a.Tq + i) * 2;
          T slope;
          p = gpu_math::exp(score<T>(a, b, i, h, j, &slope) - st[0]);
          ds = p * (dout_dot_v<T>(a, dout, b, i, h, j) - st[1]) * slope;
        }
        for (int src = 0; src < 32; ++src) {
          const T ps = shuffle_from(p, src), dss = shuffle_from(ds, src);
          if (ps == T(0) && dss == T(0)) continue;
          const T* qr = at4<T>(a.q, b, i0 + src, h);
          const T* gr = at4<T>(dout, b, i0 + src, h);
          for (int e = 0; e < kPerLane; ++e) {
            const int64_t d = d0 + lane + 32 * e;
            if (d < a.D) gk[e] += operand(a, dss) * operand(a, qr[d * a.q.strides[3]]);
            if (d < a.Dv) gv[e] += operand(a, ps) * operand(a, gr[d * dout.strides[3]]);
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

// ---- Tiled attention and attention_back: a block of kTileThreads per tile
// of query rows (of key rows for dk and dv), its operands' tiles in shared
// memory and every product a block_product (tiles.h): on tensor cores from
// bf16 under the bf16 matmul option (f32), on CUDA cores otherwise. The
// backward is flash attention 2's: the rows kernel recomputes a query tile's
// output (its log-sum-exp, and D = dO . O) then dq; the keys kernel sums a
// key tile's dk and dv over its group's query heads in order, then its
// queries in order: no atomics. Heads too wide for any tile's shared memory
// take the warp-per-row kernels above.

constexpr int kTileThreads = 128;
// Shared memory a block aims to stay within, so that several blocks share a
// multiprocessor (larger tiles only where nothing smaller fits it).
constexpr size_t kTileBudget = size_t(64) << 10;

enum class TileKernel { forward, rows_back, keys_back, probs, probs_back, values_dp };

// A tiled kernel's arrays: byte offsets into its dynamic shared memory and
// row strides (in elements: E for operands, T for scores and sums).
struct Tiles {
  int br = 0, bc = 0, dp = 0, dvp = 0;  // query rows, key rows, D and Dv padded to 16
  int ldq = 0, ldv = 0, ldp = 0;        // E rows: D wide, Dv wide, bc wide
  int lds = 0, ldcq = 0, ldcv = 0;      // T rows: bc wide, D wide, Dv wide
  // Arrays a kernel has no use for stay kUnset (the emulator refuses them).
  static constexpr uint32_t kUnset = 0xffffffffu;
  uint32_t q = kUnset, k = kUnset, v = kUnset, dout = kUnset, s = kUnset, p = kUnset, dp_ = kUnset, ds = kUnset;
  uint32_t acc = kUnset, acc_v = kUnset, m = kUnset, l = kUnset, alpha = kUnset, lse = kUnset, dd = kUnset;
  uint32_t bytes = 0;
};

Tiles tiles_for(TileKernel kind, int br, int bc, int64_t D, int64_t Dv, size_t t_bytes, bool tensor) {
  Tiles t;
  t.br = br;
  t.bc = bc;
  t.dp = int((D + 15) / 16 * 16);
  t.dvp = int((Dv + 15) / 16 * 16);
  // Padding: CUDA cores read columns across threads (one more element
  // spreads them over the banks); wmma needs 16-byte multiples.
  const int pe = tensor ? 8 : 1, pc = tensor ? 4 : 1;
  const size_t e_bytes = tensor ? 2 : t_bytes;
  t.ldq = t.dp + pe;
  t.ldv = t.dvp + pe;
  t.lds = bc + pc;
  t.ldp = tensor ? bc + pe : t.lds;
  t.ldcq = t.dp + pc;
  t.ldcv = t.dvp + pc;
  size_t at = 0;
  auto take = [&](int64_t rows, int64_t ld, size_t bytes) {
    const size_t o = at;
    at = (at + size_t(rows * ld) * bytes + 31) / 32 * 32;
    return uint32_t(o);
  };
  auto e = [&](int64_t rows, int64_t ld) { return take(rows, ld, e_bytes); };
  auto f = [&](int64_t rows, int64_t ld) { return take(rows, ld, t_bytes); };
  // Without tensor cores P and dS overwrite the scores and dP in place.
  auto scores = [&](int rows) {
    t.s = f(rows, t.lds);
    t.p = tensor ? e(rows, t.ldp) : t.s;
  };
  switch (kind) {
    case TileKernel::forward:
      t.q = e(br, t.ldq);
      t.k = t.v = e(bc, t.ldq > t.ldv ? t.ldq : t.ldv);  // v replaces k once S is made
      scores(br);
      t.acc = f(br, t.ldcv);
      break;
    case TileKernel::rows_back:
    case TileKernel::keys_back:
      t.q = e(br, t.ldq);
      t.dout = e(br, t.ldv);
      t.k = e(bc, t.ldq);
      t.v = e(bc, t.ldv);
      scores(br);
      t.dp_ = f(br, t.lds);
      t.ds = tensor ? e(br, t.ldp) : t.dp_;
      if (kind == TileKernel::rows_back) {
        t.acc = f(br, t.ldcq > t.ldcv ? t.ldcq : t.ldcv);  // O, then dq
      } else {
        t.acc = f(bc, t.ldcq);  // dk
        t.acc_v = f(bc, t.ldcv);
      }
      break;
    case TileKernel::probs:
      t.q = e(br, t.ldq);
      t.k = e(bc, t.ldq);
      t.s = f(br, t.lds);
      break;
    case TileKernel::probs_back:  // k for dq's tiles, q for dk's
      t.q = e(br, t.ldq);
      t.k = e(bc, t.ldq);
      t.ds = e(br, t.ldp);
      t.acc = f(br > bc ? br : bc, t.ldcq);
      break;
    case TileKernel::values_dp:
      t.dout = e(br, t.ldv);
      t.v = e(bc, t.ldv);
      t.s = f(br, t.lds);
      break;
  }
  t.m = f(1, br);
  t.l = f(1, br);
  t.alpha = f(1, br);
  t.lse = f(1, br);
  t.dd = f(1, br);
  t.bytes = uint32_t(at);
  return t;
}

// The largest tiles within kTileBudget, else the largest within the
// device's limit; br 0 where none fit.
Tiles choose_tiles(TileKernel kind, int64_t D, int64_t Dv, size_t t_bytes, bool tensor) {
  constexpr int sizes[][2] = {{64, 64}, {64, 32}, {32, 32}, {16, 16}};
  for (size_t limit : {kTileBudget, max_shared_bytes()}) {
    for (const auto& sz : sizes) {
      const Tiles t = tiles_for(kind, sz[0], sz[1], D, Dv, t_bytes, tensor);
      if (t.bytes <= limit) return t;
    }
  }
  return {};
}

template <class X>
__device__ __forceinline__ X* shared_at(uint32_t offset) {
#if defined(NABLA_CUDA_EMULATED)
  if (offset >= cuda_emulator::launch_state().dynamic_shared_bytes) {
    throw std::logic_error("attention: a tile array past the block's shared memory (or never laid out)");
  }
#endif
  return reinterpret_cast<X*>(dynamic_shared<unsigned char>() + offset);
}

// dst [rows, width] (row stride ld) = x's rows t0.. of head h in batch b,
// zero past row t_end and column cols.
template <class T, class E>
__device__ void load_tile(E* dst, int ld, int rows, int width, const View& x, int64_t b, int64_t t0, int64_t t_end,
                          int64_t h, int64_t cols) {
  for (int e = int(threadIdx.x); e < rows * width; e += int(blockDim.x)) {
    const int r = e / width, c = e % width;
    T value = T(0);
    if (t0 + r < t_end && c < cols) value = at4<T>(x, b, t0 + r, h)[c * x.strides[3]];
    dst[r * ld + c] = to_element<E>(value);
  }
}

// out [B, T, heads, width]'s rows t0.. (below t_end) of head h in batch b =
// acc [rows, ld] times scale, each row divided by divisor[row] where given.
template <class T>
__device__ void store_rows(T* out, int64_t b, int64_t t_end, int64_t heads, int64_t h, int64_t width, int64_t t0,
                           int rows, const T* acc, int ld, T scale, const T* divisor = nullptr) {
  for (int64_t e = threadIdx.x; e < rows * width; e += blockDim.x) {
    const int64_t r = e / width, d = e % width, t = t0 + r;
    if (t >= t_end) continue;
    const T x = acc[r * ld + d] * scale;
    out[((b * t_end + t) * heads + h) * width + d] = divisor ? x / divisor[r] : x;
  }
}

// The query tile at i0 (q loaded) against every key it may see: O (acc, not
// yet divided by l), and each row's running max m and sum l; or, given
// `scores` (attention_probs' P [B, H, Tq, Tk]), the scaled scores written
// there (masked ones -inf) instead of O. Ends synced.
template <class T, class E>
__device__ void attend_tile(const Attn& a, const Tiles& t, int64_t b, int64_t h, int64_t i0, T* scores = nullptr) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = int(blockDim.x) / 32;
  const int64_t hk = h / (a.H / a.Hk);
  const E* q = shared_at<E>(t.q);
  E* k = shared_at<E>(t.k);
  T* s = shared_at<T>(t.s);
  T *m = shared_at<T>(t.m), *l = shared_at<T>(t.l), *alpha = shared_at<T>(t.alpha);
  // Only attention's O needs values.
  E* v = scores ? nullptr : shared_at<E>(t.v);
  E* p = scores ? nullptr : shared_at<E>(t.p);
  T* o = scores ? nullptr : shared_at<T>(t.acc);
  const T lowest = -T(INFINITY);
  if (!scores) {
    for (int e = int(threadIdx.x); e < t.br * t.ldcv; e += int(blockDim.x)) o[e] = T(0);
  }
  for (int r = int(threadIdx.x); r < t.br; r += int(blockDim.x)) {
    m[r] = lowest;
    l[r] = T(0);
  }
  const int64_t last = (i0 + t.br < a.Tq ? i0 + t.br : a.Tq) - 1;
  const int64_t end = key_end(a, last);
  for (int64_t j0 = key_begin(a, i0); j0 < end; j0 += t.bc) {
    __syncthreads();
    load_tile<T>(k, t.ldq, t.bc, t.dp, a.k, b, j0, a.Tk, hk, a.D);
    __syncthreads();
    block_product<T, E>({q, t.ldq, false}, {k, t.ldq, true}, s, t.lds, t.br, t.bc, t.dp, false);
    __syncthreads();
    for (int r = warp; r < t.br; r += warps) {
      const int64_t i = i0 + r;
      T x[2], mx = lowest;
      for (int e = 0; e < 2; ++e) {
        const int c = lane + 32 * e;
        const int64_t j = j0 + c;
        x[e] = c < t.bc && i < a.Tq && j < a.Tk && visible(a, b, i, j) ? capped(a, s[r * t.lds + c]) : lowest;
        mx = max_of(mx, x[e]);
        if (scores && c < t.bc && i < a.Tq && j < a.Tk) scores[((b * a.H + h) * a.Tq + i) * a.Tk + j] = x[e];
      }
      mx = warp_max(mx);
      const T m_old = m[r], m_new = max_of(m_old, mx);
      const T scale_old = m_new == lowest ? T(1) : gpu_math::exp(m_old - m_new);
      T sum = T(0);
      for (int e = 0; e < 2; ++e) {
        const int c = lane + 32 * e;
        if (c >= t.bc) continue;
        const T pv = x[e] == lowest ? T(0) : gpu_math::exp(x[e] - m_new);
        if (!scores) p[r * t.ldp + c] = to_element<E>(pv);
        sum += pv;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        m[r] = m_new;
        l[r] = l[r] * scale_old + sum;
        alpha[r] = scale_old;
      }
    }
    if (scores) continue;
    // v may take k's memory: the product above was k's last reader.
    load_tile<T>(v, t.ldv, t.bc, t.dvp, a.v, b, j0, a.Tk, hk, a.Dv);
    __syncthreads();
    block_product<T, E>({p, t.ldp, false}, {v, t.ldv, false}, o, t.ldcv, t.br, t.dvp, t.bc, true, alpha);
  }
  __syncthreads();
}

// grid: (query tiles, H, B).
template <class T, class E>
__global__ void attention_tiles_kernel(Attn a, Tiles t, T* out) {
  const int64_t h = blockIdx.y, b = blockIdx.z, i0 = int64_t(blockIdx.x) * t.br;
  load_tile<T>(shared_at<E>(t.q), t.ldq, t.br, t.dp, a.q, b, i0, a.Tq, h, a.D);
  attend_tile<T, E>(a, t, b, h, i0);
  const T* o = shared_at<T>(t.acc);
  const T* l = shared_at<T>(t.l);
  store_rows(out, b, a.Tq, a.H, h, a.Dv, i0, t.br, o, t.ldcv, T(1), l);
}

// P and dS = P (dP - D) of the scores s and dP (masked ones 0; capped
// scores' times 1 - tanh^2), as E.
template <class T, class E>
__device__ void scores_back(const Attn& a, const Tiles& t, int64_t b, int64_t i0, int64_t j0) {
  const T* s = shared_at<T>(t.s);
  const T* dp = shared_at<T>(t.dp_);
  E* p = shared_at<E>(t.p);
  E* ds = shared_at<E>(t.ds);
  const T *lse = shared_at<T>(t.lse), *dd = shared_at<T>(t.dd);
  for (int e = int(threadIdx.x); e < t.br * t.bc; e += int(blockDim.x)) {
    const int r = e / t.bc, c = e % t.bc;
    const int64_t i = i0 + r, j = j0 + c;
    T pv = T(0), dsv = T(0);
    if (i < a.Tq && j < a.Tk && visible(a, b, i, j)) {
      T slope;
      pv = gpu_math::exp(capped(a, s[r * t.lds + c], &slope) - lse[r]);
      dsv = pv * (dp[r * t.lds + c] - dd[r]) * slope;
    }
    p[r * t.ldp + c] = to_element<E>(pv);
    ds[r * t.ldp + c] = to_element<E>(dsv);
  }
}

// S = Q K^T and dP = dO V^T of the loaded tiles.
template <class T, class E>
__device__ void scores_and_dp(const Tiles& t) {
  const E *q = shared_at<E>(t.q), *k = shared_at<E>(t.k), *v = shared_at<E>(t.v), *g = shared_at<E>(t.dout);
  block_product<T, E>({q, t.ldq, false}, {k, t.ldq, true}, shared_at<T>(t.s), t.lds, t.br, t.bc, t.dp, false);
  block_product<T, E>({g, t.ldv, false}, {v, t.ldv, true}, shared_at<T>(t.dp_), t.lds, t.br, t.bc, t.dvp, false);
}

// A query tile's log-sum-exp and D (into stats [B, H, Tq, 2]), then dq.
// grid: (query tiles, H, B).
template <class T, class E>
__global__ void attention_rows_tiles_kernel(Attn a, View dout, Tiles t, T* stats, T* dq) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = int(blockDim.x) / 32;
  const int64_t h = blockIdx.y, b = blockIdx.z, i0 = int64_t(blockIdx.x) * t.br;
  const int64_t hk = h / (a.H / a.Hk);
  load_tile<T>(shared_at<E>(t.q), t.ldq, t.br, t.dp, a.q, b, i0, a.Tq, h, a.D);
  load_tile<T>(shared_at<E>(t.dout), t.ldv, t.br, t.dvp, dout, b, i0, a.Tq, h, a.Dv);
  attend_tile<T, E>(a, t, b, h, i0);
  T* acc = shared_at<T>(t.acc);
  const T *m = shared_at<T>(t.m), *l = shared_at<T>(t.l);
  T *lse = shared_at<T>(t.lse), *dd = shared_at<T>(t.dd);
  for (int r = warp; r < t.br; r += warps) {
    const int64_t i = i0 + r;
    T x = T(0);
    if (i < a.Tq) {
      const T* g = at4<T>(dout, b, i, h);
      for (int64_t d = lane; d < a.Dv; d += 32) x += g[d * dout.strides[3]] * acc[r * t.ldcv + d];
    }
    x = warp_sum(x);
    if (lane == 0) {
      lse[r] = i < a.Tq ? m[r] + gpu_math::log(l[r]) : T(0);
      dd[r] = i < a.Tq ? x / l[r] : T(0);
      if (i < a.Tq) {
        T* st = stats + ((b * a.H + h) * a.Tq + i) * 2;
        st[0] = lse[r];
        st[1] = dd[r];
      }
    }
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < t.br * t.ldcq; e += int(blockDim.x)) acc[e] = T(0);
  const int64_t last = (i0 + t.br < a.Tq ? i0 + t.br : a.Tq) - 1;
  const int64_t end = key_end(a, last);
  E* k = shared_at<E>(t.k);
  for (int64_t j0 = key_begin(a, i0); j0 < end; j0 += t.bc) {
    __syncthreads();
    load_tile<T>(k, t.ldq, t.bc, t.dp, a.k, b, j0, a.Tk, hk, a.D);
    load_tile<T>(shared_at<E>(t.v), t.ldv, t.bc, t.dvp, a.v, b, j0, a.Tk, hk, a.Dv);
    __syncthreads();
    scores_and_dp<T, E>(t);
    __syncthreads();
    scores_back<T, E>(a, t, b, i0, j0);
    __syncthreads();
    block_product<T, E>({shared_at<E>(t.ds), t.ldp, false}, {k, t.ldq, false}, acc, t.ldcq, t.br, t.dp, t.bc, true);
  }
  __syncthreads();
  store_rows(dq, b, a.Tq, a.H, h, a.D, i0, t.br, acc, t.ldcq, T(a.scale));
}

// A key tile's dk and dv, summed over its group's query heads in order and
// the queries that may see it. grid: (key tiles, Hk, B).
template <class T, class E>
__global__ void attention_keys_tiles_kernel(Attn a, View dout, Tiles t, const T* stats, T* dk, T* dv) {
  const int64_t hk = blockIdx.y, b = blockIdx.z, j0 = int64_t(blockIdx.x) * t.bc;
  const int64_t group = a.H / a.Hk;
  load_tile<T>(shared_at<E>(t.k), t.ldq, t.bc, t.dp, a.k, b, j0, a.Tk, hk, a.D);
  load_tile<T>(shared_at<E>(t.v), t.ldv, t.bc, t.dvp, a.v, b, j0, a.Tk, hk, a.Dv);
  T *gk = shared_at<T>(t.acc), *gv = shared_at<T>(t.acc_v);
  for (int e = int(threadIdx.x); e < t.bc * t.ldcq; e += int(blockDim.x)) gk[e] = T(0);
  for (int e = int(threadIdx.x); e < t.bc * t.ldcv; e += int(blockDim.x)) gv[e] = T(0);
  T *lse = shared_at<T>(t.lse), *dd = shared_at<T>(t.dd);
  // The queries that may see keys [j0, j0 + bc).
  const int64_t last = (j0 + t.bc < a.Tk ? j0 + t.bc : a.Tk) - 1;
  const int64_t i_begin = query_begin(a, j0), i_end = query_end(a, last);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t i0 = i_begin; i0 < i_end; i0 += t.br) {
      __syncthreads();
      load_tile<T>(shared_at<E>(t.q), t.ldq, t.br, t.dp, a.q, b, i0, a.Tq, h, a.D);
      load_tile<T>(shared_at<E>(t.dout), t.ldv, t.br, t.dvp, dout, b, i0, a.Tq, h, a.Dv);
      for (int r = int(threadIdx.x); r < t.br; r += int(blockDim.x)) {
        const bool in = i0 + r < a.Tq;
        const T* st = stats + ((b * a.H + h) * a.Tq + (i0 + r)) * 2;
        lse[r] = in ? st[0] : T(0);
        dd[r] = in ? st[1] : T(0);
      }
      __syncthreads();
      scores_and_dp<T, E>(t);
      __syncthreads();
      scores_back<T, E>(a, t, b, i0, j0);
      __syncthreads();
      block_product<T, E>({shared_at<E>(t.p), t.ldp, true}, {shared_at<E>(t.dout), t.ldv, false}, gv, t.ldcv, t.bc,
                          t.dvp, t.br, true);
      block_product<T, E>({shared_at<E>(t.ds), t.ldp, true}, {shared_at<E>(t.q), t.ldq, false}, gk, t.ldcq, t.bc,
                          t.dp, t.br, true);
    }
  }
  __syncthreads();
  store_rows(dk, b, a.Tk, a.Hk, hk, a.D, j0, t.bc, gk, t.ldcq, T(a.scale));
  store_rows(dv, b, a.Tk, a.Hk, hk, a.Dv, j0, t.bc, gv, t.ldcv, T(1));
}

Launch tiles_launch(int64_t rows, int tile, int64_t heads, int64_t batch, const Tiles& t) {
  return {dim3(unsigned((rows + tile - 1) / tile), unsigned(heads), unsigned(batch)), dim3(kTileThreads), t.bytes, true};
}

// fn<E>(): E the tiles' element, bf16 for f32 under the bf16 matmul option.
template <class T, class F>
void with_elements(const Context& ctx, F&& fn) {
  if constexpr (std::is_same_v<T, float>) {
    if (ctx.bf16_matmul) return fn.template operator()<bf16>();
  }
  fn.template operator()<T>();
}

void attention(const Operands& a, const Context& ctx) {
  const Attn t = attn_of(a, ctx, 3);
  if (a.out.numel() == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    with_elements<T>(ctx, [&]<class E>() {
      const Tiles tiles = choose_tiles(TileKernel::forward, t.D, t.Dv, sizeof(T), kTensorCores<E>);
      if (tiles.br > 0) {
        launch(ctx, tiles_launch(t.Tq, tiles.br, t.H, t.B, tiles), attention_tiles_kernel<T, E>, t, tiles,
               a.out.ptr<T>());
        return;
      }
      const int64_t chunks = (t.Dv + kChunk - 1) / kChunk;
      launch(ctx, rows_grid(t.Tq, t.H, t.B * chunks), attention_kernel<T>, t, a.out.ptr<T>());
    });
  });
}

void attention_back(const Operands& a, const Context& ctx) {
  const Attn t = attn_of(a, ctx, 4);
  const int64_t nq = a.in[0].numel(), nk = a.in[1].numel();
  if (a.out.numel() == 0) return;
  if (t.Tq == 0) return fill(ctx, a.out, 0.0);
  const View dout = make_view(a.in[3]);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    T* out = a.out.ptr<T>();
    T* stats = static_cast<T*>(scratch(ctx, size_t(t.B * t.H * t.Tq * 2) * sizeof(T)));
    with_elements<T>(ctx, [&]<class E>() {
      const Tiles rows = choose_tiles(TileKernel::rows_back, t.D, t.Dv, sizeof(T), kTensorCores<E>);
      const Tiles keys = choose_tiles(TileKernel::keys_back, t.D, t.Dv, sizeof(T), kTensorCores<E>);
      if (rows.br > 0 && keys.br > 0) {
        launch(ctx, tiles_launch(t.Tq, rows.br, t.H, t.B, rows), attention_rows_tiles_kernel<T, E>, t, dout, rows,
               stats, out);
        if (t.Tk > 0) {
          launch(ctx, tiles_launch(t.Tk, keys.bc, t.Hk, t.B, keys), attention_keys_tiles_kernel<T, E>, t, dout, keys,
                 static_cast<const T*>(stats), out + nq, out + nq + nk);
        }
        return;
      }
      launch(ctx, rows_grid(t.Tq, t.H, t.B), attention_rows_back_kernel<T>, t, dout, stats, out);
      const int64_t width = t.D > t.Dv ? t.D : t.Dv, chunks = (width + kChunk - 1) / kChunk;
      if (t.Tk > 0 && chunks > 0) {
        launch(ctx, rows_grid(t.Tk, t.Hk, t.B * chunks), attention_keys_back_kernel<T>, t, dout,
               static_cast<const T*>(stats), out + nq, out + nq + nk);
      }
    });
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
      acc += operand(a, ds) * operand(a, at4<T>(a.k, b, j, h)[d * a.k.strides[3]]);
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
      acc += operand(a, ds) * operand(a, at4<T>(a.q, b, i, h)[d * a.q.strides[3]]);
    }
    dk[x] = acc * T(a.scale);
  }
}

// ---- attention_probs and its backwards on tiles (heads too wide for them
// take the per-row kernels below).

// grid: (query tiles, H, B): the tile's scores, then its rows' P.
template <class T, class E>
__global__ void probs_tiles_kernel(Attn a, Tiles t, T* out) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = int(blockDim.x) / 32;
  const int64_t h = blockIdx.y, b = blockIdx.z, i0 = int64_t(blockIdx.x) * t.br;
  load_tile<T>(shared_at<E>(t.q), t.ldq, t.br, t.dp, a.q, b, i0, a.Tq, h, a.D);
  attend_tile<T, E>(a, t, b, h, i0, out);
  const T *m = shared_at<T>(t.m), *l = shared_at<T>(t.l);
  for (int r = warp; r < t.br; r += warps) {
    const int64_t i = i0 + r;
    if (i >= a.Tq) break;
    T* row = out + ((b * a.H + h) * a.Tq + i) * a.Tk;
    // Keys past the tile's last visible one were never scored.
    const int64_t end = key_end(a, i);
    for (int64_t j = lane; j < a.Tk; j += 32) row[j] = j < end ? gpu_math::exp(row[j] - m[r]) / l[r] : T(0);
  }
}

// dS = P (dP - r) of rows i0.. and keys j0.. (r: the rows' sums of P dP) as
// E [br, bc], zero outside.
template <class T, class E>
__device__ void load_ds(const Attn& a, const Tiles& t, const View& p, const View& dp, const T* r, int64_t b,
                        int64_t h, int64_t i0, int64_t j0) {
  E* ds = shared_at<E>(t.ds);
  for (int e = int(threadIdx.x); e < t.br * t.bc; e += int(blockDim.x)) {
    const int row = e / t.bc, c = e % t.bc;
    const int64_t i = i0 + row, j = j0 + c;
    T x = T(0);
    if (i < a.Tq && j < a.Tk) x = at_probs<T>(p, b, h, i, j) * (at_probs<T>(dp, b, h, i, j) - r[(b * a.H + h) * a.Tq + i]);
    ds[row * t.ldp + c] = to_element<E>(x);
  }
}

// dq of a query tile (scale times the sum over key tiles of dS k) or, with
// `keys`, dk of a key tile (over query tiles, of dS^T q). grid: (tiles, H, B).
template <class T, class E>
__global__ void probs_grad_tiles_kernel(Attn a, Tiles t, View p, View dp, const T* r, bool keys, T* out) {
  const int rows = keys ? t.bc : t.br, others = keys ? t.br : t.bc;
  const int64_t h = blockIdx.y, b = blockIdx.z, first = int64_t(blockIdx.x) * rows;
  T* acc = shared_at<T>(t.acc);
  E* x = shared_at<E>(keys ? t.q : t.k);
  for (int e = int(threadIdx.x); e < rows * t.ldcq; e += int(blockDim.x)) acc[e] = T(0);
  // The other side's rows that meet these: causal skips the rest.
  int64_t begin = 0, end = a.Tq;
  if (keys && a.causal) begin = first - (a.Tk - a.Tq) > 0 ? first - (a.Tk - a.Tq) : 0;
  if (!keys) end = key_end(a, (first + rows < a.Tq ? first + rows : a.Tq) - 1);
  for (int64_t o0 = begin; o0 < end; o0 += others) {
    __syncthreads();
    if (keys) load_ds<T, E>(a, t, p, dp, r, b, h, o0, first);
    else load_ds<T, E>(a, t, p, dp, r, b, h, first, o0);
    load_tile<T>(x, t.ldq, others, t.dp, keys ? a.q : a.k, b, o0, keys ? a.Tq : a.Tk, h, a.D);
    __syncthreads();
    block_product<T, E>({shared_at<E>(t.ds), t.ldp, keys}, {x, t.ldq, false}, acc, t.ldcq, rows, t.dp, others, true);
  }
  __syncthreads();
  store_rows(out, b, keys ? a.Tk : a.Tq, a.H, h, a.D, first, rows, acc, t.ldcq, T(a.scale));
}

// dP [B, H, Tq, Tk] = dO v^T for a query tile. grid: (query tiles, H, B).
template <class T, class E>
__global__ void values_dp_tiles_kernel(Attn a, Tiles t, View dout, View v, T* dp) {
  const int64_t h = blockIdx.y, b = blockIdx.z, i0 = int64_t(blockIdx.x) * t.br;
  const int64_t Dv = v.shape[3];
  E *g = shared_at<E>(t.dout), *vs = shared_at<E>(t.v);
  T* s = shared_at<T>(t.s);
  load_tile<T>(g, t.ldv, t.br, t.dvp, dout, b, i0, a.Tq, h, Dv);
  for (int64_t j0 = 0; j0 < a.Tk; j0 += t.bc) {
    __syncthreads();
    load_tile<T>(vs, t.ldv, t.bc, t.dvp, v, b, j0, a.Tk, h, Dv);
    __syncthreads();
    block_product<T, E>({g, t.ldv, false}, {vs, t.ldv, true}, s, t.lds, t.br, t.bc, t.dvp, false);
    __syncthreads();
    for (int e = int(threadIdx.x); e < t.br * t.bc; e += int(blockDim.x)) {
      const int row = e / t.bc, c = e % t.bc;
      const int64_t i = i0 + row, j = j0 + c;
      if (i < a.Tq && j < a.Tk) dp[((b * a.H + h) * a.Tq + i) * a.Tk + j] = s[row * t.lds + c];
    }
  }
}

void attention_probs(const Operands& a, const Context& ctx) {
  const Attn t = attn_of(a, ctx, 0, false);
  if (a.out.numel() == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    with_elements<T>(ctx, [&]<class E>() {
      const Tiles tiles = choose_tiles(TileKernel::probs, t.D, 0, sizeof(T), kTensorCores<E>);
      if (tiles.br > 0) {
        launch(ctx, tiles_launch(t.Tq, tiles.br, t.H, t.B, tiles), probs_tiles_kernel<T, E>, t, tiles, a.out.ptr<T>());
      } else {
        launch(ctx, rows_grid(t.Tq, t.H, t.B), probs_kernel<T>, t, a.out.ptr<T>());
      }
    });
  });
}

// q, k, p, dp -> flat [dq, dk].
void probs_back_from(const Operands& a, const Context& ctx, const View& p, const View& dp) {
  const Attn t = attn_of(a, ctx, 0, false);
  const int64_t nq = a.in[0].numel(), nk = a.in[1].numel(), rows = t.B * t.H * t.Tq;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    T* out = a.out.ptr<T>();
    T* r = static_cast<T*>(scratch(ctx, size_t(rows > 0 ? rows : 1) * sizeof(T)));
    if (rows > 0) {
      launch(ctx, rows_launch((rows + kWarps - 1) / kWarps, 32 * kWarps), probs_rowsum_kernel<T>, rows, p, dp, r);
    }
    with_elements<T>(ctx, [&]<class E>() {
      const Tiles tiles = choose_tiles(TileKernel::probs_back, t.D, 0, sizeof(T), kTensorCores<E>);
      const T* rs = r;
      if (tiles.br > 0) {
        if (nq > 0) {
          launch(ctx, tiles_launch(t.Tq, tiles.br, t.H, t.B, tiles), probs_grad_tiles_kernel<T, E>, t, tiles, p, dp, rs,
                 false, out);
        }
        if (nk > 0) {
          launch(ctx, tiles_launch(t.Tk, tiles.bc, t.H, t.B, tiles), probs_grad_tiles_kernel<T, E>, t, tiles, p, dp, rs,
                 true, out + nq);
        }
        return;
      }
      if (nq > 0) launch(ctx, elementwise_launch(nq), probs_dq_kernel<T>, nq, t, p, dp, rs, out);
      if (nk > 0) launch(ctx, elementwise_launch(nk), probs_dk_kernel<T>, nk, t, p, dp, rs, out + nq);
    });
  });
}

void attention_probs_back(const Operands& a, const Context& ctx) {
  probs_back_from(a, ctx, make_view(a.in[2]), make_view(a.in[3]));
}

// dP [B, H, Tq, Tk] = dO v^T, then as attention_probs_back.
template <class T>
__global__ void values_dp_kernel(int64_t n, View dout, View v, int64_t H, int64_t Tq, int64_t Tk, bool bf16, T* dp) {
  const int64_t Dv = v.shape[3];
  NABLA_GRID_STRIDE(x, n) {
    const int64_t j = x % Tk, i = x / Tk % Tq, h = x / (Tk * Tq) % H, b = x / (Tk * Tq * H);
    const T* g = at4<T>(dout, b, i, h);
    const T* vr = at4<T>(v, b, j, h);
    T s = T(0);
    for (int64_t d = 0; d < Dv; ++d) {
      const T x = g[d * dout.strides[3]], y = vr[d * v.strides[3]];
      s += bf16 ? round_bf16(x) * round_bf16(y) : x * y;
    }
    dp[x] = s;
  }
}

void attention_probs_values_back(const Operands& a, const Context& ctx) {
  const TensorView& p = a.in[2];
  const int64_t n = p.numel();
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    T* dp = static_cast<T*>(scratch(ctx, size_t(n > 0 ? n : 1) * sizeof(T)));
    if (n > 0) {
      const Attn t = attn_of(a, ctx, 0, false);
      const View dout = make_view(a.in[4]), v = make_view(a.in[3]);
      with_elements<T>(ctx, [&]<class E>() {
        const Tiles tiles = choose_tiles(TileKernel::values_dp, 0, v.shape[3], sizeof(T), kTensorCores<E>);
        if (tiles.br > 0) {
          launch(ctx, tiles_launch(t.Tq, tiles.br, t.H, t.B, tiles), values_dp_tiles_kernel<T, E>, t, tiles, dout, v, dp);
        } else {
          launch(ctx, elementwise_launch(n), values_dp_kernel<T>, n, dout, v, p.shape[1], p.shape[2], p.shape[3],
                 ctx.bf16_matmul, dp);
        }
      });
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
