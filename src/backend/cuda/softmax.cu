// softmax and its relatives on the GPU (definitions in src/ops/softmax.cpp,
// softmax_back.cpp, log_softmax.cpp, cross_entropy*.cpp): one block per row
// of the last axis, max and sum by block reductions. A row whose every
// position is hidden gives NaN, as the composite does.
#include "backend/cuda/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_cross_entropy, op_cross_entropy_back, op_cross_entropy_soft, op_log_softmax, op_softmax, op_softmax_back;
}  // namespace ops

namespace NABLA_GPU {
namespace {

// softmax(scale x + mask) over the last axis; causal hides key j > i +
// (Tk - Tq) of query row i (the row's index along the second-to-last axis).
template <class T>
__global__ void softmax_kernel(Rows x, Rows mask, T scale, bool causal, int64_t Tq, T* y) {
  const int64_t r = block_row();
  if (r >= x.count) return;
  const T* xr = row_ptr<T>(x, r);
  const T* mr = row_ptr<T>(mask, r);
  const int64_t visible = causal ? r % Tq + 1 + (x.len - Tq) : x.len;
  const auto z = [&](int64_t j) { return j < visible ? scale * xr[j * x.stride] + mr[j * mask.stride] : -T(INFINITY); };
  const T lowest = -T(INFINITY);
  T m = lowest;
  for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) {
    const T v = z(j);
    m = v > m || gpu_math::isnan(double(v)) ? v : m;
  }
  m = block_max(m, lowest);
  T s = T(0);
  for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) s += gpu_math::exp(z(j) - m);
  s = block_sum(s);
  T* yr = y + r * x.len;
  for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) yr[j] = gpu_math::exp(z(j) - m) / s;
}

void softmax(const Operands& a, const Context& ctx) {
  const Rows x = rows_of(a.in[0]);
  if (x.count == 0 || x.len == 0) return;
  TensorView mask = a.in[1];
  const Shape& shape = a.in[0].shape;
  // The mask broadcast to x's shape, as rows like x's.
  View mv = broadcast_view(mask, shape);
  TensorView m{mask.data, mask.dtype, shape, Strides(mv.strides, mv.strides + mv.rank), false};
  const bool causal = a.attrs->ints[0] != 0;
  const int64_t Tq = shape.size() >= 2 ? shape[shape.size() - 2] : 1;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, rows_launch(x.count, row_threads(x.len)), softmax_kernel<T>, x, rows_of(m), T(a.attrs->reals[0]), causal,
           Tq, a.out.ptr<T>());
  });
}

// dx = scale y (dy - sum(dy y)).
template <class T>
__global__ void softmax_back_kernel(Rows y, Rows dy, T scale, T* dx) {
  const int64_t r = block_row();
  if (r >= y.count) return;
  const T* yr = row_ptr<T>(y, r);
  const T* dr = row_ptr<T>(dy, r);
  T s = T(0);
  for (int64_t j = threadIdx.x; j < y.len; j += blockDim.x) s += dr[j * dy.stride] * yr[j * y.stride];
  s = block_sum(s);
  T* out = dx + r * y.len;
  for (int64_t j = threadIdx.x; j < y.len; j += blockDim.x) out[j] = scale * yr[j * y.stride] * (dr[j * dy.stride] - s);
}

void softmax_back(const Operands& a, const Context& ctx) {
  const Rows y = rows_of(a.in[0]);
  if (y.count == 0 || y.len == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, rows_launch(y.count, row_threads(y.len)), softmax_back_kernel<T>, y, rows_of(a.in[1]),
           T(a.attrs->reals[0]), a.out.ptr<T>());
  });
}

// A row's max and log(sum(exp(x - max))).
template <class T>
__device__ void log_sum_exp(const T* x, int64_t xs, int64_t len, T* max, T* log_sum) {
  const T lowest = -T(INFINITY);
  T m = lowest;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const T v = x[j * xs];
    m = v > m || gpu_math::isnan(double(v)) ? v : m;
  }
  m = block_max(m, lowest);
  T s = T(0);
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) s += gpu_math::exp(x[j * xs] - m);
  *max = m;
  *log_sum = gpu_math::log(block_sum(s));
}

