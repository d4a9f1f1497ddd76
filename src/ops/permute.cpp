// permute: reorders the axes; a view (strides permuted).
#include <algorithm>

#include "core/op.h"

namespace nabla {
namespace ops {
namespace {

Meta permute_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  Shape shape;
  Strides strides;
  for (int64_t a : attrs.ints) {
    shape.push_back(x.shape()[a]);
    strides.push_back(x.strides()[a]);
  }
  return {x.dtype(), shape, strides, x.offset()};
}

// The inverse permutation carries the gradient back.
Grads permute_backward(const BackwardArgs& g) {
  std::vector<int64_t> inverse(g.attrs.ints.size());
  for (size_t i = 0; i < inverse.size(); ++i) inverse[g.attrs.ints[i]] = static_cast<int64_t>(i);
  return {permute(g.dout, inverse)};
}

std::vector<GradCase> permute_cases() {
  return {
      {"rank3", {normal({2, 3, 4})}, [](const std::vector<Tensor>& x) { return permute(x[0], {2, 0, 1}); }},
      {"heads", {normal({2, 3, 2, 4})},
       [](const std::vector<Tensor>& x) { return permute(x[0], {0, 2, 1, 3}); }},
  };
}

}  // namespace

extern const OpDef op_permute{
    .name = "permute",
    .summary = "reorders axes; a view",
    .inputs = {{"x", Diff::yes}},
    .is_view = true,
    .infer = permute_infer,
    .backward = permute_backward,
    .cases = permute_cases,
};

}  // namespace ops

Tensor permute(const Tensor& x, std::vector<int64_t> order) {
  if (static_cast<int>(order.size()) != x.rank()) {
    throw ShapeError("permute: order has " + std::to_string(order.size()) + " axes, x " + to_string(x.shape()) +
                     " has " + std::to_string(x.rank()));
  }
  std::vector<bool> seen(order.size(), false);
  for (int64_t& a : order) {
    a = normalize_axis(a, x.rank(), "permute");
    if (seen[a]) throw ShapeError("permute: axis " + std::to_string(a) + " appears twice in the order");
    seen[a] = true;
  }
  bool identity = true;
  for (size_t i = 0; i < order.size(); ++i) identity = identity && order[i] == static_cast<int64_t>(i);
  if (identity) return x;
  return apply(ops::op_permute, {x}, Attrs{order, {}});
}

}  // namespace nabla
