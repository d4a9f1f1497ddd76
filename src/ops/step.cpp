// step: 1 where x > 0, else 0; piecewise constant, so not differentiated
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return x > T(0) ? T(1) : T(0); }
};



}  // namespace

extern const OpDef op_step{
    .name = "step",
    .summary = "1 where x > 0, else 0; piecewise constant, so not differentiated",
    .inputs = {{"x", Diff::no}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("step", in); },
    .cases = [] { return unary_cases(nabla::step); },
};
NABLA_CPU_KERNEL(op_step, unary_forward<Fn>);

}  // namespace ops

Tensor step(const Tensor& x) { return apply(ops::op_step, {x}); }

}  // namespace nabla
