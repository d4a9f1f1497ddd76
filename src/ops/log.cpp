// log: natural logarithm
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return std::log(x); }
};

// d(log x) = dx / x.
Grads backward(const BackwardArgs& g) { return {g.dout / g.inputs[0]}; }

}  // namespace

extern const OpDef op_log{
    .name = "log",
    .summary = "natural logarithm",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("log", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::log, 0.2, 3.0); },
};
NABLA_CPU_KERNEL(op_log, unary_forward<Fn>);

}  // namespace ops

Tensor log(const Tensor& x) { return apply(ops::op_log, {x}); }

}  // namespace nabla
