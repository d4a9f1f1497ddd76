// The elementwise ops on the GPU: out[i] = f(inputs at i), inputs of any
// strides broadcast NumPy-style against the contiguous output, computed in
// the output's dtype (f32 or f64). One grid-stride kernel per arity; each
// op is a functor.
#include <array>

#include "backend/cuda/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_gelu, op_gelu_back, op_gelu_erf, op_gelu_erf_back, op_gelu_quick, op_gelu_quick_back;
extern const OpDef op_abs, op_add, op_cast, op_clamp, op_div, op_elu, op_eq, op_erf, op_exp, op_hardswish, op_leaky_relu,
    op_log, op_mul, op_neg, op_relu, op_rsqrt, op_scale, op_sigmoid, op_sign, op_silu, op_softplus, op_sqrt,
    op_square, op_step, op_sub, op_tanh, op_where;
}  // namespace ops

namespace NABLA_GPU {
namespace {

// An op's real attributes (scale's factor, clamp's bounds, ...).
struct Params {
  double r0 = 0, r1 = 0;
};

// An input as the kernel reads it: contiguous in the output's order, or
// through its (broadcast) strides.
struct In {
  View view;
  bool dense;
};
__device__ __forceinline__ int64_t at(const In& x, int64_t i) { return x.dense ? i : offset_of(x.view, i); }

// The op's inputs against its output's shape, their axes coalesced together.
template <size_t N>
std::array<In, N> inputs(const Operands& a) {
  std::array<In, N> in;
  View* views[N];
  for (size_t k = 0; k < N; ++k) {
    const TensorView& v = a.in[k];
    in[k] = {broadcast_view(v, a.out.shape), v.contiguous && v.shape == a.out.shape};
    views[k] = &in[k].view;
  }
  coalesce(views, int(N));
  return in;
}

template <class T, class F>
__global__ void unary_kernel(int64_t n, T* out, In x, Params p) {
  NABLA_GRID_STRIDE(i, n) out[i] = F::apply(load<T>(x.view, at(x, i)), p);
}
template <class T, class F>
__global__ void binary_kernel(int64_t n, T* out, In x, In y) {
  NABLA_GRID_STRIDE(i, n) out[i] = F::apply(load<T>(x.view, at(x, i)), load<T>(y.view, at(y, i)));
}
template <class T>
__global__ void where_kernel(int64_t n, T* out, In c, In x, In y) {
  NABLA_GRID_STRIDE(i, n) {
    out[i] = load<double>(c.view, at(c, i)) != 0 ? load<T>(x.view, at(x, i)) : load<T>(y.view, at(y, i));
  }
}

template <class F>
void unary(const Operands& a, const Context& ctx) {
  Params p;
  if (!a.attrs->reals.empty()) p.r0 = a.attrs->reals[0];
  if (a.attrs->reals.size() > 1) p.r1 = a.attrs->reals[1];
  const int64_t n = a.out.numel();
  if (n == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), unary_kernel<T, F>, n, a.out.ptr<T>(), inputs<1>(a)[0], p);
  });
}
template <class F>
void binary(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    const std::array<In, 2> in = inputs<2>(a);
    launch(ctx, elementwise_launch(n), binary_kernel<T, F>, n, a.out.ptr<T>(), in[0], in[1]);
  });
}
void where(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    const std::array<In, 3> in = inputs<3>(a);
    launch(ctx, elementwise_launch(n), where_kernel<T>, n, a.out.ptr<T>(), in[0], in[1], in[2]);
  });
}

template <class T>
__device__ __forceinline__ T sigmoid(T x) {
  return T(1) / (T(1) + gpu_math::exp(-x));
}

#define UNARY(Name, expr)                                   \
  struct Name {                                             \
    template <class T>                                      \
    __device__ static T apply(T x, const Params& p) {       \
      (void)p;                                              \
      return (expr);                                        \
    }                                                       \
  };
#define BINARY(Name, expr)                        \
  struct Name {                                   \
    template <class T>                            \
    __device__ static T apply(T x, T y) {         \
      return (expr);                              \
    }                                             \
  };

