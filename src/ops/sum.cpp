// sum: sum over the given axes (all when none), optionally keeping them as 1.
#include "backend/cpu/kernel.h"
#include "ops/reduce.h"

namespace nabla {
namespace ops {
namespace {

// Accumulates in double: f32 sums of long rows keep their accuracy, and the
// fixed order keeps results identical at any thread count.
struct SumR {
  double init() const { return 0; }
  double step(double acc, double v) const { return acc + v; }
  double finish(double acc, int64_t) const { return acc; }
};

void sum_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "sum", [&]<class T>() { reduce_kernel<T>(a, SumR{}); });
}

// Every summed element receives dout: expand it back over the reduced axes.
Grads sum_backward(const BackwardArgs& g) {
  const Tensor& x = g.inputs[0];
  return {expand(reshape(g.dout, keepdim_shape(x.shape(), g.attrs)), x.shape())};
}

std::vector<GradCase> sum_cases() {
  return {
      {"all", {normal({3, 4})}, [](const std::vector<Tensor>& x) { return sum(x[0]); }},
      {"last_axis", {normal({2, 3, 4})}, [](const std::vector<Tensor>& x) { return sum(x[0], {-1}); }},
      {"outer_axes_keepdim", {normal({2, 3, 4})},
       [](const std::vector<Tensor>& x) { return sum(x[0], {0, 2}, true); }},
  };
}

}  // namespace

extern const OpDef op_sum{
    .name = "sum",
    .summary = "sum over axes (all by default), keepdim optional",
    .inputs = {{"x", Diff::yes}},
    .infer = [](const std::vector<Tensor>& in, const Attrs& at) { return infer_reduce("sum", in, at); },
    .backward = sum_backward,
    .cases = sum_cases,
};
NABLA_CPU_KERNEL(op_sum, sum_forward);

}  // namespace ops

Tensor sum(const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  return apply(ops::op_sum, {x}, ops::reduce_attrs("sum", x, std::move(axes), keepdim));
}

}  // namespace nabla
