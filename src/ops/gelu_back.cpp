// gelu_back: dy * gelu'(x) for gelu's tanh approximation. With
//   u = k (x + a x^3),  t = tanh(u),  k = sqrt(2/pi), a = 0.044715:
//   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2)
// It has no backward rule of its own: it differentiates through its composite.
#include "backend/cpu/kernel.h"
#include "nabla/graph.h"
#include "ops/elementwise.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;

struct Fn {
  template <class T>
  T operator()(T x, T dy) const {
    const T k = T(kSqrt2OverPi), a = T(kCubic);
    T t = std::tanh(k * (x + a * x * x * x));
    return dy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3) * a * x * x));
  }
  // f32 through s = sigmoid(2u): 0.5 (1 + t) = s and 1 - t^2 = 4 s (1 - s),
  // each without cancellation. With e = e^-|2u| and r = 1 / (1 + e) (as
  // sigmoid_pair), s (1 - s) is e r * r whatever the sign of u: one select,
  // not sigmoid_pair's two.
  cpu::VecF vec(cpu::VecF x, cpu::VecF dy) const {
    const float k = float(kSqrt2OverPi), a = float(kCubic);
    const cpu::VecF x2 = x * x;
    const cpu::VecF z = 2.0f * k * cpu::fma(a * x2, x, x);
    const cpu::VecF e = cpu::exp_nonpositive(-cpu::abs(z));
    const cpu::VecF r = 1.0f / (1.0f + e);
    const cpu::VecF er = e * r;
    const cpu::VecF s = cpu::select(z >= 0.0f, r, er);
    const cpu::VecF du = k * cpu::fma(3 * a, x2, 1.0f);
    return dy * cpu::fma(2.0f * x * er * r, du, s);
  }
};

Tensor composite(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &x = in[0], &dy = in[1];
  Tensor t = tanh(scale(x + scale(x * x * x, kCubic), kSqrt2OverPi));
  Tensor du = scale(1.0 + scale(square(x), 3 * kCubic), kSqrt2OverPi);
  return dy * scale((1.0 + t) + x * (1.0 - square(t)) * du, 0.5);
}

std::vector<GradCase> cases() {
  std::vector<GradCase> c = binary_cases(nabla::gelu_back);
  // Second order: d/dx of <v, d gelu(x) / dx>, through this op.
  c.push_back({"second_order", {normal({3, 4})}, [](const std::vector<Tensor>& x) {
                 return grad(sum(gelu(x[0]) * x[0]), {x[0]})[0];
               }});
  return c;
}

}  // namespace

extern const OpDef op_gelu_back{
    .name = "gelu_back",
    .summary = "dy * gelu'(x) for the tanh approximation, broadcasting; fused",
    .inputs = {{"x", Diff::yes}, {"dy", Diff::yes}},
    .elementwise = true,
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs&) { return infer_binary("gelu_back", in); },
    .composite = composite,
    .cases = cases,
};
NABLA_CPU_KERNEL(op_gelu_back, binary_forward<Fn>);

}  // namespace ops

Tensor gelu_back(const Tensor& x, const Tensor& dy) { return apply(ops::op_gelu_back, {x, dy}); }

}  // namespace nabla
