// scaled_dot_product_attention: softmax(scale * q k^T + mask) v, composed
// from matmul, transpose and the fused softmax, so its backward comes by
// construction. No OpDef: tests/ops/attention_test.cpp checks its gradients.
#include <cmath>

#include "core/op.h"

namespace nabla {

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, bool causal, std::optional<double> scale) {
  for (const Tensor* t : {&q, &k, &v}) {
    if (!t->defined())
      throw UsageError("scaled_dot_product_attention: an input is an undefined tensor");
  }
  if (q.rank() < 2 || k.rank() < 2 || v.rank() < 2) {
    throw ShapeError("scaled_dot_product_attention: q, k, v must be [..., T, D], got q " +
                     to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " +
                     to_string(v.shape()));
  }
  if (q.dim(-1) != k.dim(-1) || k.dim(-2) != v.dim(-2)) {
    throw ShapeError(
        "scaled_dot_product_attention: need q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv], got "
        "q " +
        to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " + to_string(v.shape()));
  }
  double s = scale ? *scale : 1.0 / std::sqrt(double(q.dim(-1)));
  // [..., Tq, D] x [..., D, Tk] -> [..., Tq, Tk]; rows over keys.
  Tensor p = softmax(matmul(q, transpose(k)), s, mask, causal);
  return matmul(p, v);  // [..., Tq, Dv]
}

}  // namespace nabla
