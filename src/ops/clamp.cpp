// clamp: lo where x < lo, hi where x > hi, x between. attrs.reals = {lo, hi}.
// As PyTorch: NaN stays NaN, and hi wins when lo > hi.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

void forward(const KernelArgs& a) {
  const double lo = a.attrs->reals[0], hi = a.attrs->reals[1];
  dispatch_floating(a.out.dtype, "clamp", [&]<class T>() {
    const T l = T(lo), h = T(hi);
    unary_kernel<T>(a, [l, h](T x) {
      T y = x < l ? l : x;
      return y > h ? h : y;
    });
  });
}

// dx = dy where lo <= x <= hi, else 0: the boundaries pass the gradient, as
// PyTorch's clamp does.
Grads backward(const BackwardArgs& g) {
  const Tensor& x = g.inputs[0];
  const double lo = g.attrs.reals[0], hi = g.attrs.reals[1];
  Tensor outside = step(lo - x) + step(x - hi);  // nonzero where x < lo or x > hi
  return {where(outside, zeros_like(g.dout), g.dout)};
}

Meta infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  if (std::isnan(attrs.reals[0]) || std::isnan(attrs.reals[1])) {
    throw UsageError("clamp: lo and hi must not be NaN");
  }
  return infer_unary("clamp", in);
}

std::vector<GradCase> cases() {
  using V = std::vector<Tensor>;
  // The derivative jumps at lo and hi: inputs stay 0.05 away from both.
  // u ~ U(0.05, 1.5): -1 - u is below lo = -1, u - 0.775 inside, 1 + u above hi = 1.
  auto three_regions = [](const V& u) {
    return clamp(concat({-1.0 - u[0], u[0] - 0.775, 1.0 + u[0]}, 0), -1.0, 1.0);
  };
  return {
      {"inside", {uniform({3, 5}, -0.45, 0.65)}, [](const V& x) { return clamp(x[0], -0.5, 0.7); }},
      {"three_regions", {uniform({2, 3, 4}, 0.05, 1.5)}, three_regions},
      {"scalar_above", {uniform({}, 0.75, 2.0)}, [](const V& x) { return clamp(x[0], -0.5, 0.7); }},
  };
}

}  // namespace

extern const OpDef op_clamp{
    .name = "clamp",
    .summary = "min(max(x, lo), hi); gradient 1 on [lo, hi], 0 outside (PyTorch)",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = infer,
    .backward = backward,
    .cases = cases,
};
NABLA_CPU_KERNEL(op_clamp, forward);

}  // namespace ops

Tensor clamp(const Tensor& x, double lo, double hi) {
  return apply(ops::op_clamp, {x}, Attrs{{}, {lo, hi}});
}

}  // namespace nabla
