// The reductions on the GPU. sum, mean and max: where the reduced elements
// lie side by side, one block per output element, its threads striding over
// them, then a block tree; where the outputs do (a bias's gradient: columns
// of [rows, C]), a warp reads 32 neighbouring outputs' elements of a row at
// once, chunks of rows go to different blocks, and a second pass adds the
// chunks in order. Either way the same order for every run. argmax: one
// thread per output element. squared_norm: fixed chunks summed in double,
// then the chunks in order.
#include "backend/cuda/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_argmax, op_max, op_mean, op_squared_norm, op_sum;
}  // namespace ops

namespace NABLA_GPU {
namespace {

// x split into the axes an output element keeps and the axes it folds.
struct Split {
  View kept, folded;
  int64_t outputs, count;
};

// attrs.ints = {keepdim, axis...}.
Split split(const Operands& a) {
  const TensorView& x = a.in[0];
  std::vector<bool> reduced(x.shape.size(), false);
  for (size_t k = 1; k < a.attrs->ints.size(); ++k) reduced[size_t(a.attrs->ints[k])] = true;
  Split s{make_view(x), make_view(x), 1, 1};
  s.kept.rank = s.folded.rank = 0;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    View& v = reduced[d] ? s.folded : s.kept;
    v.shape[v.rank] = x.shape[d];
    v.strides[v.rank] = x.strides[d];
    ++v.rank;
    (reduced[d] ? s.count : s.outputs) *= x.shape[d];
  }
  View* kept[] = {&s.kept};
  View* folded[] = {&s.folded};
  coalesce(kept, 1);
  coalesce(folded, 1);
  return s;
}

enum class Fold { sum, mean, max };

template <class T, Fold F>
__global__ void fold_kernel(Split s, T* out) {
  const int64_t o = block_row();
  if (o >= s.outputs) return;
  const T* x = static_cast<const T*>(s.kept.data);
  const int64_t base = offset_of(s.kept, o);
  const T lowest = -T(INFINITY);
  T acc = F == Fold::max ? lowest : T(0);
  for (int64_t r = threadIdx.x; r < s.count; r += blockDim.x) {
    const T v = x[base + offset_of(s.folded, r)];
    if (F == Fold::max) acc = v > acc || gpu_math::isnan(double(v)) ? v : acc;
    else acc += v;
  }
  if (F == Fold::max) acc = block_max(acc, lowest);
  else acc = block_sum(acc);
  if (threadIdx.x == 0) out[o] = F == Fold::mean && s.count > 0 ? acc / T(s.count) : acc;
}

// Columns: blocks of kColumnRows warps; block (x, y) folds outputs 32x ...
// 32x + 31 over chunk y of the reduced elements, warp w taking elements
// w, w + kColumnRows, ... of the chunk; the warps' results are combined in
// warp order. One chunk: the outputs; else partial [chunks, outputs].
constexpr int kColumnRows = 8;

template <class T, Fold F>
__device__ __forceinline__ T combine(T acc, T v) {
  if (F == Fold::max) return v > acc || gpu_math::isnan(double(v)) ? v : acc;
  return acc + v;
}

template <class T, Fold F>
__global__ void columns_kernel(Split s, int64_t per_chunk, T* out) {
  NABLA_SHARED T part[kColumnRows][32];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int64_t o = int64_t(blockIdx.x) * 32 + lane;
  const int64_t first = int64_t(blockIdx.y) * per_chunk, last = first + per_chunk < s.count ? first + per_chunk : s.count;
  const T* x = static_cast<const T*>(s.kept.data);
  T acc = F == Fold::max ? -T(INFINITY) : T(0);
  if (o < s.outputs) {
    const int64_t base = offset_of(s.kept, o);
    for (int64_t r = first + warp; r < last; r += kColumnRows) acc = combine<T, F>(acc, x[base + offset_of(s.folded, r)]);
  }
  part[warp][lane] = acc;
  __syncthreads();
  if (warp != 0 || o >= s.outputs) return;
  for (int w = 1; w < kColumnRows; ++w) acc = combine<T, F>(acc, part[w][lane]);
  if (gridDim.y > 1) out[int64_t(blockIdx.y) * s.outputs + o] = acc;
  else out[o] = F == Fold::mean && s.count > 0 ? acc / T(s.count) : acc;
}

// out[o] = the chunks' partials for output o combined in chunk order.
template <class T, Fold F>
__global__ void chunks_kernel(const T* partial, int64_t chunks, int64_t outputs, int64_t count, T* out) {
  NABLA_GRID_STRIDE(o, outputs) {
    T acc = partial[o];
    for (int64_t c = 1; c < chunks; ++c) acc = combine<T, F>(acc, partial[c * outputs + o]);
    out[o] = F == Fold::mean && count > 0 ? acc / T(count) : acc;
  }
}

// Threads for a block folding `count` elements: a warp at least, 256 at most.
unsigned fold_threads(int64_t count) {
  unsigned t = 32;
  while (t < 256 && int64_t(t) < count) t *= 2;
  return t;
}

// Whether neighbouring outputs are neighbours in memory while the reduced
// elements are not: then a warp should read across outputs.
bool by_columns(const Split& s) {
  const int64_t unit = s.kept.rank > 0 ? s.kept.strides[s.kept.rank - 1] : 0;
  const int64_t along = s.folded.rank > 0 ? s.folded.strides[s.folded.rank - 1] : 0;
  return s.outputs > 1 && s.count > 1 && unit == 1 && along != 1;
}

template <Fold F>
void fold(const Operands& a, const Context& ctx) {
  const Split s = split(a);
  if (s.outputs == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    if (!by_columns(s)) {
      launch(ctx, rows_launch(s.outputs, fold_threads(s.count)), fold_kernel<T, F>, s, a.out.ptr<T>());
      return;
    }
    // Chunks enough for ~1024 blocks, each warp still folding 8 elements or more.
    const int64_t groups = (s.outputs + 31) / 32;
    const int64_t most = (s.count + 8 * kColumnRows - 1) / (8 * kColumnRows);
    int64_t chunks = (1024 + groups - 1) / groups;
    chunks = chunks < most ? chunks : most;
    chunks = chunks < 1 ? 1 : chunks > 65535 ? 65535 : chunks;
    const int64_t per_chunk = (s.count + chunks - 1) / chunks;
    chunks = (s.count + per_chunk - 1) / per_chunk;
    T* into = chunks > 1 ? static_cast<T*>(scratch(ctx, size_t(chunks * s.outputs) * sizeof(T))) : a.out.ptr<T>();
    launch(ctx, Launch{dim3(unsigned(groups), unsigned(chunks)), dim3(32 * kColumnRows), 0, true},
           columns_kernel<T, F>, s, per_chunk, into);
    if (chunks > 1) {
      launch(ctx, elementwise_launch(s.outputs), chunks_kernel<T, F>, static_cast<const T*>(into), chunks, s.outputs,
             s.count, a.out.ptr<T>());
    }
  });
}

