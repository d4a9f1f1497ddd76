// gelu_erf_back: dy * gelu_erf'(x). With Phi the standard normal CDF and phi
// its density:
//   d/dx [x Phi(x)] = Phi(x) + x phi(x) = 0.5 (1 + erf(x / sqrt 2)) + x e^(-x^2/2) / sqrt(2 pi)
// It has no backward rule of its own: it differentiates through its composite.
#include "backend/cpu/kernel.h"
#include "nabla/graph.h"
#include "ops/elementwise.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

constexpr double kSqrtHalf = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

struct Fn {
  template <class T>
  T operator()(T x, T dy) const {
    T cdf = T(0.5) * (T(1) + std::erf(x * T(kSqrtHalf)));
    T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
    return dy * (cdf + x * pdf);
  }
  cpu::VecF vec(cpu::VecF x, cpu::VecF dy) const {
    const cpu::VecF cdf = 0.5f * (1.0f + cpu::erf(x * float(kSqrtHalf)));
    const cpu::VecF pdf = float(kInvSqrt2Pi) * cpu::exp_nonpositive(-0.5f * x * x);
    return dy * cpu::fma(x, pdf, cdf);
  }
};

Tensor composite(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &x = in[0], &dy = in[1];
  Tensor cdf = scale(1.0 + erf(scale(x, kSqrtHalf)), 0.5);
  Tensor pdf = scale(exp(scale(square(x), -0.5)), kInvSqrt2Pi);
  return dy * (cdf + x * pdf);
}

std::vector<GradCase> cases() {
  std::vector<GradCase> c = binary_cases(nabla::gelu_erf_back);
  // Second order: d/dx of <v, d gelu_erf(x) / dx>, through this op.
  c.push_back({"second_order", {normal({3, 4})}, [](const std::vector<Tensor>& x) {
                 return grad(sum(gelu_erf(x[0]) * x[0]), {x[0]})[0];
               }});
  return c;
}

}  // namespace

extern const OpDef op_gelu_erf_back{
    .name = "gelu_erf_back",
    .summary = "dy * gelu_erf'(x) = dy (Phi(x) + x phi(x)), broadcasting; fused",
    .inputs = {{"x", Diff::yes}, {"dy", Diff::yes}},
    .elementwise = true,
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs&) { return infer_binary("gelu_erf_back", in); },
    .composite = composite,
    .cases = cases,
};
NABLA_CPU_KERNEL(op_gelu_erf_back, binary_forward<Fn>);

}  // namespace ops

Tensor gelu_erf_back(const Tensor& x, const Tensor& dy) {
  return apply(ops::op_gelu_erf_back, {x, dy});
}

}  // namespace nabla
