// The normalisations on the GPU (definitions in src/ops/layer_norm*.cpp and
// rms_norm*.cpp): one block per row, its statistics by block reductions,
// then the row written; x and dy may have any strides. The affine
// backward's dgamma and dbeta are column sums taken in two deterministic
// passes (chunks of rows, then the chunks in order).
#include "backend/cuda/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_layer_norm, op_layer_norm_back, op_layer_norm_affine, op_layer_norm_affine_back,
    op_layer_norm_affine_back_add, op_rms_norm, op_rms_norm_back;
}  // namespace ops

namespace NABLA_GPU {
namespace {

// A row's mean and 1 / sqrt(var + eps) (var biased, by two passes); with
// `rms`, 0 and 1 / sqrt(mean(x^2) + eps).
template <class T>
__device__ void row_stats(const T* x, int64_t xs, int64_t C, T eps, bool rms, T* mean, T* rstd) {
  T m = T(0);
  if (!rms) {
    T s = T(0);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += x[j * xs];
    m = block_sum(s) / T(C);
  }
  T q = T(0);
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    const T d = x[j * xs] - m;
    q += d * d;
  }
  *mean = m;
  *rstd = T(1) / gpu_math::sqrt(block_sum(q) / T(C) + eps);
}

// y = (x - mean) rstd (* gamma + beta); rms: y = x rstd.
template <class T>
__global__ void norm_kernel(Rows x, const T* gamma, View gv, const T* beta, View bv, T eps, bool rms, T* y) {
  const int64_t r = block_row();
  if (r >= x.count) return;
  const T* xr = row_ptr<T>(x, r);
  T mean, rstd;
  row_stats(xr, x.stride, x.len, eps, rms, &mean, &rstd);
  T* yr = y + r * x.len;
  for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) {
    T v = (xr[j * x.stride] - mean) * rstd;
    if (gamma) v = v * gamma[j * gv.strides[0]] + beta[j * bv.strides[0]];
    yr[j] = v;
  }
}

void norm(const Operands& a, const Context& ctx, bool affine, bool rms) {
  const Rows x = rows_of(a.in[0]);
  if (x.count == 0 || x.len == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    const View gv = affine ? make_view(a.in[1]) : View{}, bv = affine ? make_view(a.in[2]) : View{};
    launch(ctx, rows_launch(x.count, row_threads(x.len)), norm_kernel<T>, x,
           affine ? static_cast<const T*>(a.in[1].data) : static_cast<const T*>(nullptr), gv,
           affine ? static_cast<const T*>(a.in[2].data) : static_cast<const T*>(nullptr), bv, T(a.attrs->reals[0]), rms,
           a.out.ptr<T>());
  });
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy (* gamma), xhat =
// (x - mean) rstd; rms: dx = rstd (g - xhat mean(g xhat)), xhat = x rstd.
// Plus the addend where there is one.
template <class T>
__global__ void norm_back_kernel(Rows x, Rows dy, const T* gamma, View gv, Rows addend, bool add, T eps, bool rms,
                                 T* dx) {
  const int64_t r = block_row();
  if (r >= x.count) return;
  const T* xr = row_ptr<T>(x, r);
  const T* dr = row_ptr<T>(dy, r);
  T mean, rstd;
  row_stats(xr, x.stride, x.len, eps, rms, &mean, &rstd);
  T sg = T(0), sgx = T(0);
  for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) {
    const T g = dr[j * dy.stride] * (gamma ? gamma[j * gv.strides[0]] : T(1));
    sg += g;
    sgx += g * (xr[j * x.stride] - mean) * rstd;
  }
  const T mg = rms ? T(0) : block_sum(sg) / T(x.len);
  const T mgx = block_sum(sgx) / T(x.len);
  T* out = dx + r * x.len;
  const T* ar = add ? row_ptr<T>(addend, r) : nullptr;
  for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) {
    const T g = dr[j * dy.stride] * (gamma ? gamma[j * gv.strides[0]] : T(1));
    const T xhat = (xr[j * x.stride] - mean) * rstd;
    T v = rstd * (g - mg - xhat * mgx);
    if (add) v = ar[j * addend.stride] + v;
    out[j] = v;
  }
}

// Column sums of dy xhat and dy over rows [chunk * rows_per, ...): partial
// [chunks, 2, C].
constexpr int64_t kRowsPerChunk = 64;

