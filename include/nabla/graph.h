// Graph: the nodes needed for a set of outputs, in topological order, plus
// reverse-mode autodiff that appends gradient nodes to it.
#pragma once

#include <unordered_map>
#include <vector>

#include "nabla/tensor.h"

namespace nabla {

// Gradient nodes of scalar `loss` with respect to each tensor in `wrt` (same
// order). The result is an ordinary graph: backward rules emit ops, so the
// gradients can be planned, run on any backend, and differentiated again.
// A tensor that does not influence the loss gets zeros.
std::vector<Tensor> grad(const Tensor& loss, const std::vector<Tensor>& wrt);

class Graph {
 public:
  Graph() = default;
  explicit Graph(std::vector<Tensor> outputs);

  void add_output(const Tensor& t);
  const std::vector<Tensor>& outputs() const { return outputs_; }

  // Appends the gradients of `loss` with respect to every parameter that
  // reaches it (Tensor::requires_grad) and every tensor in `wrt`, and makes
  // them outputs. `loss` must have one element.
  void backward(const Tensor& loss, const std::vector<Tensor>& wrt = {});
  // The gradient of `t` after backward(); UsageError if none was built.
  const Tensor& grad(const Tensor& t) const;
  bool has_grad(const Tensor& t) const;
  const std::vector<Tensor>& parameters() const { return parameters_; }

  // Every node the outputs need, inputs before their users.
  std::vector<Node*> nodes() const;

 private:
  std::vector<Tensor> outputs_;
  std::vector<Tensor> parameters_;
  std::unordered_map<const Node*, Tensor> grads_;
};

// The parameters (requires_grad leaves) that `outputs` depend on, in the order
// they are first reached.
std::vector<Tensor> find_parameters(const std::vector<Tensor>& outputs);

}  // namespace nabla
