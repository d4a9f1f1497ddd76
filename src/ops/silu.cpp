// silu: x * sigmoid(x)
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return x >= T(0) ? x / (T(1) + std::exp(-x)) : x * std::exp(x) / (T(1) + std::exp(x)); }
  cpu::VecF vec(cpu::VecF x) const { return x * cpu::sigmoid(x); }
};

// d silu = s (1 + x (1 - s)) dx with s = sigmoid(x).
Grads backward(const BackwardArgs& g) {
  const Tensor& x = g.inputs[0];
  Tensor s = sigmoid(x);
  return {g.dout * s * (1.0 + x * (1.0 - s))};
}

}  // namespace

extern const OpDef op_silu{
    .name = "silu",
    .summary = "x * sigmoid(x)",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("silu", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::silu); },
};
NABLA_CPU_KERNEL(op_silu, unary_forward<Fn>);

}  // namespace ops

Tensor silu(const Tensor& x) { return apply(ops::op_silu, {x}); }

}  // namespace nabla
