// add: a + b with NumPy broadcasting.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Add {
  template <class T>
  T operator()(T a, T b) const { return a + b; }
  cpu::VecF vec(cpu::VecF a, cpu::VecF b) const { return a + b; }
};

// d(a + b) = dout for each operand, summed over the axes it was broadcast on.
Grads add_backward(const BackwardArgs& g) {
  Grads d(2);
  if (g.needs(0)) d[0] = sum_to(g.dout, g.inputs[0].shape());
  if (g.needs(1)) d[1] = sum_to(g.dout, g.inputs[1].shape());
  return d;
}

}  // namespace

extern const OpDef op_add{
    .name = "add",
    .summary = "a + b, broadcasting",
    .inputs = {{"a", Diff::yes}, {"b", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_binary("add", in); },
    .backward = add_backward,
    .cases = [] { return binary_cases(nabla::add); },
};
NABLA_CPU_KERNEL(op_add, binary_forward<Add>);

}  // namespace ops

Tensor add(const Tensor& a, const Tensor& b) { return apply(ops::op_add, {a, b}); }

}  // namespace nabla
