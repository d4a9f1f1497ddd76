// scatter_slice: x placed into zeros of a larger shape at the positions that
// slice(axis, start, stop, step) selects. The adjoint of slice.
// add_slice: base with x added at those positions, in base's memory when base
// dies there: how autodiff sums a slice's gradient into another contribution
// without building the zero-filled full-size tensor.
#include <cstring>

#include "backend/cpu/kernel.h"
#include "backend/cpu/strided.h"
#include "core/op.h"
#include "ops/internal_ops.h"

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
  // Elements moved as unsigned integers of their size: a strided run is a
  // plain loop, not a memcpy call per element.
  auto place = [&]<class E>() {
    a.parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      w.run(b, e, [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
        E* d = reinterpret_cast<E*>(dst) + o[0];
        const E* p = reinterpret_cast<const E*>(src) + o[1];
        for (int64_t i = 0; i < n; ++i) d[i * s[0]] = p[i * s[1]];
      });
    });
  };
  switch (elem) {
    case 1: return place.template operator()<uint8_t>();
    case 2: return place.template operator()<uint16_t>();
    case 4: return place.template operator()<uint32_t>();
    default: return place.template operator()<uint64_t>();
  }
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

// attrs.ints = {axis, start, stop, step}; the full shape is base's.
Meta add_slice_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &base = in[0], &x = in[1];
  require_floating("add_slice", base, "base");
  require_same_dtype("add_slice", base, x);
  int64_t axis = attrs.ints[0], start = attrs.ints[1], stop = attrs.ints[2], step = attrs.ints[3];
  Shape expect = base.shape();
  expect[axis] = stop > start ? (stop - start + step - 1) / step : 0;
  if (x.shape() != expect) {
    throw ShapeError("add_slice: x is " + to_string(x.shape()) + ", the slice of base " + to_string(base.shape()) +
                     " is " + to_string(expect));
  }
  return {base.dtype(), base.shape()};
}

template <class T>
void add_slice_kernel(const KernelArgs& a) {
  const TensorView &base = a.in[0], &x = a.in[1];
  int64_t axis = a.attrs->ints[0], start = a.attrs->ints[1], step = a.attrs->ints[3];
  T* out = a.out.ptr<T>();
  if (base.data != a.out.data) copy_to_contiguous(a, base, out);  // not run in place: base first
  Strides dst = contiguous_strides(a.out.shape);
  T* slice_start = out + start * dst[axis];
  dst[axis] *= step;
  const T* xp = x.ptr<T>();
  cpu::Walker<2> w(x.shape, {&dst, &x.strides});
  a.parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
      for (int64_t i = 0; i < n; ++i) slice_start[o[0] + i * s[0]] += xp[o[1] + i * s[1]];
    });
  });
}

void add_slice_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "add_slice", [&]<class T>() { add_slice_kernel<T>(a); });
}

Tensor add_slice_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  const auto& a = attrs.ints;
  return in[0] + scatter_slice(in[1], in[0].shape(), a[0], a[1], a[2], a[3]);
}

Grads add_slice_backward(const BackwardArgs& g) {
  const auto& a = g.attrs.ints;
  return {g.dout, slice(g.dout, a[0], a[1], a[2], a[3])};
}

std::vector<GradCase> add_slice_cases() {
  return {
      {"step", {normal({3, 5}), normal({3, 2})},
       [](const std::vector<Tensor>& x) { return add_slice(x[0], x[1], 1, 1, 5, 2); }},
      {"rows", {normal({2, 4, 3}), normal({2, 2, 3})},
       [](const std::vector<Tensor>& x) { return add_slice(x[0], x[1], 1, 2, 4, 1); }},
  };
}

}  // namespace

extern const OpDef op_add_slice{
    .name = "add_slice",
    .summary = "base with x added at a slice's positions (autodiff's sum of slice gradients); fused",
    .inputs = {{"base", Diff::yes}, {"x", Diff::yes}},
    .inplace_input = 0,
    .fused = true,
    .infer = add_slice_infer,
    .backward = add_slice_backward,
    .composite = add_slice_composite,
    .cases = add_slice_cases,
};
NABLA_CPU_KERNEL(op_add_slice, add_slice_forward);

extern const OpDef op_scatter_slice{
    .name = "scatter_slice",
    .summary = "x placed into zeros at a slice's positions: the adjoint of slice",
    .inputs = {{"x", Diff::yes}},
    .infer = scatter_slice_infer,
    .backward = scatter_slice_backward,
    .cases = scatter_slice_cases,
};
NABLA_CPU_KERNEL(op_scatter_slice, scatter_slice_forward);

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

Tensor add_slice(const Tensor& base, const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step) {
  if (!base.defined() || !x.defined()) throw UsageError("add_slice: an operand is an undefined tensor");
  int a = normalize_axis(axis, base.rank(), "add_slice");
  if (step <= 0) throw ShapeError("add_slice: step must be positive, got " + std::to_string(step));
  const int64_t n = base.dim(a);
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  start = std::clamp<int64_t>(start, 0, n);
  stop = std::clamp<int64_t>(stop, start, n);
  return apply(ops::op_add_slice, {base, x}, Attrs{{a, start, stop, step}, {}});
}

}  // namespace nabla
