// sign: -1, 0 or 1; piecewise constant, so not differentiated
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

struct Fn {
  template <class T>
  T operator()(T x) const { return T((x > T(0)) - (x < T(0))); }
};



}  // namespace

extern const OpDef op_sign{
    .name = "sign",
    .summary = "-1, 0 or 1; piecewise constant, so not differentiated",
    .inputs = {{"x", Diff::no}},
    .elementwise = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return infer_unary("sign", in); },
    .cases = [] { return unary_cases(nabla::sign); },
};
NABLA_CPU_KERNEL(op_sign, unary_forward<Fn>);

}  // namespace ops

Tensor sign(const Tensor& x) { return apply(ops::op_sign, {x}); }

}  // namespace nabla
