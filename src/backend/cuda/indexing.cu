// The indexing ops on the GPU: rows picked, written or accumulated by i32
// indices in row-major order of the index tensor. Duplicate indices are
// resolved without float atomics, so results are the same run to run:
// set_rows lets the last position win (an integer max picks it), and
// scatter_add_rows sums each row's values in position order (a counting
// sort lists each row's positions).
#include "backend/cuda/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_add_rows, op_add_slice, op_get_rows, op_one_hot, op_scatter_add_rows, op_scatter_slice,
    op_set_rows;
}  // namespace ops

namespace NABLA_GPU {
namespace {

// Index p of idx, checked against [0, rows) (an error record otherwise;
// the kernel then reads row 0).
__device__ __forceinline__ int64_t row_at(const View& idx, int64_t p, int64_t rows, DeviceError* e, const char* op) {
  const int64_t r = static_cast<const int32_t*>(idx.data)[offset_of(idx, p)];
  if (r < 0 || r >= rows) {
    report(e, op, kIndexOutOfRange, p, r, rows);
    return 0;
  }
  return r;
}

// The element offset of (row, element e of the rest) in v ([R, *rest]).
__device__ __forceinline__ int64_t row_offset(const View& v, int64_t row, int64_t e) {
  int64_t at = row * v.strides[0];
  for (int d = v.rank - 1; d >= 1; --d) {
    at += (e % v.shape[d]) * v.strides[d];
    e /= v.shape[d];
  }
  return at;
}

// table [R, *rest], indices [*I] -> out [*I, *rest].
template <class T>
__global__ void get_rows_kernel(int64_t n, int64_t width, View table, View idx, T* out, DeviceError* e,
                                const char* op) {
  NABLA_GRID_STRIDE(i, n) {
    const int64_t r = row_at(idx, i / width, table.shape[0], e, op);
    out[i] = static_cast<const T*>(table.data)[row_offset(table, r, i % width)];
  }
}

int64_t width_of(const Shape& s) {
  int64_t w = 1;
  for (size_t d = 1; d < s.size(); ++d) w *= s[d];
  return w;
}

void get_rows(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  const int64_t width = width_of(a.in[0].shape);
  dispatch_any(a.out.dtype, [&]<class T>() {
    launch(ctx, elementwise_launch(n), get_rows_kernel<T>, n, width, make_view(a.in[0]), make_view(a.in[1]),
           a.out.ptr<T>(), ctx.error, ctx.op);
  });
}

// The last position of each row among the indices (-1: none).
__global__ void last_position_kernel(int64_t n, View idx, int64_t rows, int* last, DeviceError* e, const char* op) {
  NABLA_GRID_STRIDE(p, n) atomic_max(&last[row_at(idx, p, rows, e, op)], int(p));
}
__global__ void fill_int_kernel(int64_t n, int* out, int value) {
  NABLA_GRID_STRIDE(i, n) out[i] = value;
}

// out [R, *rest] (dst copied in), values [*I, *rest]: the rows whose last
// position is p take values[p].
template <class T>
__global__ void set_rows_kernel(int64_t n, int64_t width, View idx, View values, const int* last, int64_t rows, T* out) {
  NABLA_GRID_STRIDE(i, n) {
    const int64_t p = i / width, e = i % width;
    const int64_t r = static_cast<const int32_t*>(idx.data)[offset_of(idx, p)];
    if (r < 0 || r >= rows || last[r] != p) continue;
    // values' element (p, e): p over the index axes, e over the rest.
    const int64_t ir = idx.rank;
    int64_t at = 0, q = e;
    for (int d = values.rank - 1; d >= ir; --d) {
      at += (q % values.shape[d]) * values.strides[d];
      q /= values.shape[d];
    }
    q = p;
    for (int d = int(ir) - 1; d >= 0; --d) {
      at += (q % values.shape[d]) * values.strides[d];
      q /= values.shape[d];
    }
    out[r * width + e] = static_cast<const T*>(values.data)[at];
  }
}

// base (input 0) copied into the output (a no-op where the output is base's memory).
void copy_base(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0 || a.in[0].data == a.out.data) return;
  copy_view(ctx, make_view(a.in[0]), make_view(a.out), a.out.dtype);
}

void set_rows(const Operands& a, const Context& ctx) {
  const TensorView &dst = a.in[0], &idx = a.in[1], &values = a.in[2];
  const int64_t rows = dst.shape[0], positions = idx.numel(), width = width_of(dst.shape);
  copy_base(a, ctx);
  dispatch_any(a.out.dtype, [&]<class T>() {
    if (positions == 0 || rows == 0) return;
    int* last = static_cast<int*>(scratch(ctx, size_t(rows) * sizeof(int)));
    launch(ctx, elementwise_launch(rows), fill_int_kernel, rows, last, -1);
    launch(ctx, elementwise_launch(positions), last_position_kernel, positions, make_view(idx), rows, last, ctx.error,
           ctx.op);
    if (width > 0) {
      launch(ctx, elementwise_launch(positions * width), set_rows_kernel<T>, positions * width, width, make_view(idx),
             make_view(values), static_cast<const int*>(last), rows, a.out.ptr<T>());
    }
  });
}

// scatter_add_rows: values [*I, *rest], indices [*I] -> [R, *rest]. Each
// row's positions are listed (a counting sort: integer atomics, exact), put
// in position order, and summed in that order: the same sums every run, and
// work in proportion to the positions, not rows x positions.
// count[r]: how many positions add to row r.
__global__ void count_rows_kernel(int64_t n, View idx, int64_t rows, int* count, DeviceError* e, const char* op) {
  NABLA_GRID_STRIDE(p, n) atomic_add(&count[row_at(idx, p, rows, e, op)], 1);
}

// start[r] = count[0] + ... + count[r - 1]: one block, kScanThreads rows at a
// time, each chunk scanned in shared memory (Hillis-Steele).
constexpr unsigned kScanThreads = 256;
__global__ void exclusive_scan_kernel(int64_t n, const int* count, int* start) {
  NABLA_SHARED int buf[kScanThreads];
  NABLA_SHARED int carry;
  const int t = int(threadIdx.x);
  if (t == 0) carry = 0;
  for (int64_t base = 0; base < n; base += kScanThreads) {
    const int v = base + t < n ? count[base + t] : 0;
    __syncthreads();  // carry written; buf's last reads done
    buf[t] = v;
    __syncthreads();
    for (int d = 1; d < int(kScanThreads); d *= 2) {
      const int y = t >= d ? buf[t - d] : 0;
      __syncthreads();
      buf[t] += y;
      __syncthreads();
    }
    if (base + t < n) start[base + t] = carry + buf[t] - v;
    __syncthreads();
    if (t == int(kScanThreads) - 1) carry += buf[t];
  }
}

// list[start[r] + k], k < count[r]: row r's positions, in no set order.
__global__ void list_rows_kernel(int64_t n, View idx, int64_t rows, const int* start, int* cursor, int* list) {
  NABLA_GRID_STRIDE(p, n) {
    const int64_t r = static_cast<const int32_t*>(idx.data)[offset_of(idx, p)];
    if (r < 0 || r >= rows) continue;  // reported by count_rows_kernel
    list[start[r] + atomic_add(&cursor[r], 1)] = int(p);
  }
}

// One block per output row: rows no index names keep their values (or are
// zeros); the others put their positions in order (each one's rank: the
// positions below it) and sum their values in that order, threads across
// the row.
template <class T>
__global__ void add_rows_kernel(int64_t rows, int64_t width, View idx, View values, const int* count, const int* start,
                                const int* list, int* ordered, T* out, bool accumulate) {
  const int64_t r = block_row();
  if (r >= rows) return;
  T* row = out + r * width;
  const int c = count[r];
  if (c == 0) {
    if (!accumulate) {
      for (int64_t e = threadIdx.x; e < width; e += blockDim.x) row[e] = T(0);
    }
    return;
  }
  const int* mine = list + start[r];
  int* sorted = ordered + start[r];
  for (int j = int(threadIdx.x); j < c; j += int(blockDim.x)) {
    const int p = mine[j];
    int rank = 0;
    for (int k = 0; k < c; ++k) rank += mine[k] < p;
    sorted[rank] = p;
  }
  __syncthreads();
  const T* vp = static_cast<const T*>(values.data);
  const int ir = idx.rank;
  for (int64_t e = threadIdx.x; e < width; e += blockDim.x) {
    // values' offset of element e within a position's row.
    int64_t inner = 0;
    for (int64_t d = values.rank - 1, q = e; d >= ir; --d) {
      inner += (q % values.shape[d]) * values.strides[d];
      q /= values.shape[d];
    }
    T acc = accumulate ? row[e] : T(0);
    for (int k = 0; k < c; ++k) {
      int64_t outer = 0;
      for (int64_t d = ir - 1, q = sorted[k]; d >= 0; --d) {
        outer += (q % values.shape[d]) * values.strides[d];
        q /= values.shape[d];
      }
      acc += vp[outer + inner];
    }
    row[e] = acc;
  }
}

template <class T>
void add_rows_to(const Context& ctx, const TensorView& values, const TensorView& idx, T* out, int64_t rows,
                 int64_t width, bool accumulate) {
  const int64_t positions = idx.numel();
  if (rows == 0) return;
  if (positions > INT32_MAX) throw ShapeError(std::string(ctx.op) + ": more than 2^31 - 1 indices");
  int* count = static_cast<int*>(scratch(ctx, size_t(rows) * sizeof(int)));
  int* start = static_cast<int*>(scratch(ctx, size_t(rows) * sizeof(int)));
  int* cursor = static_cast<int*>(scratch(ctx, size_t(rows) * sizeof(int)));
  const size_t listed = size_t(positions > 0 ? positions : 1) * sizeof(int);
  int* list = static_cast<int*>(scratch(ctx, listed));
  int* ordered = static_cast<int*>(scratch(ctx, listed));
  launch(ctx, elementwise_launch(rows), fill_int_kernel, rows, count, 0);
  if (positions > 0) {
    launch(ctx, elementwise_launch(rows), fill_int_kernel, rows, cursor, 0);
    launch(ctx, elementwise_launch(positions), count_rows_kernel, positions, make_view(idx), rows, count, ctx.error,
           ctx.op);
    launch(ctx, Launch{dim3(1), dim3(kScanThreads), 0, true}, exclusive_scan_kernel, rows,
           static_cast<const int*>(count), start);
    launch(ctx, elementwise_launch(positions), list_rows_kernel, positions, make_view(idx), rows,
           static_cast<const int*>(start), cursor, list);
  }
  if (width == 0) return;
  launch(ctx, rows_launch(rows, 128), add_rows_kernel<T>, rows, width, make_view(idx), make_view(values),
         static_cast<const int*>(count), static_cast<const int*>(start), static_cast<const int*>(list), ordered, out,
         accumulate);
}

void scatter_add_rows(const Operands& a, const Context& ctx) {
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    add_rows_to(ctx, a.in[0], a.in[1], a.out.ptr<T>(), a.out.shape[0], width_of(a.out.shape), false);
  });
}

