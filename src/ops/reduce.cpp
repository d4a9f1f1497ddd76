#include "ops/reduce.h"

#include <algorithm>

namespace nabla::ops {

Attrs reduce_attrs(const char* op, const Tensor& x, std::vector<int64_t> axes, bool keepdim) {
  if (axes.empty()) {
    for (int i = 0; i < x.rank(); ++i) axes.push_back(i);
  }
  for (int64_t& a : axes) a = normalize_axis(a, x.rank(), op);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) {
    throw ShapeError(std::string(op) + ": an axis is listed twice");
  }
  Attrs attrs;
  attrs.ints.push_back(keepdim ? 1 : 0);
  attrs.ints.insert(attrs.ints.end(), axes.begin(), axes.end());
  return attrs;
}

std::vector<int64_t> reduce_axes(const Attrs& attrs) {
  return std::vector<int64_t>(attrs.ints.begin() + 1, attrs.ints.end());
}
bool reduce_keepdim(const Attrs& attrs) { return attrs.ints[0] != 0; }

Shape keepdim_shape(const Shape& in, const Attrs& attrs) {
  Shape s = in;
  for (int64_t a : reduce_axes(attrs)) s[a] = 1;
  return s;
}

Meta infer_reduce(const char* op, const std::vector<Tensor>& in, const Attrs& attrs) {
  require_floating(op, in[0], "x");
  Shape s;
  std::vector<int64_t> axes = reduce_axes(attrs);
  for (int d = 0; d < in[0].rank(); ++d) {
    bool r = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!r) s.push_back(in[0].shape()[d]);
    else if (reduce_keepdim(attrs)) s.push_back(1);
  }
  return {in[0].dtype(), s};
}

}  // namespace nabla::ops
