// log_softmax: x - log(sum(exp(x))) over the last axis, computed as
// (x - max) - log(sum(exp(x - max))) so no exp() overflows.
#include <cmath>
#include <limits>

#include "backend/cpu/kernel.h"
#include "ops/last_axis.h"

namespace nabla {
namespace ops {
namespace {

Meta log_softmax_infer(const std::vector<Tensor>& in, const Attrs&) {
  require_floating("log_softmax", in[0], "x");
  if (in[0].rank() < 1) throw ShapeError("log_softmax: x must have at least 1 axis, got a scalar");
  return {in[0].dtype(), in[0].shape()};
}

template <class T>
void log_softmax_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  RowWalker<1> rows(a.out.shape, {x.strides});
  int64_t len = rows.len(), xs = rows.inner(0);
  const T* xp = x.ptr<T>();
  T* out = a.out.ptr<T>();
  a.parallel_for(rows.rows(), row_grain(len), [&](int64_t b, int64_t e) {
    rows.run(b, e, [&](int64_t r, const std::array<int64_t, 1>& o) {
      const T* xr = xp + o[0];
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < len; ++j) {
        double v = xr[j * xs];
        mx = (v > mx || v != v) ? v : mx;
      }
      double total = 0;
      for (int64_t j = 0; j < len; ++j) total += std::exp(double(xr[j * xs]) - mx);
      double lse = std::log(total);
      T* y = out + r * len;
      for (int64_t j = 0; j < len; ++j) y[j] = static_cast<T>((double(xr[j * xs]) - mx) - lse);
    });
  });
}

void log_softmax_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "log_softmax", [&]<class T>() { log_softmax_kernel<T>(a); });
}

// dx = dy - softmax(x) * sum(dy), with softmax(x) = exp(y).
Grads log_softmax_backward(const BackwardArgs& g) {
  return {g.dout - exp(g.out) * sum(g.dout, {-1}, true)};
}

Tensor log_softmax_composite(const std::vector<Tensor>& in, const Attrs&) {
  Tensor z = in[0] - max(in[0], {-1}, true);
  return z - log(sum(exp(z), {-1}, true));
}

std::vector<GradCase> log_softmax_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"matrix", {normal({3, 5})}, [](X x) { return log_softmax(x[0]); }},
      {"vector", {normal({6})}, [](X x) { return log_softmax(x[0]); }},
      {"rank3", {normal({2, 3, 4})}, [](X x) { return log_softmax(x[0]); }},
      // exp(x) alone would overflow f32 here.
      {"large_logits", {uniform({3, 4}, 80, 120)}, [](X x) { return log_softmax(x[0]); }},
  };
}

}  // namespace

extern const OpDef op_log_softmax{
    .name = "log_softmax",
    .summary = "log(softmax(x)) over the last axis, max-subtracted",
    .inputs = {{"x", Diff::yes}},
    .fused = true,
    .infer = log_softmax_infer,
    .backward = log_softmax_backward,
    .composite = log_softmax_composite,
    .cases = log_softmax_cases,
};
NABLA_CPU_KERNEL(op_log_softmax, log_softmax_forward);

}  // namespace ops

Tensor log_softmax(const Tensor& x) { return apply(ops::op_log_softmax, {x}); }

}  // namespace nabla
