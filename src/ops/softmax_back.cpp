// softmax_back: the gradient of softmax, dx = scale * y * (dy - sum(dy * y))
// over the last axis, from the softmax output y and the incoming gradient dy.
// One pass per row instead of four ops. attrs: reals {scale}.
#include <type_traits>

#include "backend/cpu/kernel.h"
#include "backend/cpu/simd.h"
#include "ops/internal_ops.h"
#include "ops/last_axis.h"

namespace nabla {
namespace ops {
namespace {

Meta softmax_back_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &y = in[0], &dy = in[1];
  require_floating("softmax_back", y, "y");
  require_same_dtype("softmax_back", y, dy);
  if (y.rank() < 1) throw ShapeError("softmax_back: y must have at least 1 axis, got a scalar");
  if (y.shape() != dy.shape()) {
    throw ShapeError("softmax_back: y is " + to_string(y.shape()) + " but dy is " +
                     to_string(dy.shape()));
  }
  return {y.dtype(), y.shape()};
}

template <class T>
void softmax_back_kernel(const KernelArgs& a) {
  const TensorView &y = a.in[0], &dy = a.in[1];
  double scale = a.attrs->reals[0];
  RowWalker<2> rows(a.out.shape, {y.strides, dy.strides});
  int64_t len = rows.len(), ys = rows.inner(0), ds = rows.inner(1);
  const T *yp = y.ptr<T>(), *dp = dy.ptr<T>();
  T* out = a.out.ptr<T>();
  a.parallel_for(rows.rows(), row_grain(len), [&](int64_t b, int64_t e) {
    rows.run(b, e, [&](int64_t r, const std::array<int64_t, 2>& o) {
      const T *yr = yp + o[0], *dr = dp + o[1];
      if constexpr (std::is_same_v<T, float>) {
        return cpu::softmax_back_row(yr, ys, dr, ds, len, float(scale), out + r * len);
      }
      double dot = 0;
      for (int64_t j = 0; j < len; ++j) dot += double(dr[j * ds]) * double(yr[j * ys]);
      T* dx = out + r * len;
      for (int64_t j = 0; j < len; ++j)
        dx[j] = static_cast<T>(scale * double(yr[j * ys]) * (double(dr[j * ds]) - dot));
    });
  });
}

void softmax_back_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "softmax_back", [&]<class T>() { softmax_back_kernel<T>(a); });
}

Tensor softmax_back_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &y = in[0], &dy = in[1];
  return (y * (dy - sum(dy * y, {-1}, true))) * attrs.reals[0];
}

std::vector<GradCase> softmax_back_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"matrix", {normal({3, 5}), normal({3, 5})}, [](X x) { return softmax_back(x[0], x[1]); }},
      {"rank3_scaled",
       {normal({2, 3, 4}), normal({2, 3, 4})},
       [](X x) { return softmax_back(x[0], x[1], 0.6); }},
      // y as softmax produces it, with zeros where a mask hid positions.
      {"from_softmax",
       {normal({2, 3, 3}), normal({2, 3, 3})},
       [](X x) { return softmax_back(softmax(x[0], 1.0, Tensor(), true), x[1], 1.0); }},
  };
}

}  // namespace

// Backward: through the composite (a polynomial in y and dy).
extern const OpDef op_softmax_back{
    .name = "softmax_back",
    .summary = "softmax's gradient: scale * y * (dy - sum(dy * y)) over the last axis",
    .inputs = {{"y", Diff::yes}, {"dy", Diff::yes}},
    .fused = true,
    .infer = softmax_back_infer,
    .composite = softmax_back_composite,
    .cases = softmax_back_cases,
};
NABLA_CPU_KERNEL(op_softmax_back, softmax_back_forward);

}  // namespace ops

Tensor softmax_back(const Tensor& y, const Tensor& dy, double scale) {
  return apply(ops::op_softmax_back, {y, dy}, Attrs{{}, {scale}});
}

}  // namespace nabla
