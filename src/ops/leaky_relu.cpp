// leaky_relu: x where x > 0, slope * x elsewhere. attrs.reals = {slope}.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

void forward(const KernelArgs& a) {
  const double slope = a.attrs->reals[0];
  dispatch_floating(a.out.dtype, "leaky_relu", [&]<class T>() {
    const T s = T(slope);
    unary_kernel<T>(a, [s](T x) { return x > T(0) ? x : s * x; });
  });
}

// dx = dy where x > 0, slope * dy elsewhere (slope at the kink, as PyTorch).
Grads backward(const BackwardArgs& g) {
  return {where(step(g.inputs[0]), g.dout, scale(g.dout, g.attrs.reals[0]))};
}

Meta infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  if (!std::isfinite(attrs.reals[0])) {
    throw UsageError("leaky_relu: slope must be finite, got " + std::to_string(attrs.reals[0]));
  }
  return infer_unary("leaky_relu", in);
}

std::vector<GradCase> cases() {
  using V = std::vector<Tensor>;
  // The derivative jumps at 0: inputs stay 0.05 away from it, u ~ U(0.05, 2)
  // placed on both sides.
  auto both_sides = [](const V& u, double slope) {
    return leaky_relu(concat({-u[0], u[0]}, 0), slope);
  };
  return {
      {"matrix", {uniform({3, 5}, 0.05, 2.0)}, [=](const V& u) { return both_sides(u, 0.01); }},
      {"rank3_slope",
       {uniform({2, 3, 4}, 0.05, 2.0)},
       [=](const V& u) { return both_sides(u, 0.2); }},
      {"scalar_negative",
       {uniform({}, -2.0, -0.05)},
       [](const V& x) { return leaky_relu(x[0], 0.3); }},
  };
}

}  // namespace

extern const OpDef op_leaky_relu{
    .name = "leaky_relu",
    .summary = "x where x > 0, slope * x elsewhere",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = infer,
    .backward = backward,
    .cases = cases,
};
NABLA_CPU_KERNEL(op_leaky_relu, forward);

}  // namespace ops

Tensor leaky_relu(const Tensor& x, double slope) {
  return apply(ops::op_leaky_relu, {x}, Attrs{{}, {slope}});
}

}  // namespace nabla
