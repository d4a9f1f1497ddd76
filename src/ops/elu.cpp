// elu: x where x > 0, alpha (e^x - 1) elsewhere. attrs.reals = {alpha}.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

void forward(const KernelArgs& a) {
  const double alpha = a.attrs->reals[0];
  dispatch_floating(a.out.dtype, "elu", [&]<class T>() {
    const T al = T(alpha);
    unary_kernel<T>(a, [al](T x) { return x > T(0) ? x : al * std::expm1(x); });
  });
}

// dx = dy where x > 0, dy * alpha e^x elsewhere (alpha at the kink, as PyTorch).
Grads backward(const BackwardArgs& g) {
  const Tensor& x = g.inputs[0];
  return {where(step(x), g.dout, g.dout * scale(exp(x), g.attrs.reals[0]))};
}

Meta infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  if (!std::isfinite(attrs.reals[0]))
    throw UsageError("elu: alpha must be finite, got " + std::to_string(attrs.reals[0]));
  return infer_unary("elu", in);
}

std::vector<GradCase> cases() {
  using V = std::vector<Tensor>;
  // With alpha != 1 the derivative jumps at 0: inputs stay 0.05 away from it,
  // u ~ U(0.05, 2) placed on both sides.
  auto both_sides = [](const V& u, double alpha) { return elu(concat({-u[0], u[0]}, 0), alpha); };
  return {
      {"matrix", {uniform({3, 5}, 0.05, 2.0)}, [=](const V& u) { return both_sides(u, 1.0); }},
      {"rank3_alpha",
       {uniform({2, 3, 4}, 0.05, 3.0)},
       [=](const V& u) { return both_sides(u, 0.7); }},
      {"negative_alpha",
       {uniform({2, 5}, 0.05, 2.0)},
       [=](const V& u) { return both_sides(u, -0.4); }},
  };
}

}  // namespace

extern const OpDef op_elu{
    .name = "elu",
    .summary = "x where x > 0, alpha (e^x - 1) elsewhere",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = infer,
    .backward = backward,
    .cases = cases,
};
NABLA_CPU_KERNEL(op_elu, forward);

}  // namespace ops

Tensor elu(const Tensor& x, double alpha) { return apply(ops::op_elu, {x}, Attrs{{}, {alpha}}); }

}  // namespace nabla
