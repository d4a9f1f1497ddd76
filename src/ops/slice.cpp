// slice: positions start, start + step, ... < stop along one axis; a view.
#include "core/op.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

// attrs.ints = {axis, start, stop, step}, already clamped.
Meta slice_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  int64_t axis = attrs.ints[0], start = attrs.ints[1], stop = attrs.ints[2], step = attrs.ints[3];
  Shape shape = x.shape();
  Strides strides = x.strides();
  shape[axis] = stop > start ? (stop - start + step - 1) / step : 0;
  int64_t offset = x.offset() + start * strides[axis];
  strides[axis] *= step;
  return {x.dtype(), shape, strides, offset};
}

Grads slice_backward(const BackwardArgs& g) {
  const auto& a = g.attrs.ints;
  return {scatter_slice(g.dout, g.inputs[0].shape(), a[0], a[1], a[2], a[3])};
}

std::vector<GradCase> slice_cases() {
  return {
      {"middle", {normal({5, 4})}, [](const std::vector<Tensor>& x) { return slice(x[0], 0, 1, 4); }},
      {"step", {normal({3, 7})}, [](const std::vector<Tensor>& x) { return slice(x[0], 1, 1, 7, 3); }},
      {"negative_bounds", {normal({2, 6, 2})},
       [](const std::vector<Tensor>& x) { return slice(x[0], 1, -4, -1, 2); }},
  };
}

}  // namespace

extern const OpDef op_slice{
    .name = "slice",
    .summary = "positions start:stop:step of one axis (negative bounds count from the end); a view",
    .inputs = {{"x", Diff::yes}},
    .is_view = true,
    .infer = slice_infer,
    .backward = slice_backward,
    .cases = slice_cases,
};

}  // namespace ops

// Python's rules: negative bounds count from the end, out-of-range bounds clamp.
static void normalize_slice(const char* op, int64_t size, int64_t& start, int64_t& stop, int64_t step) {
  if (step <= 0) throw ShapeError(std::string(op) + ": step must be positive, got " + std::to_string(step));
  if (start < 0) start += size;
  if (stop < 0) stop += size;
  start = std::clamp<int64_t>(start, 0, size);
  stop = std::clamp<int64_t>(stop, start, size);
}

Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step) {
  int a = normalize_axis(axis, x.rank(), "slice");
  normalize_slice("slice", x.shape()[a], start, stop, step);
  if (start == 0 && stop == x.shape()[a] && step == 1) return x;
  return apply(ops::op_slice, {x}, Attrs{{a, start, stop, step}, {}});
}

}  // namespace nabla