template <class T>
__global__ void column_partials_kernel(Rows x, Rows dy, T eps, T* partial) {
  const int64_t chunk = block_row();
  if (chunk * kRowsPerChunk >= x.count) return;
  const int64_t first = chunk * kRowsPerChunk, last = first + kRowsPerChunk < x.count ? first + kRowsPerChunk : x.count;
  NABLA_SHARED T stats[2 * kRowsPerChunk];
  // Each row's statistics, one row at a time by the whole block.
  for (int64_t r = first; r < last; ++r) {
    T mean, rstd;
    row_stats(row_ptr<T>(x, r), x.stride, x.len, eps, false, &mean, &rstd);
    if (threadIdx.x == 0) {
      stats[2 * (r - first)] = mean;
      stats[2 * (r - first) + 1] = rstd;
    }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) {
    T sgx = T(0), sg = T(0);
    for (int64_t r = first; r < last; ++r) {
      const T d = row_ptr<T>(dy, r)[j * dy.stride];
      sgx += d * (row_ptr<T>(x, r)[j * x.stride] - stats[2 * (r - first)]) * stats[2 * (r - first) + 1];
      sg += d;
    }
    partial[(chunk * 2) * x.len + j] = sgx;
    partial[(chunk * 2 + 1) * x.len + j] = sg;
  }
}

template <class T>
__global__ void column_sums_kernel(const T* partial, int64_t chunks, int64_t C, T* dgamma, T* dbeta) {
  NABLA_GRID_STRIDE(j, C) {
    T sgx = T(0), sg = T(0);
    for (int64_t c = 0; c < chunks; ++c) {
      sgx += partial[(c * 2) * C + j];
      sg += partial[(c * 2 + 1) * C + j];
    }
    dgamma[j] = sgx;
    dbeta[j] = sg;
  }
}

void norm_back(const Operands& a, const Context& ctx, bool rms) {
  const Rows x = rows_of(a.in[0]), dy = rows_of(a.in[1]);
  if (x.count == 0 || x.len == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, rows_launch(x.count, row_threads(x.len)), norm_back_kernel<T>, x, dy, static_cast<const T*>(nullptr),
           View{}, Rows{}, false, T(a.attrs->reals[0]), rms, a.out.ptr<T>());
  });
}

// layer_norm_affine_back(_add): flat [dx, dgamma [C], dbeta [C]].
void affine_back(const Operands& a, const Context& ctx) {
  const Rows x = rows_of(a.in[0]), dy = rows_of(a.in[1]);
  const bool add = a.in.size() > 3;
  const int64_t C = x.len, n = x.count * C;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    T* dx = a.out.ptr<T>();
    const T eps = T(a.attrs->reals[0]);
    if (C == 0) return;
    if (x.count == 0) return fill(ctx, a.out, 0.0);
    launch(ctx, rows_launch(x.count, row_threads(C)), norm_back_kernel<T>, x, dy, static_cast<const T*>(a.in[2].data),
           make_view(a.in[2]), add ? rows_of(a.in[3]) : Rows{}, add, eps, false, dx);
    const int64_t chunks = (x.count + kRowsPerChunk - 1) / kRowsPerChunk;
    T* partial = static_cast<T*>(scratch(ctx, size_t(chunks * 2 * C) * sizeof(T)));
    launch(ctx, rows_launch(chunks, row_threads(C)), column_partials_kernel<T>, x, dy, eps, partial);
    launch(ctx, elementwise_launch(C), column_sums_kernel<T>, static_cast<const T*>(partial), chunks, C, dx + n,
           dx + n + C);
  });
}

}  // namespace

void register_norm_kernels() {
  register_kernel(ops::op_layer_norm, [](const Operands& a, const Context& ctx) { norm(a, ctx, false, false); });
  register_kernel(ops::op_layer_norm_affine, [](const Operands& a, const Context& ctx) { norm(a, ctx, true, false); });
  register_kernel(ops::op_rms_norm, [](const Operands& a, const Context& ctx) { norm(a, ctx, false, true); });
  register_kernel(ops::op_layer_norm_back, [](const Operands& a, const Context& ctx) { norm_back(a, ctx, false); });
  register_kernel(ops::op_rms_norm_back, [](const Operands& a, const Context& ctx) { norm_back(a, ctx, true); });
  register_kernel(ops::op_layer_norm_affine_back, affine_back);
  register_kernel(ops::op_layer_norm_affine_back_add, affine_back);
}

}  // namespace NABLA_GPU
}  // namespace nabla