// attrs.ints = {axis, start, stop, step, full shape...}: zeros of the full
// shape with x at start, start + step, ... of the axis.
void scatter_slice(const Operands& a, const Context& ctx) {
  const TensorView& x = a.in[0];
  fill(ctx, a.out, 0.0);
  const int64_t n = x.numel();
  if (n == 0) return;
  const size_t axis = size_t(a.attrs->ints[0]);
  const int64_t start = a.attrs->ints[1], step = a.attrs->ints[3];
  const Strides os = contiguous_strides(a.out.shape);
  View to = make_view(x);
  to.data = static_cast<char*>(a.out.data) + start * os[axis] * int64_t(dtype_size(a.out.dtype));
  for (size_t d = 0; d < os.size(); ++d) to.strides[d] = os[d] * (d == axis ? step : 1);
  copy_view(ctx, make_view(x), to, a.out.dtype);
}

// add_rows(base, values, indices): base with values added at the rows.
void add_rows_op(const Operands& a, const Context& ctx) {
  copy_base(a, ctx);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    add_rows_to(ctx, a.in[1], a.in[2], a.out.ptr<T>(), a.out.shape[0], width_of(a.out.shape), true);
  });
}

// add_slice(base, x), attrs.ints = {axis, start, stop, step}: base with x
// added at start, start + step, ... of the axis.
template <class T>
__global__ void add_at_kernel(int64_t n, View x, T* out, View to) {
  NABLA_GRID_STRIDE(i, n) out[offset_of(to, i)] += static_cast<const T*>(x.data)[offset_of(x, i)];
}

