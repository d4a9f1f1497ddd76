// after: x itself, once `dep` has been computed; a view. Nothing reads dep:
// the edge only orders. Recomputation (recompute() in nabla/graph.h) reads a
// region's outside inputs through it, gated on the gradient arriving at the
// region's output, so the recomputed nodes run where the backward needs
// them instead of wherever their inputs allowed.
#include "core/op.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

Meta after_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor& x = in[0];
  return {x.dtype(), x.shape(), x.strides(), x.offset()};
}

Grads after_backward(const BackwardArgs& g) { return {g.dout, Tensor()}; }

std::vector<GradCase> after_cases() {
  return {
      {"matrix", {normal({3, 4}), constant(normal({2}))},
       [](const std::vector<Tensor>& x) { return after(x[0], x[1]) * x[0]; }},
      {"transposed_view", {normal({2, 3, 4}), constant(normal({3, 1}))},
       [](const std::vector<Tensor>& x) { return exp(after(transpose(x[0]), x[1])); }},
  };
}

}  // namespace

extern const OpDef op_after{
    .name = "after",
    .summary = "x once dep is computed (dep is not read): orders recomputed nodes; a view",
    .inputs = {{"x", Diff::yes}, {"dep", Diff::no}},
    .is_view = true,
    .infer = after_infer,
    .backward = after_backward,
    .cases = after_cases,
};

}  // namespace ops

Tensor after(const Tensor& x, const Tensor& dep) { return apply(ops::op_after, {x, dep}); }

}  // namespace nabla