UNARY(Abs, gpu_math::abs(x))
UNARY(Neg, -x)
UNARY(Exp, gpu_math::exp(x))
UNARY(Log, gpu_math::log(x))
UNARY(Sqrt, gpu_math::sqrt(x))
UNARY(Rsqrt, T(1) / gpu_math::sqrt(x))
UNARY(Square, x * x)
// Loaded as the output's dtype: the cast itself.
UNARY(Cast, x)
UNARY(Tanh, gpu_math::tanh(x))
UNARY(Erf, gpu_math::erf(x))
UNARY(Sigmoid, sigmoid(x))
UNARY(Silu, x * sigmoid(x))
UNARY(Relu, x > T(0) ? x : T(0))
UNARY(Step, x > T(0) ? T(1) : T(0))
UNARY(Sign, T((x > T(0)) - (x < T(0))))
UNARY(Hardswish, x <= T(-3) ? T(0) : x >= T(3) ? x : x * (x + T(3)) / T(6))
UNARY(Scale, x * T(p.r0))
UNARY(Clamp, x < T(p.r0) ? T(p.r0) : x > T(p.r1) ? T(p.r1) : x)
UNARY(Elu, x > T(0) ? x : T(p.r0) * gpu_math::expm1(x))
UNARY(LeakyRelu, x > T(0) ? x : T(p.r0) * x)
// softplus(x) = log(1 + e^(beta x)) / beta, and x where beta x > threshold.
UNARY(Softplus, x * T(p.r0) > T(p.r1) ? x : gpu_math::log1p(gpu_math::exp(x * T(p.r0))) / T(p.r0))
BINARY(Add, x + y)
BINARY(Sub, x - y)
BINARY(Mul, x * y)
BINARY(Div, x / y)
BINARY(Eq, x == y ? T(1) : T(0))

// The GELU family (src/ops/gelu*.cpp): forward f(x), backward dy f'(x).
template <class T>
__device__ __forceinline__ T gelu_inner(T x) {  // k (x + a x^3)
  return T(0.7978845608028654) * (x + T(0.044715) * x * x * x);
}
UNARY(Gelu, T(0.5) * x * (T(1) + gpu_math::tanh(gelu_inner(x))))
BINARY(GeluBack, y * (T(0.5) * (T(1) + gpu_math::tanh(gelu_inner(x))) +
                      T(0.5) * x * (T(1) - gpu_math::tanh(gelu_inner(x)) * gpu_math::tanh(gelu_inner(x))) *
                          T(0.7978845608028654) * (T(1) + T(3) * T(0.044715) * x * x)))
UNARY(GeluErf, T(0.5) * x * (T(1) + gpu_math::erf(x * T(0.7071067811865476))))
BINARY(GeluErfBack, y * (T(0.5) * (T(1) + gpu_math::erf(x * T(0.7071067811865476))) +
                         x * gpu_math::exp(-T(0.5) * x * x) * T(0.3989422804014327)))
UNARY(GeluQuick, x * sigmoid(T(1.702) * x))
BINARY(GeluQuickBack, y * (sigmoid(T(1.702) * x) + T(1.702) * x * sigmoid(T(1.702) * x) * (T(1) - sigmoid(T(1.702) * x))))

#undef UNARY
#undef BINARY

}  // namespace

void register_elementwise_kernels() {
  register_kernel(ops::op_abs, unary<Abs>);
  register_kernel(ops::op_neg, unary<Neg>);
  register_kernel(ops::op_exp, unary<Exp>);
  register_kernel(ops::op_log, unary<Log>);
  register_kernel(ops::op_sqrt, unary<Sqrt>);
  register_kernel(ops::op_rsqrt, unary<Rsqrt>);
  register_kernel(ops::op_square, unary<Square>);
  register_kernel(ops::op_cast, unary<Cast>);
  register_kernel(ops::op_tanh, unary<Tanh>);
  register_kernel(ops::op_erf, unary<Erf>);
  register_kernel(ops::op_sigmoid, unary<Sigmoid>);
  register_kernel(ops::op_silu, unary<Silu>);
  register_kernel(ops::op_relu, unary<Relu>);
  register_kernel(ops::op_step, unary<Step>);
  register_kernel(ops::op_sign, unary<Sign>);
  register_kernel(ops::op_hardswish, unary<Hardswish>);
  register_kernel(ops::op_scale, unary<Scale>);
  register_kernel(ops::op_clamp, unary<Clamp>);
  register_kernel(ops::op_elu, unary<Elu>);
  register_kernel(ops::op_leaky_relu, unary<LeakyRelu>);
  register_kernel(ops::op_softplus, unary<Softplus>);
  register_kernel(ops::op_add, binary<Add>);
  register_kernel(ops::op_sub, binary<Sub>);
  register_kernel(ops::op_mul, binary<Mul>);
  register_kernel(ops::op_div, binary<Div>);
  register_kernel(ops::op_eq, binary<Eq>);
  register_kernel(ops::op_where, where);
  register_kernel(ops::op_gelu, unary<Gelu>);
  register_kernel(ops::op_gelu_back, binary<GeluBack>);
  register_kernel(ops::op_gelu_erf, unary<GeluErf>);
  register_kernel(ops::op_gelu_erf_back, binary<GeluErfBack>);
  register_kernel(ops::op_gelu_quick, unary<GeluQuick>);
  register_kernel(ops::op_gelu_quick_back, binary<GeluQuickBack>);
}

}  // namespace NABLA_GPU
}  // namespace nabla