void add_slice(const Operands& a, const Context& ctx) {
  copy_base(a, ctx);
  const TensorView& x = a.in[1];
  const int64_t n = x.numel();
  if (n == 0) return;
  const size_t axis = size_t(a.attrs->ints[0]);
  const int64_t start = a.attrs->ints[1], step = a.attrs->ints[3];
  const Strides os = contiguous_strides(a.out.shape);
  View to = make_view(x);
  for (size_t d = 0; d < os.size(); ++d) to.strides[d] = os[d] * (d == axis ? step : 1);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), add_at_kernel<T>, n, make_view(x), a.out.ptr<T>() + start * os[axis], to);
  });
}

// indices [*I] -> [*I, classes]: 1 at the index, 0 elsewhere (an index
// outside [0, classes) gives a row of zeros).
template <class T>
__global__ void one_hot_kernel(int64_t n, int64_t classes, View idx, T* out) {
  NABLA_GRID_STRIDE(i, n) {
    const int64_t v = static_cast<const int32_t*>(idx.data)[offset_of(idx, i / classes)];
    out[i] = T(i % classes == v ? 1 : 0);
  }
}

void one_hot(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  dispatch_any(a.out.dtype, [&]<class T>() {
    launch(ctx, elementwise_launch(n), one_hot_kernel<T>, n, a.out.shape.back(), make_view(a.in[0]), a.out.ptr<T>());
  });
}

}  // namespace

void add_rows(const Context& ctx, const TensorView& values, const TensorView& indices, float* out, int64_t rows,
              int64_t width, bool accumulate) {
  add_rows_to(ctx, values, indices, out, rows, width, accumulate);
}

void register_indexing_kernels() {
  register_kernel(ops::op_get_rows, get_rows);
  register_kernel(ops::op_set_rows, set_rows);
  register_kernel(ops::op_scatter_add_rows, scatter_add_rows);
  register_kernel(ops::op_scatter_slice, scatter_slice);
  register_kernel(ops::op_one_hot, one_hot);
  register_kernel(ops::op_add_rows, add_rows_op);
  register_kernel(ops::op_add_slice, add_slice);
}

}  // namespace NABLA_GPU
}  // namespace nabla
