#include "ops/norm.h"

#include <cmath>

namespace nabla::ops {

Attrs norm_attrs(double eps) { return Attrs{{}, {eps}}; }

Meta infer_norm(const char* op, const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  require_floating(op, x, "x");
  if (x.rank() < 1) {
    throw ShapeError(std::string(op) + ": x must have at least 1 axis, got a scalar");
  }
  for (size_t i = 1; i < in.size(); ++i) {
    require_same_dtype(op, x, in[i]);
    if (in[i].shape() != x.shape()) {
      throw ShapeError(std::string(op) + ": dy must have x's shape " + to_string(x.shape()) +
                       ", got " + to_string(in[i].shape()));
    }
  }
  double eps = norm_eps(attrs);
  if (!(eps >= 0) || !std::isfinite(eps)) {
    throw UsageError(std::string(op) + ": eps must be finite and >= 0, got " + std::to_string(eps));
  }
  return {x.dtype(), x.shape()};
}

void check_norm_param(const char* op, const char* what, const Tensor& p, const Tensor& x) {
  if (!p.defined()) return;
  if (x.rank() < 1) {
    throw ShapeError(std::string(op) + ": x must have at least 1 axis, got a scalar");
  }
  Shape want{x.shape().back()};
  if (p.shape() != want) {
    throw ShapeError(std::string(op) + ": " + what + " must be " + to_string(want) + " for x " +
                     to_string(x.shape()) + ", got " + to_string(p.shape()));
  }
  require_same_dtype(op, x, p);
}

}  // namespace nabla::ops
