// gelu_quick_back: dy * gelu_quick'(x). With s = sigmoid(c x), c = 1.702:
//   d/dx [x s] = s + c x s (1 - s)
// It has no backward rule of its own: it differentiates through its composite.
#include "backend/cpu/kernel.h"
#include "nabla/graph.h"
#include "ops/elementwise.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

constexpr double kQuick = 1.702;

struct Fn {
  template <class T>
  T operator()(T x, T dy) const {
    T z = T(kQuick) * x;
    T s = z >= T(0) ? T(1) / (T(1) + std::exp(-z)) : std::exp(z) / (T(1) + std::exp(z));
    return dy * (s + T(kQuick) * x * s * (T(1) - s));
  }
  cpu::VecF vec(cpu::VecF x, cpu::VecF dy) const {
    const cpu::VecF z = float(kQuick) * x;
    const auto [s, one_minus_s] = cpu::sigmoid_pair(z);
    return dy * cpu::fma(z * s, one_minus_s, s);
  }
};

Tensor composite(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &x = in[0], &dy = in[1];
  Tensor s = sigmoid(scale(x, kQuick));
  return dy * (s + scale(x, kQuick) * s * (1.0 - s));
}

std::vector<GradCase> cases() {
  std::vector<GradCase> c = binary_cases(nabla::gelu_quick_back);
  // Second order: d/dx of <v, d gelu_quick(x) / dx>, through this op.
  c.push_back({"second_order", {normal({3, 4})}, [](const std::vector<Tensor>& x) {
                 return grad(sum(gelu_quick(x[0]) * x[0]), {x[0]})[0];
               }});
  return c;
}

}  // namespace

extern const OpDef op_gelu_quick_back{
    .name = "gelu_quick_back",
    .summary =
        "dy * gelu_quick'(x) = dy (s + 1.702 x s (1 - s)), s = sigmoid(1.702 x), broadcasting; "
        "fused",
    .inputs = {{"x", Diff::yes}, {"dy", Diff::yes}},
    .elementwise = true,
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs&) { return infer_binary("gelu_quick_back", in); },
    .composite = composite,
    .cases = cases,
};
NABLA_CPU_KERNEL(op_gelu_quick_back, binary_forward<Fn>);

}  // namespace ops

Tensor gelu_quick_back(const Tensor& x, const Tensor& dy) {
  return apply(ops::op_gelu_quick_back, {x, dy});
}

}  // namespace nabla
