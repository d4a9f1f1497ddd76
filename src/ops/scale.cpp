// scale: x * factor for a constant factor.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

void scale_forward(const KernelArgs& a) {
  double factor = a.attrs->reals[0];
  dispatch_floating(a.out.dtype, "scale", [&]<class T>() {
    T f = static_cast<T>(factor);
    unary_kernel<T>(a, [f](T x) { return x * f; });
  });
}

// d(c x) = c dx.
Grads scale_backward(const BackwardArgs& g) { return {scale(g.dout, g.attrs.reals[0])}; }

}  // namespace

extern const OpDef op_scale{
    .name = "scale",
    .summary = "x * factor, factor a constant",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("scale", in); },
    .backward = scale_backward,
    .cases = [] { return unary_cases([](const Tensor& x) { return scale(x, -1.75); }); },
};
NABLA_CPU_KERNEL(op_scale, scale_forward);

}  // namespace ops

Tensor scale(const Tensor& x, double factor) { return apply(ops::op_scale, {x}, Attrs{{}, {factor}}); }

}  // namespace nabla
