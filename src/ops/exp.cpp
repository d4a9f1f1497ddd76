// exp: e^x
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return std::exp(x); }
  cpu::VecF vec(cpu::VecF x) const { return cpu::exp(x); }
};

// d(e^x) = e^x dx: reuse the output.
Grads backward(const BackwardArgs& g) { return {g.dout * g.out}; }

}  // namespace

extern const OpDef op_exp{
    .name = "exp",
    .summary = "e^x",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("exp", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::exp); },
};
NABLA_CPU_KERNEL(op_exp, unary_forward<Fn>);

}  // namespace ops

Tensor exp(const Tensor& x) { return apply(ops::op_exp, {x}); }

}  // namespace nabla