// (x - max) - log(sum(exp(x - max))).
template <class T>
__global__ void log_softmax_kernel(Rows x, T* y) {
  const int64_t r = block_row();
  if (r >= x.count) return;
  const T* xr = row_ptr<T>(x, r);
  T m, ls;
  log_sum_exp(xr, x.stride, x.len, &m, &ls);
  T* yr = y + r * x.len;
  for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) yr[j] = (xr[j * x.stride] - m) - ls;
}

void log_softmax(const Operands& a, const Context& ctx) {
  const Rows x = rows_of(a.in[0]);
  if (x.count == 0 || x.len == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, rows_launch(x.count, row_threads(x.len)), log_softmax_kernel<T>, x, a.out.ptr<T>());
  });
}

// cross_entropy: each row's -log softmax(x)[label] (0 on ignored rows) and
// whether it counts, then one block sums them.
__device__ __forceinline__ int32_t label_at(const View& labels, int64_t r, int64_t classes, int64_t ignore,
                                           DeviceError* e, const char* op) {
  const int32_t l = static_cast<const int32_t*>(labels.data)[offset_of(labels, r)];
  if (l != ignore && (l < 0 || l >= classes)) report(e, op, kLabelOutOfRange, r, l, classes, ignore);
  return l;
}

template <class T>
__global__ void row_losses_kernel(Rows x, View labels, int64_t ignore, double* loss, int* counted, DeviceError* e,
                                  const char* op) {
  const int64_t r = block_row();
  if (r >= x.count) return;
  const int32_t l = label_at(labels, r, x.len, ignore, e, op);
  const bool valid = l != ignore && l >= 0 && l < x.len;
  if (!valid) {
    if (threadIdx.x == 0) {
      loss[r] = 0;
      counted[r] = 0;
    }
    return;
  }
  const T* xr = row_ptr<T>(x, r);
  T m, ls;
  log_sum_exp(xr, x.stride, x.len, &m, &ls);
  if (threadIdx.x == 0) {
    loss[r] = double(ls) - (double(xr[l * x.stride]) - double(m));
    counted[r] = 1;
  }
}

// out = sum(loss) / count (0 when nothing counts), one block.
template <class T>
__global__ void mean_loss_kernel(const double* loss, const int* counted, int64_t rows, T* out) {
  double s = 0, c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    s += loss[r];
    c += counted[r];
  }
  s = block_sum(s);
  c = block_sum(c);
  if (threadIdx.x == 0) out[0] = T(c > 0 ? s / c : 0.0);
}

void cross_entropy(const Operands& a, const Context& ctx) {
  const Rows x = rows_of(a.in[0]);
  const int64_t ignore = a.attrs->ints[0];
  double* loss = static_cast<double*>(scratch(ctx, size_t(x.count > 0 ? x.count : 1) * sizeof(double)));
  int* counted = static_cast<int*>(scratch(ctx, size_t(x.count > 0 ? x.count : 1) * sizeof(int)));
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    if (x.count > 0) {
      launch(ctx, rows_launch(x.count, row_threads(x.len)), row_losses_kernel<T>, x, make_view(a.in[1]), ignore, loss,
             counted, ctx.error, ctx.op);
    }
    launch(ctx, Launch{dim3(1), dim3(1024), 0, true}, mean_loss_kernel<T>, static_cast<const double*>(loss),
           static_cast<const int*>(counted), x.count, a.out.ptr<T>());
  });
}

