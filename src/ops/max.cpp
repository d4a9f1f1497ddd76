// max: maximum over the given axes (all when none), optionally keeping them.
#include <limits>

#include "backend/cpu/kernel.h"
#include "ops/reduce.h"

namespace nabla {
namespace ops {
namespace {

struct MaxR {
  double init() const { return -std::numeric_limits<double>::infinity(); }
  // NaN propagates, as in NumPy.
  double step(double acc, double v) const { return (v > acc || v != v) ? v : acc; }
  double finish(double acc, int64_t) const { return acc; }
};

void max_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "max", [&]<class T>() { reduce_kernel<T>(a, MaxR{}); });
}

// The gradient flows to the maximal elements, shared equally among ties:
// dx = mask * dout / count, mask = (x == max).
Grads max_backward(const BackwardArgs& g) {
  const Tensor& x = g.inputs[0];
  Shape kshape = keepdim_shape(x.shape(), g.attrs);
  std::vector<int64_t> axes = reduce_axes(g.attrs);
  Tensor mask = eq(x, expand(reshape(g.out, kshape), x.shape()));
  Tensor share = reshape(g.dout, kshape) / sum(mask, axes, /*keepdim=*/true);
  return {mask * expand(share, x.shape())};
}

std::vector<GradCase> max_cases() {
  return {
      {"all", {normal({3, 4})}, [](const std::vector<Tensor>& x) { return max(x[0]); }},
      {"last_axis", {normal({2, 3, 4})}, [](const std::vector<Tensor>& x) { return max(x[0], {-1}); }},
      {"middle_axis_keepdim", {normal({2, 3, 4})},
       [](const std::vector<Tensor>& x) { return max(x[0], {1}, true); }},
  };
}

}  // namespace

extern const OpDef op_max{
    .name = "max",
    .summary = "maximum over axes (all by default); ties share the gradient",
    .inputs = {{"x", Diff::yes}},
    .infer = [](const std::vector<Tensor>& in, const Attrs& at) { return infer_reduce("max", in, at); },
    .backward = max_backward,
    .cases = max_cases,
};
NABLA_CPU_KERNEL(op_max, max_forward);

}  // namespace ops

Tensor max(const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  return apply(ops::op_max, {x}, ops::reduce_attrs("max", x, std::move(axes), keepdim));
}

}  // namespace nabla
