// detach: x itself with no gradient through it (PyTorch's Tensor.detach): a
// value the loss depends on that the optimizer must treat as a constant,
// such as DoRA's weight norm (section 4.3 of the DoRA paper, as PEFT computes
// it). A view.
#include "core/op.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

Meta detach_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor& x = in[0];
  return {x.dtype(), x.shape(), x.strides(), x.offset()};
}

// The detached input enters as a constant: finite differences would see the
// path through it, which by definition carries no gradient.
std::vector<GradCase> detach_cases() {
  return {
      {"scaled_by_a_constant", {normal({3, 4}), constant(normal({3, 4}))},
       [](const std::vector<Tensor>& x) { return x[0] * detach(x[1]); }},
      {"norm_of_a_transposed_view", {normal({2, 3, 4}), constant(normal({4, 3}))},
       [](const std::vector<Tensor>& x) { return x[0] * sqrt(sum(square(detach(transpose(x[1]))), {0}, true)); }},
  };
}

}  // namespace

extern const OpDef op_detach{
    .name = "detach",
    .summary = "x itself, not differentiated (a constant to the backward); a view",
    .inputs = {{"x", Diff::no}},
    .is_view = true,
    .infer = detach_infer,
    .cases = detach_cases,
};

}  // namespace ops

Tensor detach(const Tensor& x) { return apply(ops::op_detach, {x}); }

}  // namespace nabla
