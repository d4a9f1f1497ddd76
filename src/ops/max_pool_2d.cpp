// max_pool_2d: the maximum of each window; padding never wins (PyTorch's
// MaxPool2d). Legend in ops/conv.h.
//   x [N, C, H, W] -> y [N, C, OH, OW], OH = (H + 2*PH - KH) / SH + 1
//
// The op reads two inputs of one shape: `x`, the key that picks each window's
// argmax (the first maximum in row-major window order, as in PyTorch), and
// `values`, what is read at that position. max_pool_2d(x) passes x as both.
// The key is not differentiated (the choice is piecewise constant in x); in
// `values` the op is linear, its backward max_pool_2d_back(x, dy), whose
// backward in dy is this op again. The argmax is recomputed from x in both
// directions rather than stored as an index tensor.
#include "backend/cpu/kernel.h"
#include "backend/cpu/thread_pool.h"
#include "ops/conv.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

// attrs.ints = {window (8), dilation 1}
Meta max_pool_2d_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &values = in[1];
  require_floating("max_pool_2d", x, "x");
  require_same_dtype("max_pool_2d", x, values);
  require_nchw("max_pool_2d", x, "x");
  if (values.shape() != x.shape()) {
    throw ShapeError("max_pool_2d: values must have x's shape " + to_string(x.shape()) + ", got " +
                     to_string(values.shape()));
  }
  Window2d v = Window2d::read(attrs.ints);
  check_pool_window("max_pool_2d", v, x.dim(2), x.dim(3));
  return {x.dtype(), {x.dim(0), x.dim(1), v.out_h(x.dim(2)), v.out_w(x.dim(3))}};
}

template <class T>
void max_pool_2d_kernel(const KernelArgs& a) {
  const TensorView &x = a.in[0], &values = a.in[1];
  Window2d v = Window2d::read(a.attrs->ints);
  int64_t C = x.shape[1], H = x.shape[2], W = x.shape[3];
  int64_t OH = a.out.shape[2], OW = a.out.shape[3];
  const Strides &xs = x.strides, &vs = values.strides;
  T* out = a.out.ptr<T>();
  // One task per output row (n, c, oh).
  auto task = [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t p = r / OH, oh = r % OH, n = p / C, c = p % C;
      const T* key = x.ptr<T>() + n * xs[0] + c * xs[1];
      const T* val = values.ptr<T>() + n * vs[0] + c * vs[1];
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t at = window_argmax(key, xs[2], xs[3], H, W, v, oh, ow);
        out[r * OW + ow] = val[(at / W) * vs[2] + (at % W) * vs[3]];
      }
    }
  };
  a.parallel_for(a.out.shape[0] * C * OH,
                 cpu::grain_for(OW * v.kh * v.kw), task);
}

void max_pool_2d_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "max_pool_2d", [&]<class T>() { max_pool_2d_kernel<T>(a); });
}

Grads max_pool_2d_backward(const BackwardArgs& g) {
  Window2d v = Window2d::read(g.attrs.ints);
  return {Tensor(),
          max_pool_2d_back(g.inputs[0], g.dout, {v.kh, v.kw}, {v.sh, v.sw}, {v.ph, v.pw})};
}

// Random normal inputs: no ties within a window, so finite differences do not
// cross a change of argmax.
std::vector<GradCase> max_pool_2d_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"kernel_2x2", {normal({2, 3, 4, 6})}, [](X t) { return max_pool_2d(t[0], 2, 2); }},
      // Overlapping windows: a pixel can be the maximum of several.
      {"overlap_pad",
       {normal({2, 2, 5, 4})},
       [](X t) {
         return max_pool_2d(t[0], {3, 2}, {2, 1}, {1, 1});
       }},
      // Key and values apart: only the values are differentiated.
      {"key_values",
       {constant(normal({2, 2, 4, 5})), normal({2, 2, 4, 5})},
       [](X t) {
         return max_pool_2d_at(t[0], t[1], {2, 3}, {1, 2}, {1, 1});
       }},
  };
}

}  // namespace

extern const OpDef op_max_pool_2d{
    .name = "max_pool_2d",
    .summary =
        "max over KH x KW windows of x [N, C, H, W] (values read at x's first argmax; x not "
        "differentiated)",
    .inputs = {{"x", Diff::no}, {"values", Diff::yes}},
    .infer = max_pool_2d_infer,
    .backward = max_pool_2d_backward,
    .cases = max_pool_2d_cases,
};
NABLA_CPU_KERNEL(op_max_pool_2d, max_pool_2d_forward);

}  // namespace ops

Tensor max_pool_2d_at(const Tensor& x, const Tensor& values, Size2d kernel, Size2d stride,
                      Size2d padding) {
  Attrs attrs;
  ops::Window2d::make(kernel, stride, padding, 1).append_to(attrs.ints);
  return apply(ops::op_max_pool_2d, {x, values}, attrs);
}

Tensor max_pool_2d(const Tensor& x, Size2d kernel, Size2d stride, Size2d padding) {
  return max_pool_2d_at(x, x, kernel, stride, padding);
}

}  // namespace nabla
