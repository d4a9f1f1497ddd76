// Graph: the nodes needed for a set of outputs, in topological order, plus
// reverse-mode autodiff that appends gradient nodes to it.
#pragma once

#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "nabla/tensor.h"

namespace nabla {

// Gradient nodes of scalar `loss` with respect to each tensor in `wrt` (same
// order). The result is an ordinary graph: backward rules emit ops, so the
// gradients can be planned, run on any backend, and differentiated again.
// A tensor that does not influence the loss gets zeros.
std::vector<Tensor> grad(const Tensor& loss, const std::vector<Tensor>& wrt);

// Gradient checkpointing: builds fn() and marks the nodes it built that its
// result depends on to be computed again in the backward, from the tensors
// they read from outside, instead of kept from the forward pass. The
// forward's intermediates then live only until the region's output is
// computed; the recomputed ones only while the region's backward runs, which
// they are scheduled just ahead of. The values and gradients are the same;
// the region's forward work is done twice. Outside tensors (the region's
// input, parameters) stay alive until its backward. Nodes an inner
// recompute() marked keep their own region.
Tensor recompute(const std::function<Tensor()>& fn);
// recompute() for callers that build the region between two calls instead
// of inside a function (the C API): the mark before the region's first op,
// then its output. UsageError for a mark not taken yet, or no output.
uint64_t recompute_mark();
void recompute_region(uint64_t mark, const Tensor& output);

class Graph {
 public:
  Graph() = default;
  explicit Graph(std::vector<Tensor> outputs);

  // Outputs come in stages that Executor::run(stage) runs one at a time:
  // stage k's nodes are those its outputs need and no earlier stage's do.
  // They may read leaves and earlier stages' outputs, nothing else of an
  // earlier stage. A training step's update (stage 1) runs after its
  // gradients (stage 0), in one graph and one arena, with the learning rate
  // written in between. An output added twice keeps its earlier stage.
  void add_output(const Tensor& t, int stage = 0);
  // An output `compiled` that stands for `original`, which a rewrite done
  // before compiling (TrainStep's, over the forward and the gradients
  // together) replaced: an executor answers reads of either with its values,
  // and `original`'s graph is never computed beside it.
  void add_output(const Tensor& compiled, const Tensor& original, int stage);
  const std::vector<Tensor>& outputs() const { return outputs_; }
  // (original, compiled) of each output added for an original.
  const std::vector<std::pair<Tensor, Tensor>>& originals() const { return originals_; }
  const std::vector<int>& stages() const { return stages_; }  // one per output

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
  std::vector<int> stages_;
  std::vector<std::pair<Tensor, Tensor>> originals_;
  std::vector<Tensor> parameters_;
  std::unordered_map<const Node*, Tensor> grads_;
};

// The parameters (requires_grad leaves) that `outputs` depend on, in the order
// they are first reached.
std::vector<Tensor> find_parameters(const std::vector<Tensor>& outputs);

}  // namespace nabla
