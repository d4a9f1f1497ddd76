// abs: |x|
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return std::abs(x); }
};

// d|x| = sign(x) dx (0 at the kink, as PyTorch).
Grads backward(const BackwardArgs& g) { return {g.dout * sign(g.inputs[0])}; }

}  // namespace

extern const OpDef op_abs{
    .name = "abs",
    .summary = "|x|",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("abs", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::abs); },
};
NABLA_CPU_KERNEL(op_abs, unary_forward<Fn>);

}  // namespace ops

Tensor abs(const Tensor& x) { return apply(ops::op_abs, {x}); }

}  // namespace nabla