// cross_entropy_soft: the mean over rows of sum p (lse - (x - max)).
template <class T>
__global__ void soft_losses_kernel(Rows x, Rows p, double* loss, int* counted) {
  const int64_t r = block_row();
  if (r >= x.count) return;
  const T* xr = row_ptr<T>(x, r);
  const T* pr = row_ptr<T>(p, r);
  T m, ls;
  log_sum_exp(xr, x.stride, x.len, &m, &ls);
  double acc = 0;
  for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) {
    acc += double(pr[j * p.stride]) * (double(ls) - (double(xr[j * x.stride]) - double(m)));
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    loss[r] = acc;
    counted[r] = 1;
  }
}

void cross_entropy_soft(const Operands& a, const Context& ctx) {
  const Rows x = rows_of(a.in[0]);
  double* loss = static_cast<double*>(scratch(ctx, size_t(x.count > 0 ? x.count : 1) * sizeof(double)));
  int* counted = static_cast<int*>(scratch(ctx, size_t(x.count > 0 ? x.count : 1) * sizeof(int)));
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    if (x.count > 0) {
      launch(ctx, rows_launch(x.count, row_threads(x.len)), soft_losses_kernel<T>, x, rows_of(a.in[1]), loss, counted);
    }
    launch(ctx, Launch{dim3(1), dim3(1024), 0, true}, mean_loss_kernel<T>, static_cast<const double*>(loss),
           static_cast<const int*>(counted), x.count, a.out.ptr<T>());
  });
}

// The number of rows that count, into *count.
__global__ void count_rows_kernel(View labels, int64_t rows, int64_t ignore, int* count) {
  int c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    c += static_cast<const int32_t*>(labels.data)[offset_of(labels, r)] != ignore;
  }
  c = block_sum(c);
  if (threadIdx.x == 0) *count = c;
}

// dlogits = (softmax(x) - onehot(label)) dloss / count on counted rows, 0 on
// ignored ones.
template <class T>
__global__ void cross_entropy_back_kernel(Rows x, View labels, int64_t ignore, View dloss, const int* count, T* dx,
                                          DeviceError* e, const char* op) {
  const int64_t r = block_row();
  if (r >= x.count) return;
  T* out = dx + r * x.len;
  const int32_t l = label_at(labels, r, x.len, ignore, e, op);
  if (l == ignore || *count == 0) {
    for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) out[j] = T(0);
    return;
  }
  const T* xr = row_ptr<T>(x, r);
  T m, ls;
  log_sum_exp(xr, x.stride, x.len, &m, &ls);
  const T g = load<T>(dloss, 0) / T(*count);
  for (int64_t j = threadIdx.x; j < x.len; j += blockDim.x) {
    const T p = gpu_math::exp(xr[j * x.stride] - m - ls);
    out[j] = (p - (j == l ? T(1) : T(0))) * g;
  }
}

void cross_entropy_back(const Operands& a, const Context& ctx) {
  const Rows x = rows_of(a.in[0]);
  if (x.count == 0 || x.len == 0) return;
  const int64_t ignore = a.attrs->ints[0];
  int* count = static_cast<int*>(scratch(ctx, sizeof(int)));
  launch(ctx, Launch{dim3(1), dim3(1024), 0, true}, count_rows_kernel, make_view(a.in[1]), x.count, ignore, count);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, rows_launch(x.count, row_threads(x.len)), cross_entropy_back_kernel<T>, x, make_view(a.in[1]), ignore,
           make_view(a.in[2]), static_cast<const int*>(count), a.out.ptr<T>(), ctx.error, ctx.op);
  });
}

}  // namespace

void register_softmax_kernels() {
  register_kernel(ops::op_softmax, softmax);
  register_kernel(ops::op_softmax_back, softmax_back);
  register_kernel(ops::op_log_softmax, log_softmax);
  register_kernel(ops::op_cross_entropy, cross_entropy);
  register_kernel(ops::op_cross_entropy_back, cross_entropy_back);
  register_kernel(ops::op_cross_entropy_soft, cross_entropy_soft);
}

}  // namespace NABLA_GPU
}  // namespace nabla
