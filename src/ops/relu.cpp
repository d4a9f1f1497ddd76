// relu: max(x, 0)
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return x > T(0) ? x : T(0); }
};

// d relu = step(x) dx (0 at the kink, as PyTorch).
Grads backward(const BackwardArgs& g) { return {g.dout * step(g.inputs[0])}; }

}  // namespace

extern const OpDef op_relu{
    .name = "relu",
    .summary = "max(x, 0)",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("relu", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::relu); },
};
NABLA_CPU_KERNEL(op_relu, unary_forward<Fn>);

}  // namespace ops

Tensor relu(const Tensor& x) { return apply(ops::op_relu, {x}); }

}  // namespace nabla
