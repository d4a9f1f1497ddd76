// expand: broadcasts size-1 (or missing leading) axes to a larger shape; a
// view with stride 0 on the broadcast axes.
#include "core/op.h"

namespace nabla {
namespace ops {
namespace {

Meta expand_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  Shape shape(attrs.ints.begin(), attrs.ints.end());
  if (shape.size() < x.shape().size()) {
    throw ShapeError("expand: cannot expand " + to_string(x.shape()) + " to fewer axes " + to_string(shape));
  }
  size_t lead = shape.size() - x.shape().size();
  Strides strides(shape.size(), 0);
  for (size_t i = 0; i < x.shape().size(); ++i) {
    int64_t from = x.shape()[i], to = shape[lead + i];
    if (from == to) {
      strides[lead + i] = x.strides()[i];
    } else if (from != 1) {
      throw ShapeError("expand: cannot expand " + to_string(x.shape()) + " to " + to_string(shape) +
                       ": axis " + std::to_string(i) + " has size " + std::to_string(from) + ", not 1");
    }
  }
  return {x.dtype(), shape, strides, x.offset()};
}

// Every copy of a broadcast element contributes: sum the gradient back.
Grads expand_backward(const BackwardArgs& g) { return {sum_to(g.dout, g.inputs[0].shape())}; }

std::vector<GradCase> expand_cases() {
  return {
      {"column", {normal({3, 1})}, [](const std::vector<Tensor>& x) { return expand(x[0], {3, 4}); }},
      {"new_axes", {normal({4})}, [](const std::vector<Tensor>& x) { return expand(x[0], {2, 3, 4}); }},
      {"scalar", {normal({})}, [](const std::vector<Tensor>& x) { return expand(x[0], {2, 3}); }},
  };
}

}  // namespace

extern const OpDef op_expand{
    .name = "expand",
    .summary = "broadcasts size-1 or missing leading axes; a stride-0 view",
    .inputs = {{"x", Diff::yes}},
    .is_view = true,
    .infer = expand_infer,
    .backward = expand_backward,
    .cases = expand_cases,
};

}  // namespace ops

Tensor expand(const Tensor& x, Shape shape) {
  if (shape == x.shape()) return x;
  return apply(ops::op_expand, {x}, Attrs{shape, {}});
}

}  // namespace nabla
