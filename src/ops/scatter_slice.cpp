// scatter_slice: x placed into zeros of a larger shape at the positions that
// slice(axis, start, stop, step) selects. The adjoint of slice.
#include "backend/cpu/strided.h"
#include "core/op.h"

namespace nabla {
namespace ops {
namespace {

// attrs.ints = {axis, start, stop, step, full shape...}
Shape full_shape(const Attrs& a) { return Shape(a.ints.begin() + 4, a.ints.end()); }

Meta scatter_slice_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  Shape full = full_shape(attrs);
  int64_t axis = attrs.ints[0], start = attrs.ints[1], stop = attrs.ints[2], step = attrs.ints[3];
  Shape expect = full;
  expect[axis] = stop > start ? (stop - start + step - 1) / step : 0;
  if (x.shape() != expect) {
    throw ShapeError("scatter_slice: x is " + to_string(x.shape()) + ", the slice of " + to_string(full) +
                     " is " + to_string(expect));
  }
  return {x.dtype(), full};
}

void scatter_slice_forward(const KernelArgs& a) {
  const auto& at = a.attrs->ints;
  int64_t axis = at[0], start = at[1], step = at[3];
  const TensorView& x = a.in[0];
  size_t elem = dtype_size(x.dtype);
  std::memset(a.out.data, 0, a.out.numel() * elem);
  // The destination is a strided view of the output: the slice's layout.
  Strides dst_strides = contiguous_strides(a.out.shape);
  char* dst = static_cast<char*>(a.out.data) + start * dst_strides[axis] * elem;
  dst_strides[axis] *= step;
  cpu::Walker<2> w(x.shape, {&dst_strides, &x.strides});
  auto* src = static_cast<const char*>(x.data);
  a.parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(dst + (o[0] + i * s[0]) * elem, src + (o[1] + i * s[1]) * elem, elem);
      }
    });
  });
}

Grads scatter_slice_backward(const BackwardArgs& g) {
  const auto& a = g.attrs.ints;
  return {slice(g.dout, a[0], a[1], a[2], a[3])};
}

std::vector<GradCase> scatter_slice_cases() {
  return {
      {"step", {normal({3, 2})},
       [](const std::vector<Tensor>& x) { return scatter_slice(x[0], {3, 5}, 1, 1, 5, 2); }},
      {"rows", {normal({2, 2, 3})},
       [](const std::vector<Tensor>& x) { return scatter_slice(x[0], {2, 4, 3}, 1, 2, 4, 1); }},
  };
}

}  // namespace

extern const OpDef op_scatter_slice{
    .name = "scatter_slice",
    .summary = "x placed into zeros at a slice's positions: the adjoint of slice",
    .inputs = {{"x", Diff::yes}},
    .infer = scatter_slice_infer,
    .forward = scatter_slice_forward,
    .backward = scatter_slice_backward,
    .cases = scatter_slice_cases,
};

}  // namespace ops

Tensor scatter_slice(const Tensor& x, Shape full, int64_t axis, int64_t start, int64_t stop, int64_t step) {
  check_shape(full, dtype_size(x.dtype()), "scatter_slice");
  int a = normalize_axis(axis, static_cast<int>(full.size()), "scatter_slice");
  if (step <= 0) throw ShapeError("scatter_slice: step must be positive, got " + std::to_string(step));
  if (start < 0) start += full[a];
  if (stop < 0) stop += full[a];
  start = std::clamp<int64_t>(start, 0, full[a]);
  stop = std::clamp<int64_t>(stop, start, full[a]);
  Attrs attrs{{a, start, stop, step}, {}};
  attrs.ints.insert(attrs.ints.end(), full.begin(), full.end());
  return apply(ops::op_scatter_slice, {x}, attrs);
}

}  // namespace nabla