// attrs.ints = {axis, keepdim}: the first maximum along the axis, or the
// first NaN.
template <class T>
__global__ void argmax_kernel(int64_t n, View x, View kept, int64_t length, int64_t stride, int32_t* out) {
  NABLA_GRID_STRIDE(o, n) {
    const T* p = static_cast<const T*>(x.data) + offset_of(kept, o);
    int64_t best = 0;
    T v = p[0];
    for (int64_t k = 1; k < length && !gpu_math::isnan(double(v)); ++k) {
      const T c = p[k * stride];
      if (c > v || gpu_math::isnan(double(c))) {
        v = c;
        best = k;
      }
    }
    out[o] = int32_t(best);
  }
}

void argmax(const Operands& a, const Context& ctx) {
  const TensorView& x = a.in[0];
  const size_t axis = size_t(a.attrs->ints[0]);
  View kept = make_view(x);
  kept.rank = 0;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    if (d == axis) continue;
    kept.shape[kept.rank] = x.shape[d];
    kept.strides[kept.rank] = x.strides[d];
    ++kept.rank;
  }
  const int64_t n = a.out.numel();
  if (n == 0) return;
  dispatch_real(x.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), argmax_kernel<T>, n, make_view(x), kept, x.shape[axis], x.strides[axis],
           a.out.ptr<int32_t>());
  });
}

// squared_norm: each input in chunks of kChunk elements, each chunk's
// squares summed in double by one block; then one block adds the chunks in
// order.
constexpr int64_t kChunk = 8192;

template <class T>
__global__ void squares_kernel(View x, int64_t n, double* partial) {
  const int64_t chunk = block_row();
  const int64_t begin = chunk * kChunk, end = begin + kChunk < n ? begin + kChunk : n;
  const T* p = static_cast<const T*>(x.data);
  double acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = double(p[offset_of(x, i)]);
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[chunk] = acc;
}

__global__ void sum_partials_kernel(const double* partial, int64_t n, double* out) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}

void squared_norm(const Operands& a, const Context& ctx) { squares_sum(ctx, a.in, a.out.ptr<double>()); }

}  // namespace

void squares_sum(const Context& ctx, const std::vector<TensorView>& xs, double* out) {
  int64_t chunks = 0;
  for (const TensorView& x : xs) chunks += (x.numel() + kChunk - 1) / kChunk;
  double* partial = static_cast<double*>(scratch(ctx, size_t(chunks > 0 ? chunks : 1) * sizeof(double)));
  int64_t at = 0;
  for (const TensorView& x : xs) {
    const int64_t n = x.numel(), c = (n + kChunk - 1) / kChunk;
    if (c == 0) continue;
    dispatch_real(x.dtype, ctx.op, [&]<class T>() {
      launch(ctx, rows_launch(c, 256), squares_kernel<T>, flat_view(x), n, partial + at);
    });
    at += c;
  }
  launch(ctx, Launch{dim3(1), dim3(1024), 0, true}, sum_partials_kernel, static_cast<const double*>(partial), at, out);
}

void register_reduction_kernels() {
  register_kernel(ops::op_sum, fold<Fold::sum>);
  register_kernel(ops::op_mean, fold<Fold::mean>);
  register_kernel(ops::op_max, fold<Fold::max>);
  register_kernel(ops::op_argmax, argmax);
  register_kernel(ops::op_squared_norm, squared_norm);
}

}  // namespace NABLA_GPU
}  // namespace nabla
