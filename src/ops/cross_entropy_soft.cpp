// cross_entropy_soft: mean over rows of -sum(probs * log softmax(logits)),
// cross-entropy against soft targets (label smoothing, distillation).
// logits [..., C], probs [..., C] -> scalar; both differentiated.
#include <cmath>
#include <limits>

#include "backend/cpu/kernel.h"
#include "ops/last_axis.h"

namespace nabla {
namespace ops {
namespace {

Meta cross_entropy_soft_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &x = in[0], &p = in[1];
  require_floating("cross_entropy_soft", x, "logits");
  require_same_dtype("cross_entropy_soft", x, p);
  if (x.rank() < 1 || x.shape() != p.shape()) {
    throw ShapeError("cross_entropy_soft: logits and probs must both be [..., C], got logits " +
                     to_string(x.shape()) + " and probs " + to_string(p.shape()));
  }
  return {x.dtype(), {}};
}

template <class T>
void cross_entropy_soft_kernel(const KernelArgs& a) {
  const TensorView &x = a.in[0], &p = a.in[1];
  RowWalker<2> rows(x.shape, {x.strides, p.strides});
  int64_t len = rows.len(), xs = rows.inner(0), ps = rows.inner(1);
  const T *xp = x.ptr<T>(), *pp = p.ptr<T>();
  // Per-row losses in parallel, then one sum in row order: deterministic.
  std::vector<double> loss(static_cast<size_t>(rows.rows()), 0.0);
  a.parallel_for(rows.rows(), row_grain(len), [&](int64_t b, int64_t e) {
    rows.run(b, e, [&](int64_t r, const std::array<int64_t, 2>& o) {
      const T *xr = xp + o[0], *pr = pp + o[1];
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < len; ++j) {
        double v = xr[j * xs];
        mx = (v > mx || v != v) ? v : mx;
      }
      double total = 0;
      for (int64_t j = 0; j < len; ++j) total += std::exp(double(xr[j * xs]) - mx);
      double lse = std::log(total), acc = 0;
      // -sum p log softmax = sum p * (lse - (x - max))
      for (int64_t j = 0; j < len; ++j)
        acc += double(pr[j * ps]) * (lse - (double(xr[j * xs]) - mx));
      loss[r] = acc;
    });
  });
  double sum = 0;
  for (double l : loss) sum += l;
  a.out.ptr<T>()[0] = static_cast<T>(loss.empty() ? 0.0 : sum / double(loss.size()));
}

void cross_entropy_soft_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "cross_entropy_soft",
                    [&]<class T>() { cross_entropy_soft_kernel<T>(a); });
}

// With f = dloss / rows: dlogits = (softmax(x) * sum(p) - p) * f,
// dprobs = -log_softmax(x) * f.
Grads cross_entropy_soft_backward(const BackwardArgs& g) {
  const Tensor &x = g.inputs[0], &p = g.inputs[1];
  int64_t rows = x.dim(-1) ? x.numel() / x.dim(-1) : 0;
  Tensor f = g.dout * (1.0 / double(std::max<int64_t>(rows, 1)));
  Grads d(2);
  if (g.needs(0)) d[0] = (softmax(x) * sum(p, {-1}, true) - p) * f;
  if (g.needs(1)) d[1] = -(log_softmax(x) * f);
  return d;
}

Tensor cross_entropy_soft_composite(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &x = in[0], &p = in[1];
  int64_t rows = x.dim(-1) ? x.numel() / x.dim(-1) : 0;
  Tensor z = x - max(x, {-1}, true);
  Tensor logp = z - log(sum(exp(z), {-1}, true));
  return sum(p * logp) * (-1.0 / double(std::max<int64_t>(rows, 1)));
}

std::vector<GradCase> cross_entropy_soft_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"matrix",
       {normal({4, 5}), uniform({4, 5}, 0, 1)},
       [](X x) { return cross_entropy_soft(x[0], x[1]); }},
      {"leading_dims",
       {normal({2, 3, 4}), uniform({2, 3, 4}, 0, 1)},
       [](X x) { return cross_entropy_soft(x[0], x[1]); }},
      // Targets as a distribution: the usual use.
      {"softmax_targets",
       {normal({3, 4}), normal({3, 4})},
       [](X x) { return cross_entropy_soft(x[0], softmax(x[1])); }},
  };
}

}  // namespace

extern const OpDef op_cross_entropy_soft{
    .name = "cross_entropy_soft",
    .summary = "mean over rows of -sum(probs * log_softmax(logits)); soft targets",
    .inputs = {{"logits", Diff::yes}, {"probs", Diff::yes}},
    .fused = true,
    .infer = cross_entropy_soft_infer,
    .backward = cross_entropy_soft_backward,
    .composite = cross_entropy_soft_composite,
    .cases = cross_entropy_soft_cases,
};
NABLA_CPU_KERNEL(op_cross_entropy_soft, cross_entropy_soft_forward);

}  // namespace ops

Tensor cross_entropy_soft(const Tensor& logits, const Tensor& probs) {
  return apply(ops::op_cross_entropy_soft, {logits, probs});
}

}  // namespace nabla
