// reshape: the same elements in a new shape. A view of contiguous data; other
// layouts are copied to contiguous first (the only case that needs memory).
#include "core/op.h"

namespace nabla {
namespace ops {
namespace {

Meta reshape_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  Shape shape(attrs.ints.begin(), attrs.ints.end());
  return {x.dtype(), shape, contiguous_strides(shape), x.offset()};
}

Grads reshape_backward(const BackwardArgs& g) { return {reshape(g.dout, g.inputs[0].shape())}; }

std::vector<GradCase> reshape_cases() {
  return {
      {"split_axis", {normal({3, 4})}, [](const std::vector<Tensor>& x) { return reshape(x[0], {3, 2, 2}); }},
      {"flatten", {normal({2, 3, 2})}, [](const std::vector<Tensor>& x) { return reshape(x[0], {-1}); }},
      {"to_scalar", {normal({1, 1})}, [](const std::vector<Tensor>& x) { return reshape(x[0], {}); }},
  };
}

}  // namespace

extern const OpDef op_reshape{
    .name = "reshape",
    .summary = "same elements, new shape (one dimension may be -1); a view of contiguous data",
    .inputs = {{"x", Diff::yes}},
    .is_view = true,
    .infer = reshape_infer,
    .backward = reshape_backward,
    .cases = reshape_cases,
};

}  // namespace ops

Tensor reshape(const Tensor& x, Shape shape) {
  Shape given = shape;  // -1 taken as 1, so that `known` below cannot overflow
  for (int64_t& d : given) d = d == -1 ? 1 : d;
  check_shape(given, dtype_size(x.dtype()), "reshape");
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer_at >= 0) throw ShapeError("reshape: more than one -1 in " + to_string(shape));
      infer_at = static_cast<int>(i);
    } else if (shape[i] < 0) {
      throw ShapeError("reshape: negative dimension in " + to_string(shape));
    } else {
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    if (known == 0 || x.numel() % known != 0) {
      throw ShapeError("reshape: cannot infer -1 reshaping " + to_string(x.shape()) + " to " + to_string(shape));
    }
    shape[infer_at] = x.numel() / known;
  }
  if (numel(shape) != x.numel()) {
    throw ShapeError("reshape: " + to_string(x.shape()) + " has " + std::to_string(x.numel()) +
                     " elements, " + to_string(shape) + " needs " + std::to_string(numel(shape)));
  }
  if (shape == x.shape()) return x;
  Tensor base = x.is_contiguous() ? x : contiguous(x);
  return apply(ops::op_reshape, {base}, Attrs{shape, {}});
}

}  // namespace nabla
