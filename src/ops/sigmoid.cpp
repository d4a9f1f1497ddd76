// sigmoid: 1 / (1 + e^-x)
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return x >= T(0) ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x)); }
  cpu::VecF vec(cpu::VecF x) const { return cpu::sigmoid(x); }
};

// d sigmoid = s (1 - s) dx: reuse the output.
Grads backward(const BackwardArgs& g) { return {g.dout * g.out * (1.0 - g.out)}; }

}  // namespace

extern const OpDef op_sigmoid{
    .name = "sigmoid",
    .summary = "1 / (1 + e^-x)",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("sigmoid", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::sigmoid); },
};
NABLA_CPU_KERNEL(op_sigmoid, unary_forward<Fn>);

}  // namespace ops

Tensor sigmoid(const Tensor& x) { return apply(ops::op_sigmoid, {x}); }

}  // namespace nabla
