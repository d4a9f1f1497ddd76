// Small compositions used everywhere: constants shaped like a tensor, and the
// reduction that undoes broadcasting.
#include "core/op.h"

namespace nabla {

Tensor scalar_like(double value, const Tensor& x) { return Tensor::scalar(value, x.dtype()); }

// A stride-0 view of one zero: no memory proportional to x's size.
Tensor zeros_like(const Tensor& x) { return expand(Tensor::scalar(0.0, x.dtype()), x.shape()); }

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  int lead = x.rank() - static_cast<int>(shape.size());
  if (lead < 0) {
    throw ShapeError("sum_to: cannot reduce " + to_string(x.shape()) + " to the larger rank of " +
                     to_string(shape));
  }
  std::vector<int64_t> axes;
  for (int i = 0; i < x.rank(); ++i) {
    if (i < lead) {
      axes.push_back(i);
    } else if (shape[i - lead] == 1 && x.shape()[i] != 1) {
      axes.push_back(i);
    } else if (shape[i - lead] != x.shape()[i]) {
      throw ShapeError("sum_to: " + to_string(x.shape()) + " is not a broadcast of " + to_string(shape));
    }
  }
  return reshape(sum(x, axes, /*keepdim=*/true), shape);
}

}  // namespace nabla
