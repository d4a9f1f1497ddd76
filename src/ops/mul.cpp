// mul: a * b with NumPy broadcasting.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Mul {
  template <class T>
  T operator()(T a, T b) const { return a * b; }
  cpu::VecF vec(cpu::VecF a, cpu::VecF b) const { return a * b; }
};

// da = dout * b, db = dout * a, each summed back to its operand's shape.
Grads mul_backward(const BackwardArgs& g) {
  Grads d(2);
  if (g.needs(0)) d[0] = sum_to(g.dout * g.inputs[1], g.inputs[0].shape());
  if (g.needs(1)) d[1] = sum_to(g.dout * g.inputs[0], g.inputs[1].shape());
  return d;
}

}  // namespace

extern const OpDef op_mul{
    .name = "mul",
    .summary = "a * b, broadcasting",
    .inputs = {{"a", Diff::yes}, {"b", Diff::yes}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_binary("mul", in); },
    .backward = mul_backward,
    .cases = [] { return binary_cases(nabla::mul); },
};
NABLA_CPU_KERNEL(op_mul, binary_forward<Mul>);

}  // namespace ops

Tensor mul(const Tensor& a, const Tensor& b) { return apply(ops::op_mul, {a, b}); }

}  // namespace nabla
