// gelu_erf: exact GELU, y = x Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))
// (PyTorch's default approximate="none").
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

constexpr double kSqrtHalf = 0.7071067811865476;

struct Fn {
  template <class T>
  T operator()(T x) const {
    return T(0.5) * x * (T(1) + std::erf(x * T(kSqrtHalf)));
  }
  cpu::VecF vec(cpu::VecF x) const { return 0.5f * x * (1.0f + cpu::erf(x * float(kSqrtHalf))); }
};

Tensor composite(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor& x = in[0];
  return scale(x * (1.0 + erf(scale(x, kSqrtHalf))), 0.5);
}

// x, dx same shape: dx = dy * (Phi(x) + x phi(x)), a fused op of its own (gelu_erf_back).
Grads backward(const BackwardArgs& g) { return {gelu_erf_back(g.inputs[0], g.dout)}; }

}  // namespace

extern const OpDef op_gelu_erf{
    .name = "gelu_erf",
    .summary = "0.5 x (1 + erf(x / sqrt(2))), exact GELU; fused",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs&) { return infer_unary("gelu_erf", in); },
    .backward = backward,
    .composite = composite,
    // Scaled by 3 so inputs reach the tails, where erf saturates.
    .cases = [] { return unary_cases([](const Tensor& x) { return gelu_erf(x * 3.0); }); },
};
NABLA_CPU_KERNEL(op_gelu_erf, unary_forward<Fn>);

}  // namespace ops

Tensor gelu_erf(const Tensor& x) { return apply(ops::op_gelu_erf, {x}); }

}  // namespace nabla
