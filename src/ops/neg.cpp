// neg: -x
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return -x; }
};

// d(-x) = -dout.
Grads backward(const BackwardArgs& g) { return {neg(g.dout)}; }

}  // namespace

extern const OpDef op_neg{
    .name = "neg",
    .summary = "-x",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("neg", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::neg); },
};
NABLA_CPU_KERNEL(op_neg, unary_forward<Fn>);

}  // namespace ops

Tensor neg(const Tensor& x) { return apply(ops::op_neg, {x}); }

}  // namespace nabla
