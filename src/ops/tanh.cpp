// tanh: hyperbolic tangent
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return std::tanh(x); }
  cpu::VecF vec(cpu::VecF x) const { return cpu::tanh(x); }
};

// d(tanh x) = (1 - tanh^2 x) dx: reuse the output.
Grads backward(const BackwardArgs& g) { return {g.dout * (1.0 - square(g.out))}; }

}  // namespace

extern const OpDef op_tanh{
    .name = "tanh",
    .summary = "hyperbolic tangent",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("tanh", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::tanh); },
};
NABLA_CPU_KERNEL(op_tanh, unary_forward<Fn>);

}  // namespace ops

Tensor tanh(const Tensor& x) { return apply(ops::op_tanh, {x}); }

}  // namespace nabla
