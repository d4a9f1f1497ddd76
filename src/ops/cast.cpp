// cast: x's values in another dtype: f32 <-> f64 (rounded to nearest), and
// i32 -> f32 or f64 (indices, counts; not differentiated). Casting to x's
// own dtype is x itself, no node.
#include "backend/cpu/kernel.h"
#include "backend/cpu/strided.h"
#include "core/op.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {
namespace {

Meta cast_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const DType to = static_cast<DType>(attrs.ints[0]);
  if (!is_floating(to)) {
    throw DTypeError(std::string("cast: the target dtype must be f32 or f64, got ") + dtype_name(to));
  }
  const DType from = in[0].dtype();
  if (!is_floating(from) && from != DType::i32) {
    throw DTypeError(std::string("cast: x must be f32, f64 or i32, got ") + dtype_name(from));
  }
  return {to, in[0].shape()};
}

template <class From, class To>
void cast_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const From* xp = x.ptr<From>();
  To* out = a.out.ptr<To>();
  const int64_t n = a.out.numel();
  if (x.contiguous) {
    a.parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = static_cast<To>(xp[i]);
    });
    return;
  }
  Strides os = contiguous_strides(a.out.shape);
  cpu::Walker<2> w(a.out.shape, {&os, &x.strides});
  a.parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 2>& o, int64_t len, const std::array<int64_t, 2>& s) {
      for (int64_t i = 0; i < len; ++i) out[o[0] + i] = static_cast<To>(xp[o[1] + i * s[1]]);
    });
  });
}

template <class From>
void cast_from(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "cast", [&]<class To>() { cast_kernel<From, To>(a); });
}

void cast_forward(const KernelArgs& a) {
  if (a.in[0].dtype == DType::i32) return cast_from<int32_t>(a);
  dispatch_floating(a.in[0].dtype, "cast", [&]<class From>() { cast_from<From>(a); });
}

// The derivative of a rounding cast is taken as 1: dx = dout in x's dtype.
Grads cast_backward(const BackwardArgs& g) {
  const DType from = g.inputs[0].dtype();
  if (!is_floating(from)) {
    throw DTypeError(std::string("cast: an ") + dtype_name(from) + " input has no gradient");
  }
  return {cast(g.dout, from)};
}

// Built so that the f64 run of a case (where a cast to f64 is no node) and the
// f32 run (where it is) both compare with finite differences of f64 math.
std::vector<GradCase> cast_cases() {
  return {
      // f32 -> f64 -> f32 is exact; the gradient passes both casts back.
      {"round_trip", {normal({3, 4})},
       [](const std::vector<Tensor>& x) { return cast(cast(x[0], DType::f64), x[0].dtype()); }},
      // Math done in f64 between the casts: a gradient that is not just dout.
      {"widened", {normal({2, 3, 4})},
       [](const std::vector<Tensor>& x) { return cast(square(cast(x[0], DType::f64)), x[0].dtype()); }},
      // i32 -> floating, a real node in both runs; x differentiated through mul.
      {"from_i32", {integers({4, 3}, -5, 5), normal({4, 3})},
       [](const std::vector<Tensor>& x) { return cast(x[0], x[1].dtype()) * x[1]; }},
  };
}

}  // namespace

extern const OpDef op_cast{
    .name = "cast",
    .summary = "x in another dtype: f32 <-> f64, rounded to nearest; i32 -> f32/f64 (not differentiated)",
    .inputs = {{"x", Diff::yes}},
    .elementwise = true,
    .infer = cast_infer,
    .backward = cast_backward,
    .cases = cast_cases,
};
NABLA_CPU_KERNEL(op_cast, cast_forward);

}  // namespace ops

Tensor cast(const Tensor& x, DType dtype) {
  if (x.defined() && x.dtype() == dtype) return x;
  return apply(ops::op_cast, {x}, Attrs{{static_cast<int64_t>(dtype)}, {}});
}

}  // namespace nabla
