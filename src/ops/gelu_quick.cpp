// gelu_quick: y = x sigmoid(1.702 x), the sigmoid approximation of GELU
// (CLIP's QuickGELU).
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

constexpr double kQuick = 1.702;

// sigmoid written so that neither branch overflows, as in sigmoid.cpp.
struct Fn {
  template <class T>
  T operator()(T x) const {
    T z = T(kQuick) * x;
    T s = z >= T(0) ? T(1) / (T(1) + std::exp(-z)) : std::exp(z) / (T(1) + std::exp(z));
    return x * s;
  }
  cpu::VecF vec(cpu::VecF x) const { return x * cpu::sigmoid(float(kQuick) * x); }
};

Tensor composite(const std::vector<Tensor>& in, const Attrs&) {
  return in[0] * sigmoid(scale(in[0], kQuick));
}

// x, dx same shape: dx = dy * (s + 1.702 x s (1 - s)), a fused op of its own (gelu_quick_back).
Grads backward(const BackwardArgs& g) { return {gelu_quick_back(g.inputs[0], g.dout)}; }

}  // namespace

extern const OpDef op_gelu_quick{
    .name = "gelu_quick",
    .summary = "x * sigmoid(1.702 x), GELU's sigmoid approximation; fused",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs&) { return infer_unary("gelu_quick", in); },
    .backward = backward,
    .composite = composite,
    // Scaled by 3 so inputs reach the tails, where the sigmoid saturates.
    .cases = [] { return unary_cases([](const Tensor& x) { return gelu_quick(x * 3.0); }); },
};
NABLA_CPU_KERNEL(op_gelu_quick, unary_forward<Fn>);

}  // namespace ops

Tensor gelu_quick(const Tensor& x) { return apply(ops::op_gelu_quick, {x}); }

}  // namespace nabla
