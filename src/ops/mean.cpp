// mean: mean over the given axes (all when none), optionally keeping them as 1.
#include "backend/cpu/kernel.h"
#include "ops/reduce.h"

namespace nabla {
namespace ops {
namespace {

struct MeanR {
  double init() const { return 0; }
  double step(double acc, double v) const { return acc + v; }
  double finish(double acc, int64_t n) const { return n ? acc / double(n) : acc; }
};

void mean_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "mean", [&]<class T>() { reduce_kernel<T>(a, MeanR{}); });
}

// Each of the n averaged elements receives dout / n.
Grads mean_backward(const BackwardArgs& g) {
  const Tensor& x = g.inputs[0];
  int64_t n = 1;
  for (int64_t a : reduce_axes(g.attrs)) n *= x.shape()[a];
  Tensor d = reshape(scale(g.dout, 1.0 / double(n)), keepdim_shape(x.shape(), g.attrs));
  return {expand(d, x.shape())};
}

std::vector<GradCase> mean_cases() {
  return {
      {"all", {normal({3, 4})}, [](const std::vector<Tensor>& x) { return mean(x[0]); }},
      {"last_axis_keepdim", {normal({2, 3, 4})},
       [](const std::vector<Tensor>& x) { return mean(x[0], {-1}, true); }},
      {"first_axis", {normal({2, 3, 4})}, [](const std::vector<Tensor>& x) { return mean(x[0], {0}); }},
  };
}

}  // namespace

extern const OpDef op_mean{
    .name = "mean",
    .summary = "mean over axes (all by default), keepdim optional",
    .inputs = {{"x", Diff::yes}},
    .infer = [](const std::vector<Tensor>& in, const Attrs& at) { return infer_reduce("mean", in, at); },
    .backward = mean_backward,
    .cases = mean_cases,
};
NABLA_CPU_KERNEL(op_mean, mean_forward);

}  // namespace ops

Tensor mean(const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  return apply(ops::op_mean, {x}, ops::reduce_attrs("mean", x, std::move(axes), keepdim));
}

}  // namespace nabla
