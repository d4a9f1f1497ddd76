// transpose: swaps two axes (the last two by default); a view.
#include "core/op.h"

namespace nabla {
namespace ops {
namespace {

Meta transpose_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  Shape shape = x.shape();
  Strides strides = x.strides();
  std::swap(shape[attrs.ints[0]], shape[attrs.ints[1]]);
  std::swap(strides[attrs.ints[0]], strides[attrs.ints[1]]);
  return {x.dtype(), shape, strides, x.offset()};
}

// A swap is its own inverse.
Grads transpose_backward(const BackwardArgs& g) {
  return {transpose(g.dout, g.attrs.ints[0], g.attrs.ints[1])};
}

std::vector<GradCase> transpose_cases() {
  return {
      {"matrix", {normal({3, 5})}, [](const std::vector<Tensor>& x) { return transpose(x[0]); }},
      {"outer_axes", {normal({2, 3, 4})}, [](const std::vector<Tensor>& x) { return transpose(x[0], 0, 2); }},
  };
}

}  // namespace

extern const OpDef op_transpose{
    .name = "transpose",
    .summary = "swaps two axes (the last two by default); a view",
    .inputs = {{"x", Diff::yes}},
    .is_view = true,
    .infer = transpose_infer,
    .backward = transpose_backward,
    .cases = transpose_cases,
};

}  // namespace ops

Tensor transpose(const Tensor& x, int64_t axis0, int64_t axis1) {
  if (x.rank() < 2) throw ShapeError("transpose: x must have at least 2 axes, got " + to_string(x.shape()));
  int a = normalize_axis(axis0, x.rank(), "transpose");
  int b = normalize_axis(axis1, x.rank(), "transpose");
  if (a == b) return x;
  return apply(ops::op_transpose, {x}, Attrs{{std::min(a, b), std::max(a, b)}, {}});
}

}  // namespace nabla
