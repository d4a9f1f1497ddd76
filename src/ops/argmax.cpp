// argmax: the i32 position of the maximum along one axis; the first one on
// ties, and the first NaN if any (NumPy's rule). Piecewise constant, so x is
// not differentiated. attrs: ints {axis, keepdim}.
#include "backend/cpu/kernel.h"
#include "backend/cpu/strided.h"
#include "core/op.h"

namespace nabla {
namespace ops {
namespace {

Meta argmax_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  require_floating("argmax", x, "x");
  int64_t axis = attrs.ints[0];
  if (x.dim(axis) == 0)
    throw ShapeError("argmax: axis " + std::to_string(axis) + " of " + to_string(x.shape()) +
                     " is empty");
  Shape shape = x.shape();
  if (attrs.ints[1])
    shape[axis] = 1;
  else
    shape.erase(shape.begin() + axis);
  return {DType::i32, shape};
}

template <class T>
void argmax_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  size_t axis = static_cast<size_t>(a.attrs->ints[0]);
  Shape kept = x.shape;
  Strides kept_strides = x.strides;
  kept.erase(kept.begin() + axis);
  kept_strides.erase(kept_strides.begin() + axis);
  int64_t len = x.shape[axis], stride = x.strides[axis];
  cpu::Walker<1> w(kept, {&kept_strides});
  const T* xp = x.ptr<T>();
  int32_t* out = a.out.ptr<int32_t>();
  a.parallel_for(a.out.numel(), std::max<int64_t>(1, (1 << 15) / len), [&](int64_t b, int64_t e) {
    int64_t j = b;  // runs arrive in row-major order of the output
    w.run(b, e, [&](const std::array<int64_t, 1>& o, int64_t n, const std::array<int64_t, 1>& s) {
      for (int64_t i = 0; i < n; ++i) {
        const T* p = xp + o[0] + i * s[0];
        int64_t best = 0;
        T v = p[0];
        for (int64_t k = 1; k < len && v == v; ++k) {
          T c = p[k * stride];
          if (c > v || c != c) {
            v = c;
            best = k;
          }
        }
        out[j++] = static_cast<int32_t>(best);
      }
    });
  });
}

void argmax_forward(const KernelArgs& a) {
  dispatch_floating(a.in[0].dtype, "argmax", [&]<class T>() { argmax_kernel<T>(a); });
}

// The output is i32: each case looks up rows of a floating table with it, so
// the checker compares the f32 and f64 choices (and has a value to check).
std::vector<GradCase> argmax_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"last_axis",
       {constant(normal({3, 5})), normal({5, 2})},
       [](X x) { return get_rows(x[1], argmax(x[0], -1)); }},
      {"first_axis_keepdim",
       {constant(normal({4, 3})), normal({4, 2})},
       [](X x) { return get_rows(x[1], argmax(x[0], 0, true)); }},
      {"middle_axis",
       {constant(normal({2, 4, 3})), normal({4})},
       [](X x) { return get_rows(x[1], argmax(x[0], 1)); }},
  };
}

}  // namespace

extern const OpDef op_argmax{
    .name = "argmax",
    .summary = "i32 index of the maximum along an axis (first on ties); not differentiated",
    .inputs = {{"x", Diff::no}},
    .infer = argmax_infer,
    .cases = argmax_cases,
};
NABLA_CPU_KERNEL(op_argmax, argmax_forward);

}  // namespace ops

Tensor argmax(const Tensor& x, int64_t axis, bool keepdim) {
  if (!x.defined()) throw UsageError("argmax: x is an undefined tensor");
  int a = normalize_axis(axis, x.rank(), "argmax");
  return apply(ops::op_argmax, {x}, Attrs{{a, keepdim ? 1 : 0}, {}});
}

}  // namespace nabla
