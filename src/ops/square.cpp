// square: x * x
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return x * x; }
};

// d(x^2) = 2x dx.
Grads backward(const BackwardArgs& g) { return {scale(g.dout * g.inputs[0], 2.0)}; }

}  // namespace

extern const OpDef op_square{
    .name = "square",
    .summary = "x * x",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("square", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::square); },
};
NABLA_CPU_KERNEL(op_square, unary_forward<Fn>);

}  // namespace ops

Tensor square(const Tensor& x) { return apply(ops::op_square, {x}); }

}  // namespace nabla
