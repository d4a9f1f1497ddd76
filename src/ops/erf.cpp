// erf: the error function, 2/sqrt(pi) * integral from 0 to x of e^(-t^2) dt
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const {
    return std::erf(x);
  }
  cpu::VecF vec(cpu::VecF x) const { return cpu::erf(x); }
};

// d erf(x) = 2/sqrt(pi) e^(-x^2) dx.
Grads backward(const BackwardArgs& g) {
  constexpr double two_over_sqrt_pi = 1.1283791670955126;
  return {scale(g.dout * exp(-square(g.inputs[0])), two_over_sqrt_pi)};
}

}  // namespace

extern const OpDef op_erf{
    .name = "erf",
    .summary = "error function, 2/sqrt(pi) * integral_0^x e^(-t^2) dt",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("erf", in); },
    .backward = backward,
    .cases = [] { return unary_cases(nabla::erf); },
};
NABLA_CPU_KERNEL(op_erf, unary_forward<Fn>);

}  // namespace ops

Tensor erf(const Tensor& x) { return apply(ops::op_erf, {x}); }

}  // namespace nabla
