#include "ops/elementwise.h"

namespace nabla::ops {

Meta infer_unary(const char* op, const std::vector<Tensor>& in) {
  require_floating(op, in[0], "x");
  return {in[0].dtype(), in[0].shape()};
}

Meta infer_binary(const char* op, const std::vector<Tensor>& in) {
  require_floating(op, in[0], "a");
  require_same_dtype(op, in[0], in[1]);
  return {in[0].dtype(), broadcast_shapes(in[0].shape(), in[1].shape(), op)};
}

std::vector<GradCase> unary_cases(Tensor (*f)(const Tensor&), double lo, double hi) {
  auto gen = [&](Shape s) { return lo < hi ? uniform(std::move(s), lo, hi) : normal(std::move(s)); };
  auto build = [f](const std::vector<Tensor>& x) { return f(x[0]); };
  return {
      {"matrix", {gen({3, 5})}, build},
      {"rank3", {gen({2, 3, 4})}, build},
      {"scalar", {gen({})}, build},
  };
}

std::vector<GradCase> binary_cases(Tensor (*f)(const Tensor&, const Tensor&), double b_lo, double b_hi) {
  auto gen_b = [&](Shape s) { return b_lo < b_hi ? uniform(std::move(s), b_lo, b_hi) : normal(std::move(s)); };
  auto build = [f](const std::vector<Tensor>& x) { return f(x[0], x[1]); };
  return {
      {"same_shape", {normal({3, 4}), gen_b({3, 4})}, build},
      {"row_broadcast", {normal({2, 3, 4}), gen_b({4})}, build},
      {"both_broadcast", {normal({3, 1}), gen_b({1, 4})}, build},
      {"scalar", {normal({3, 4}), gen_b({})}, build},
  };
}

}  // namespace nabla::ops
