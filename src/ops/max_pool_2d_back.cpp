// max_pool_2d_back: the backward of max_pool_2d. Each window's dy goes to the
// window's argmax in x (the first maximum in row-major window order, as in
// PyTorch), recomputed here from x. Legend in ops/conv.h.
//   x [N, C, H, W], dy [N, C, OH, OW] -> dx [N, C, H, W]
//
// x is not differentiated (the argmax is piecewise constant in x). In dy the
// op is linear; its backward reads the incoming gradient at x's argmaxes,
// which is max_pool_2d_at(x, ddx). Overlapping windows can share an argmax, so
// this is a scatter-add: each (n, c) plane is summed by one task in window
// order, and results do not depend on the thread count.
#include "backend/cpu/kernel.h"
#include "backend/cpu/thread_pool.h"
#include "ops/conv.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

// attrs.ints = {window (8), dilation 1}
Meta max_pool_2d_back_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &dy = in[1];
  require_floating("max_pool_2d_back", x, "x");
  require_same_dtype("max_pool_2d_back", x, dy);
  require_nchw("max_pool_2d_back", x, "x");
  Window2d v = Window2d::read(attrs.ints);
  check_pool_window("max_pool_2d_back", v, x.dim(2), x.dim(3));
  Shape expect{x.dim(0), x.dim(1), v.out_h(x.dim(2)), v.out_w(x.dim(3))};
  if (dy.shape() != expect) {
    throw ShapeError("max_pool_2d_back: dy must be " + to_string(expect) + " for x " +
                     to_string(x.shape()) + ", got " + to_string(dy.shape()));
  }
  return {x.dtype(), x.shape()};
}

template <class T>
void max_pool_2d_back_kernel(const KernelArgs& a) {
  const TensorView &x = a.in[0], &dy = a.in[1];
  Window2d v = Window2d::read(a.attrs->ints);
  int64_t C = x.shape[1], H = x.shape[2], W = x.shape[3];
  int64_t OH = dy.shape[2], OW = dy.shape[3];
  const Strides &xs = x.strides, &ds = dy.strides;
  T* out = a.out.ptr<T>();
  auto task = [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      int64_t n = p / C, c = p % C;
      T* plane = out + p * H * W;
      std::fill(plane, plane + H * W, T(0));
      const T* key = x.ptr<T>() + n * xs[0] + c * xs[1];
      const T* dplane = dy.ptr<T>() + n * ds[0] + c * ds[1];
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          plane[window_argmax(key, xs[2], xs[3], H, W, v, oh, ow)] +=
              dplane[oh * ds[2] + ow * ds[3]];
        }
      }
    }
  };
  a.parallel_for(a.out.shape[0] * C,
                 cpu::grain_for(OH * OW * v.kh * v.kw), task);
}

void max_pool_2d_back_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "max_pool_2d_back",
                    [&]<class T>() { max_pool_2d_back_kernel<T>(a); });
}

Grads max_pool_2d_back_backward(const BackwardArgs& g) {
  Window2d v = Window2d::read(g.attrs.ints);
  return {Tensor(), max_pool_2d_at(g.inputs[0], g.dout, {v.kh, v.kw}, {v.sh, v.sw}, {v.ph, v.pw})};
}

std::vector<GradCase> max_pool_2d_back_cases() {
  using X = const std::vector<Tensor>&;
  return {
      // x [2, 3, 4, 6], kernel 2, stride 2: dy 2x3.
      {"kernel_2x2",
       {constant(normal({2, 3, 4, 6})), normal({2, 3, 2, 3})},
       [](X t) { return max_pool_2d_back(t[0], t[1], 2, 2); }},
      // x [2, 2, 5, 4], kernel 3x2, stride 2x1, padding 1: dy 3x5, shared argmaxes.
      {"overlap_pad",
       {constant(normal({2, 2, 5, 4})), normal({2, 2, 3, 5})},
       [](X t) {
         return max_pool_2d_back(t[0], t[1], {3, 2}, {2, 1}, {1, 1});
       }},
  };
}

}  // namespace

extern const OpDef op_max_pool_2d_back{
    .name = "max_pool_2d_back",
    .summary =
        "backward of max_pool_2d: dy [N, C, OH, OW] added at each window's argmax in x -> [N, C, "
        "H, W]",
    .inputs = {{"x", Diff::no}, {"dy", Diff::yes}},
    .infer = max_pool_2d_back_infer,
    .backward = max_pool_2d_back_backward,
    .cases = max_pool_2d_back_cases,
};
NABLA_CPU_KERNEL(op_max_pool_2d_back, max_pool_2d_back_forward);

}  // namespace ops

Tensor max_pool_2d_back(const Tensor& x, const Tensor& dy, Size2d kernel, Size2d stride,
                        Size2d padding) {
  Attrs attrs;
  ops::Window2d::make(kernel, stride, padding, 1).append_to(attrs.ints);
  return apply(ops::op_max_pool_2d_back, {x, dy}, attrs);
}

}  // namespace nabla
