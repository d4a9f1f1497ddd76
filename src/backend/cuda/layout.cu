// The layout ops on the GPU: each output element copied from the one input
// element it reads (or a constant), one thread per element.
#include "backend/cuda/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_concat, op_contiguous, op_pad, op_repeat;
}  // namespace ops

namespace NABLA_GPU {
namespace {


template <class T>
__global__ void copy_kernel(int64_t n, View from, View to) {
  NABLA_GRID_STRIDE(i, n) static_cast<T*>(to.data)[offset_of(to, i)] = static_cast<const T*>(from.data)[offset_of(from, i)];
}

template <class T>
__global__ void fill_kernel(int64_t n, T* out, T value) {
  NABLA_GRID_STRIDE(i, n) out[i] = value;
}

// `x` copied into the contiguous output at element offset `base`, along
// the output's strides.
void place(const Context& ctx, const TensorView& x, const TensorView& out, int64_t base) {
  const int64_t n = x.numel();
  if (n == 0) return;
  View to = make_view(x);
  to.data = static_cast<char*>(out.data) + base * int64_t(dtype_size(out.dtype));
  const Strides os = contiguous_strides(out.shape);
  for (size_t d = 0; d < x.shape.size(); ++d) to.strides[d] = os[d];
  copy_view(ctx, make_view(x), to, out.dtype);
}

void contiguous(const Operands& a, const Context& ctx) { place(ctx, a.in[0], a.out, 0); }

// attrs.ints = {axis}: input k fills the band of the axis after inputs 0..k-1.
void concat(const Operands& a, const Context& ctx) {
  const size_t axis = size_t(a.attrs->ints[0]);
  const int64_t step = contiguous_strides(a.out.shape)[axis];
  int64_t start = 0;
  for (const TensorView& x : a.in) {
    place(ctx, x, a.out, start * step);
    start += x.shape[axis];
  }
}

// attrs.ints = {before0, after0, before1, ...}, reals = {value}.
void pad(const Operands& a, const Context& ctx) {
  fill(ctx, a.out, a.attrs->reals[0]);
  const Strides os = contiguous_strides(a.out.shape);
  int64_t base = 0;
  for (size_t d = 0; d < os.size(); ++d) base += a.attrs->ints[2 * d] * os[d];
  place(ctx, a.in[0], a.out, base);
}

// out[o] = x[o mod x.shape], x's axes aligned to the right.
template <class T>
__global__ void repeat_kernel(int64_t n, View x, View out_shape, T* out) {
  NABLA_GRID_STRIDE(i, n) {
    int64_t rest = i, at = 0;
    for (int d = out_shape.rank - 1, k = x.rank - 1; d >= 0; --d, --k) {
      const int64_t o = rest % out_shape.shape[d];
      rest /= out_shape.shape[d];
      if (k >= 0) at += (o % x.shape[k]) * x.strides[k];
    }
    out[i] = static_cast<const T*>(x.data)[at];
  }
}

void repeat(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  dispatch_any(a.out.dtype, [&]<class T>() {
    launch(ctx, elementwise_launch(n), repeat_kernel<T>, n, make_view(a.in[0]), make_view(a.out), a.out.ptr<T>());
  });
}

}  // namespace

void copy_view(const Context& ctx, View from, View to, DType dtype) {
  int64_t n = 1;
  for (int d = 0; d < from.rank; ++d) n *= from.shape[d];
  if (n == 0) return;
  View* views[] = {&from, &to};
  coalesce(views, 2);
  dispatch_any(dtype, [&]<class T>() { launch(ctx, elementwise_launch(n), copy_kernel<T>, n, from, to); });
}

void fill(const Context& ctx, const TensorView& out, double value) {
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_any(out.dtype, [&]<class T>() { launch(ctx, elementwise_launch(n), fill_kernel<T>, n, out.ptr<T>(), T(value)); });
}

void register_layout_kernels() {
  register_kernel(ops::op_concat, concat);
  register_kernel(ops::op_contiguous, contiguous);
  register_kernel(ops::op_pad, pad);
  register_kernel(ops::op_repeat, repeat);
}

}  // namespace NABLA_GPU
}  // namespace nabla
