// softplus: log(1 + e^(beta x)) / beta, and x itself where beta x > threshold
// (PyTorch's semantics: linear above the threshold, for accuracy and speed).
// attrs.reals = {beta, threshold}.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

void forward(const KernelArgs& a) {
  const double beta = a.attrs->reals[0], threshold = a.attrs->reals[1];
  dispatch_floating(a.out.dtype, "softplus", [&]<class T>() {
    const T b = T(beta), th = T(threshold);
    unary_kernel<T>(a, [b, th](T x) { return x * b > th ? x : std::log1p(std::exp(x * b)) / b; });
  });
}

// dx = dy * sigmoid(beta x), and dy where beta x > threshold (the linear part).
Grads backward(const BackwardArgs& g) {
  const Tensor& x = g.inputs[0];
  const double beta = g.attrs.reals[0], threshold = g.attrs.reals[1];
  Tensor bx = scale(x, beta);
  return {where(step(bx - threshold), g.dout, g.dout * sigmoid(bx))};
}

Meta infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const double beta = attrs.reals[0], threshold = attrs.reals[1];
  if (!(beta > 0) || !std::isfinite(beta)) {
    throw UsageError("softplus: beta must be finite and > 0, got " + std::to_string(beta));
  }
  if (std::isnan(threshold)) throw UsageError("softplus: threshold is NaN");
  return infer_unary("softplus", in);
}

std::vector<GradCase> cases() {
  using V = std::vector<Tensor>;
  std::vector<GradCase> c = unary_cases([](const Tensor& x) { return softplus(x); });
  // The threshold switch is a kink (and a jump of e^-threshold / beta): finite
  // differences must not straddle it. u ~ U(0.05, 2) puts inputs at least
  // 0.05 either side of the switch at x = threshold / beta = 1.
  c.push_back({"both_sides_of_threshold", {uniform({2, 3, 4}, 0.05, 2.0)}, [](const V& u) {
                 return softplus(concat({1.0 - u[0], 1.0 + u[0]}, 0), 2.0, 2.0);
               }});
  c.push_back(
      {"beta_half", {normal({3, 5})}, [](const V& x) { return softplus(x[0] * 3.0, 0.5, 20.0); }});
  return c;
}

}  // namespace

extern const OpDef op_softplus{
    .name = "softplus",
    .summary = "log(1 + e^(beta x)) / beta; x where beta x > threshold (PyTorch)",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = infer,
    .backward = backward,
    .cases = cases,
};
NABLA_CPU_KERNEL(op_softplus, forward);

}  // namespace ops

Tensor softplus(const Tensor& x, double beta, double threshold) {
  return apply(ops::op_softplus, {x}, Attrs{{}, {beta, threshold}});
}

}  // namespace nabla
