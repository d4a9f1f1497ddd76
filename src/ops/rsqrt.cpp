// rsqrt: 1 / sqrt(x)
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return T(1) / std::sqrt(x); }
};

// y = x^(-1/2): dy = -1/2 x^(-3/2) dx = -1/2 y^3 dx.
Grads backward(const BackwardArgs& g) { return {scale(g.dout * g.out * g.out * g.out, -0.5)}; }

}  // namespace

extern const OpDef op_rsqrt{
    .name = "rsqrt",
    .summary = "1 / sqrt(x)",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("rsqrt", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::rsqrt, 0.2, 3.0); },
};
NABLA_CPU_KERNEL(op_rsqrt, unary_forward<Fn>);

}  // namespace ops

Tensor rsqrt(const Tensor& x) { return apply(ops::op_rsqrt, {x}); }

}  // namespace nabla
