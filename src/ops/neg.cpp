// neg: -x
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
    .forward = unary_forward<Fn>,
    .backward = backward,
    .cases = [] { return unary_cases(nabla::neg); },
};

}  // namespace ops

Tensor neg(const Tensor& x) { return apply(ops::op_neg, {x}); }

}  // namespace nabla
