// where: cond ? a : b, broadcasting all three operands.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

Meta where_infer(const std::vector<Tensor>& in, const Attrs&) {
  require_floating("where", in[1], "a");
  require_same_dtype("where", in[1], in[2]);
  Shape s = broadcast_shapes(in[0].shape(), in[1].shape(), "where");
  return {in[1].dtype(), broadcast_shapes(s, in[2].shape(), "where")};
}

template <class T, class C>
void where_kernel(const KernelArgs& a) {
  const TensorView &c = a.in[0], &x = a.in[1], &y = a.in[2];
  Strides os = contiguous_strides(a.out.shape);
  Strides cs = cpu::broadcast_strides(c.shape, c.strides, a.out.shape);
  Strides xs = cpu::broadcast_strides(x.shape, x.strides, a.out.shape);
  Strides ys = cpu::broadcast_strides(y.shape, y.strides, a.out.shape);
  cpu::Walker<4> w(a.out.shape, {&os, &cs, &xs, &ys});
  T* out = a.out.ptr<T>();
  const C* cp = c.ptr<C>();
  const T *xp = x.ptr<T>(), *yp = y.ptr<T>();
  a.parallel_for(a.out.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 4>& o, int64_t n, const std::array<int64_t, 4>& s) {
      for (int64_t i = 0; i < n; ++i) {
        out[o[0] + i] = cp[o[1] + i * s[1]] != C(0) ? xp[o[2] + i * s[2]] : yp[o[3] + i * s[3]];
      }
    });
  });
}

void where_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "where", [&]<class T>() {
    switch (a.in[0].dtype) {
      case DType::f32: where_kernel<T, float>(a); break;
      case DType::f64: where_kernel<T, double>(a); break;
      case DType::i32: where_kernel<T, int32_t>(a); break;
      case DType::u8: where_kernel<T, uint8_t>(a); break;
    }
  });
}

// The gradient goes to whichever operand was selected at each position.
Grads where_backward(const BackwardArgs& g) {
  const Tensor& cond = g.inputs[0];
  Tensor zero = zeros_like(g.dout);
  Grads d(3);
  if (g.needs(1)) d[1] = sum_to(where(cond, g.dout, zero), g.inputs[1].shape());
  if (g.needs(2)) d[2] = sum_to(where(cond, zero, g.dout), g.inputs[2].shape());
  return d;
}

}  // namespace

extern const OpDef op_where{
    .name = "where",
    .summary = "cond ? a : b, broadcasting; cond (any dtype, nonzero is true) is not differentiated",
    .inputs = {{"cond", Diff::no}, {"a", Diff::yes}, {"b", Diff::yes}},
    .infer = where_infer,
    .backward = where_backward,
    .cases =
        [] {
          return std::vector<GradCase>{
              {"int_cond", {integers({3, 4}, 0, 2), normal({3, 4}), normal({3, 4})},
               [](const std::vector<Tensor>& x) { return where(x[0], x[1], x[2]); }},
              {"float_cond_broadcast", {normal({3, 1}), normal({3, 4}), normal({4})},
               [](const std::vector<Tensor>& x) { return where(step(x[0]), x[1], x[2]); }},
          };
        },
};
NABLA_CPU_KERNEL(op_where, where_forward);

}  // namespace ops

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return apply(ops::op_where, {cond, a, b});
}

}  // namespace nabla
