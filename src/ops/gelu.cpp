// gelu: GELU with the tanh approximation,
//   y = 0.5 x (1 + tanh(k (x + a x^3))),  k = sqrt(2/pi), a = 0.044715
// (PyTorch's approximate="tanh"; the exact form is gelu_erf).
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;

struct Fn {
  template <class T>
  T operator()(T x) const {
    return T(0.5) * x * (T(1) + std::tanh(T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x)));
  }
  // f32 as x sigmoid(2u) = x / (1 + e^(-2u)), the same function (0.5 (1 +
  // tanh u) = sigmoid(2u)) without the cancellation of 1 + tanh u for
  // negative x. Where e^(-2u) overflows x / inf is the -0 that x sigmoid(2u)
  // rounds to anyway, so this needs none of sigmoid's care for both tails
  // (its abs and selects).
  cpu::VecF vec(cpu::VecF x) const {
    const cpu::VecF minus_2u = float(-2 * kSqrt2OverPi) * cpu::fma(float(kCubic) * x * x, x, x);
    return x / (1.0f + cpu::exp(minus_2u));
  }
};

Tensor composite(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor& x = in[0];
  Tensor inner = scale(x + scale(x * x * x, kCubic), kSqrt2OverPi);
  return scale(x * (1.0 + tanh(inner)), 0.5);
}

// x, dx same shape: dx = dy * gelu'(x), a fused op of its own (gelu_back).
Grads backward(const BackwardArgs& g) { return {gelu_back(g.inputs[0], g.dout)}; }

}  // namespace

extern const OpDef op_gelu{
    .name = "gelu",
    .summary = "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GELU's tanh approximation; fused",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .fused = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("gelu", in); },
    .backward = backward,
    .composite = composite,
    // Scaled by 3 so inputs reach the tails, where tanh saturates.
    .cases = [] { return unary_cases([](const Tensor& x) { return gelu(x * 3.0); }); },
};
NABLA_CPU_KERNEL(op_gelu, unary_forward<Fn>);

}  // namespace ops

Tensor gelu(const Tensor& x) { return apply(ops::op_gelu, {x}); }

}  // namespace nabla
