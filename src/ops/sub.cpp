// sub: a - b with NumPy broadcasting.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Sub {
  template <class T>
  T operator()(T a, T b) const { return a - b; }
  cpu::VecF vec(cpu::VecF a, cpu::VecF b) const { return a - b; }
};

// da = dout, db = -dout, each summed back to its operand's shape.
Grads sub_backward(const BackwardArgs& g) {
  Grads d(2);
  if (g.needs(0)) d[0] = sum_to(g.dout, g.inputs[0].shape());
  if (g.needs(1)) d[1] = neg(sum_to(g.dout, g.inputs[1].shape()));
  return d;
}

}  // namespace

extern const OpDef op_sub{
    .name = "sub",
    .summary = "a - b, broadcasting",
    .inputs = {{"a", Diff::yes}, {"b", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_binary("sub", in); },
    .backward = sub_backward,
    .cases = [] { return binary_cases(nabla::sub); },
};
NABLA_CPU_KERNEL(op_sub, binary_forward<Sub>);

}  // namespace ops

Tensor sub(const Tensor& a, const Tensor& b) { return apply(ops::op_sub, {a, b}); }

}  // namespace nabla
