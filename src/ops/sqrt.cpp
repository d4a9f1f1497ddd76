// sqrt: square root
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return std::sqrt(x); }
};

// d(sqrt x) = dx / (2 sqrt x): reuse the output.
Grads backward(const BackwardArgs& g) { return {scale(g.dout / g.out, 0.5)}; }

}  // namespace

extern const OpDef op_sqrt{
    .name = "sqrt",
    .summary = "square root",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("sqrt", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::sqrt, 0.2, 3.0); },
};
NABLA_CPU_KERNEL(op_sqrt, unary_forward<Fn>);

}  // namespace ops

Tensor sqrt(const Tensor& x) { return apply(ops::op_sqrt, {x}); }

}  // namespace nabla
