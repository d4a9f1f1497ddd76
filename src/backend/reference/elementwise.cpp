// Reference kernels of the elementwise ops: out[i] = f(inputs at i), the
// inputs broadcast NumPy-style, computed in double and rounded once.
#include <array>
#include <cmath>

#include "backend/reference/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_abs, op_add, op_cast, op_clamp, op_div, op_elu, op_eq, op_erf, op_exp, op_hardswish, op_leaky_relu,
    op_log, op_mul, op_neg, op_relu, op_rsqrt, op_scale, op_sigmoid, op_sign, op_silu, op_softplus, op_sqrt,
    op_square, op_step, op_sub, op_tanh, op_where;
}  // namespace ops

namespace reference {
namespace {

// At most three operands (where's).
using Args = std::array<double, 3>;

template <class F>
void map(const Operands& a, F f) {
  for_each_index(a.out.shape, [&](const Index& i) {
    Args x{};
    for (size_t k = 0; k < a.in.size(); ++k) x[k] = get(a.in[k], broadcast_index(a.in[k], i));
    set(a.out, i, f(x, *a.attrs));
  });
}
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

#define UNARY(name, expr)                                                                           \
  void name(const Operands& a) {                                                                    \
    map(a, [](const Args& in, const Attrs& attrs) { const double x = in[0]; (void)attrs; return (expr); }); \
  }
#define BINARY(name, expr)                                                                        \
  void name(const Operands& a) {                                                                  \
    map(a, [](const Args& in, const Attrs&) { const double x = in[0], y = in[1]; return (expr); }); \
  }

UNARY(abs_kernel, std::fabs(x))
UNARY(neg_kernel, -x)
UNARY(exp_kernel, std::exp(x))
UNARY(log_kernel, std::log(x))
UNARY(sqrt_kernel, std::sqrt(x))
UNARY(rsqrt_kernel, 1 / std::sqrt(x))
UNARY(square_kernel, x * x)
// Read as double, stored rounded to the output's dtype: the cast itself.
UNARY(cast_kernel, x)
UNARY(tanh_kernel, std::tanh(x))
UNARY(erf_kernel, std::erf(x))
UNARY(sigmoid_kernel, sigmoid(x))
UNARY(silu_kernel, x * sigmoid(x))
UNARY(relu_kernel, x > 0 ? x : 0.0)
UNARY(step_kernel, x > 0 ? 1.0 : 0.0)
UNARY(sign_kernel, double((x > 0) - (x < 0)))
UNARY(hardswish_kernel, x <= -3 ? 0.0 : x >= 3 ? x : x * (x + 3) / 6)
UNARY(scale_kernel, x * attrs.reals[0])
UNARY(clamp_kernel, x < attrs.reals[0] ? attrs.reals[0] : x > attrs.reals[1] ? attrs.reals[1] : x)
UNARY(elu_kernel, x > 0 ? x : attrs.reals[0] * std::expm1(x))
UNARY(leaky_relu_kernel, x > 0 ? x : attrs.reals[0] * x)
// softplus(x) = log(1 + e^(beta x)) / beta, and x where beta x > threshold.
UNARY(softplus_kernel, x * attrs.reals[0] > attrs.reals[1] ? x : std::log1p(std::exp(x * attrs.reals[0])) / attrs.reals[0])
BINARY(add_kernel, x + y)
BINARY(sub_kernel, x - y)
BINARY(mul_kernel, x * y)
BINARY(div_kernel, x / y)
BINARY(eq_kernel, x == y ? 1.0 : 0.0)

void where_kernel(const Operands& a) {
  map(a, [](const Args& in, const Attrs&) { return in[0] != 0 ? in[1] : in[2]; });
}

#undef UNARY
#undef BINARY

}  // namespace

void register_elementwise_kernels() {
  register_kernel(ops::op_abs, abs_kernel);
  register_kernel(ops::op_neg, neg_kernel);
  register_kernel(ops::op_exp, exp_kernel);
  register_kernel(ops::op_log, log_kernel);
  register_kernel(ops::op_sqrt, sqrt_kernel);
  register_kernel(ops::op_rsqrt, rsqrt_kernel);
  register_kernel(ops::op_square, square_kernel);
  register_kernel(ops::op_cast, cast_kernel);
  register_kernel(ops::op_tanh, tanh_kernel);
  register_kernel(ops::op_erf, erf_kernel);
  register_kernel(ops::op_sigmoid, sigmoid_kernel);
  register_kernel(ops::op_silu, silu_kernel);
  register_kernel(ops::op_relu, relu_kernel);
  register_kernel(ops::op_step, step_kernel);
  register_kernel(ops::op_sign, sign_kernel);
  register_kernel(ops::op_hardswish, hardswish_kernel);
  register_kernel(ops::op_scale, scale_kernel);
  register_kernel(ops::op_clamp, clamp_kernel);
  register_kernel(ops::op_elu, elu_kernel);
  register_kernel(ops::op_leaky_relu, leaky_relu_kernel);
  register_kernel(ops::op_softplus, softplus_kernel);
  register_kernel(ops::op_add, add_kernel);
  register_kernel(ops::op_sub, sub_kernel);
  register_kernel(ops::op_mul, mul_kernel);
  register_kernel(ops::op_div, div_kernel);
  register_kernel(ops::op_eq, eq_kernel);
  register_kernel(ops::op_where, where_kernel);
}

}  // namespace reference
}  // namespace nabla
