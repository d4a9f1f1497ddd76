// pad: x surrounded by a constant, (before, after) elements on each axis.
// attrs: ints {before0, after0, before1, after1, ...}, reals {value}.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

Meta pad_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  require_floating("pad", x, "x");
  if (attrs.ints.size() != 2 * static_cast<size_t>(x.rank())) {
    throw ShapeError("pad: expected one (before, after) pair per axis of x " +
                     to_string(x.shape()) + ", got " + std::to_string(attrs.ints.size() / 2));
  }
  Shape shape = x.shape();
  for (int d = 0; d < x.rank(); ++d) {
    int64_t before = attrs.ints[2 * d], after = attrs.ints[2 * d + 1];
    if (before < 0 || after < 0) {
      throw ShapeError("pad: padding must be >= 0, got (" + std::to_string(before) + ", " +
                       std::to_string(after) + ") on axis " + std::to_string(d));
    }
    shape[d] += before + after;
  }
  return {x.dtype(), shape};
}

template <class T>
void pad_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  T* out = a.out.ptr<T>();
  const T* xp = x.ptr<T>();
  T value = static_cast<T>(a.attrs->reals[0]);
  a.parallel_for(a.out.numel(), kElementwiseGrain,
                 [&](int64_t b, int64_t e) { std::fill(out + b, out + e, value); });
  // Then x into the interior: out's strides from the interior's first element.
  Strides os = contiguous_strides(a.out.shape);
  int64_t start = 0;
  for (size_t d = 0; d < os.size(); ++d) start += a.attrs->ints[2 * d] * os[d];
  cpu::Walker<2> w(x.shape, {&os, &x.strides});
  a.parallel_for(x.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
      for (int64_t i = 0; i < n; ++i) out[start + o[0] + i * s[0]] = xp[o[1] + i * s[1]];
    });
  });
}

void pad_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "pad", [&]<class T>() { pad_kernel<T>(a); });
}

// The padding is constant: dx is dout's interior (a view, no copy).
Grads pad_backward(const BackwardArgs& g) {
  Tensor dx = g.dout;
  const Shape& shape = g.inputs[0].shape();
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t before = g.attrs.ints[2 * d];
    dx = slice(dx, static_cast<int64_t>(d), before, before + shape[d]);
  }
  return {dx};
}

std::vector<GradCase> pad_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"matrix",
       {normal({3, 4})},
       [](X x) {
         return pad(x[0], {{1, 2}, {0, 3}});
       }},
      {"rank3_value",
       {normal({2, 3, 2})},
       [](X x) {
         return pad(x[0], {{0, 1}, {2, 0}, {1, 1}}, -1.5);
       }},
      {"vector",
       {normal({5})},
       [](X x) {
         return pad(x[0], {{2, 1}}, 3.0);
       }},
  };
}

}  // namespace

extern const OpDef op_pad{
    .name = "pad",
    .summary = "constant padding: (before, after) elements of `value` on each axis",
    .inputs = {{"x", Diff::yes}},
    .infer = pad_infer,
    .backward = pad_backward,
    .cases = pad_cases,
};
NABLA_CPU_KERNEL(op_pad, pad_forward);

}  // namespace ops

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, double value) {
  std::vector<int64_t> flat;
  for (const auto& [before, after] : pads) {
    flat.push_back(before);
    flat.push_back(after);
  }
  return apply(ops::op_pad, {x}, Attrs{flat, {value}});
}

}  // namespace nabla
