// div: a / b with NumPy broadcasting.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Div {
  template <class T>
  T operator()(T a, T b) const { return a / b; }
  cpu::VecF vec(cpu::VecF a, cpu::VecF b) const { return a / b; }
};

// da = dout / b; db = -dout * a / b^2 = -dout * out / b. Both summed back to
// their operand's shape (ggml's div backward missed this for broadcast b).
Grads div_backward(const BackwardArgs& g) {
  Grads d(2);
  const Tensor& b = g.inputs[1];
  if (g.needs(0)) d[0] = sum_to(g.dout / b, g.inputs[0].shape());
  if (g.needs(1)) d[1] = neg(sum_to(g.dout * g.out / b, b.shape()));
  return d;
}

}  // namespace

extern const OpDef op_div{
    .name = "div",
    .summary = "a / b, broadcasting",
    .inputs = {{"a", Diff::yes}, {"b", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_binary("div", in); },
    .backward = div_backward,
    // b away from 0, where the quotient and its differences blow up.
    .cases = [] { return binary_cases(nabla::div, 0.5, 2.0); },
};
NABLA_CPU_KERNEL(op_div, binary_forward<Div>);

}  // namespace ops

Tensor div(const Tensor& a, const Tensor& b) { return apply(ops::op_div, {a, b}); }

}  // namespace nabla
