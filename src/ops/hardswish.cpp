// hardswish: x * relu6(x + 3) / 6, i.e. 0 for x <= -3, x for x >= 3 and
// x (x + 3) / 6 between.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const {
    return x <= T(-3) ? T(0) : x >= T(3) ? x : x * (x + T(3)) / T(6);
  }
};

// dx = dy * (0 for x < -3, x/3 + 1/2 for -3 <= x <= 3, 1 for x > 3): PyTorch's
// values at the two kinks.
Grads backward(const BackwardArgs& g) {
  const Tensor& x = g.inputs[0];
  Tensor middle = g.dout * (scale(x, 1.0 / 3.0) + 0.5);
  Tensor below = where(step(-x - 3.0), zeros_like(g.dout), middle);
  return {where(step(x - 3.0), g.dout, below)};
}

std::vector<GradCase> cases() {
  using V = std::vector<Tensor>;
  // The derivative jumps at -3 and 3: inputs stay 0.05 away from both.
  // u ~ U(0.05, 2) placed either side of a kink covers it and its neighbours.
  return {
      {"middle", {uniform({3, 5}, -2.95, 2.95)}, [](const V& x) { return hardswish(x[0]); }},
      {"around_3",
       {uniform({2, 3, 4}, 0.05, 2.0)},
       [](const V& u) {
         return hardswish(concat({3.0 - u[0], 3.0 + u[0]}, 0));
       }},
      {"around_minus_3",
       {uniform({2, 5}, 0.05, 2.0)},
       [](const V& u) {
         return hardswish(concat({-3.0 - u[0], u[0] - 3.0}, 0));
       }},
  };
}

}  // namespace

extern const OpDef op_hardswish{
    .name = "hardswish",
    .summary = "x * relu6(x + 3) / 6",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs&) { return infer_unary("hardswish", in); },
    .backward = backward,
    .cases = cases,
};
NABLA_CPU_KERNEL(op_hardswish, unary_forward<Fn>);

}  // namespace ops

Tensor hardswish(const Tensor& x) { return apply(ops::op_hardswish, {x}); }

}  // namespace nabla
