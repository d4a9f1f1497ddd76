// abs: |x|
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
    .forward = unary_forward<Fn>,
    .backward = backward,
    .cases = [] { return unary_cases(nabla::abs); },
};

}  // namespace ops

Tensor abs(const Tensor& x) { return apply(ops::op_abs, {x}); }

}  // namespace nabla
