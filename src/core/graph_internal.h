#pragma once

#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "nabla/tensor.h"

namespace nabla {

struct OpDef;
struct BackwardArgs;
using Grads = std::vector<Tensor>;
// The backward of an op that has a composite but no rule of its own: the
// vector-Jacobian product of its composite, built as graph ops.
Grads composite_backward(const BackwardArgs& g, const OpDef& op);

using NodeSet = std::unordered_set<const Node*>;

// Inputs before users; each node once. Holds the handles, so nodes stay alive.
// Nodes in `stop` are included but their inputs are not followed.
std::vector<Tensor> topo_order(const std::vector<Tensor>& outputs, const NodeSet* stop = nullptr);

// The order the executor runs `order` (a topo_order) in: the same nodes, with
// each reduction-like node (output at most a quarter of its largest input:
// a bias gradient's sum over tokens, a weight gradient's matmul) and each
// view moved up to just after its last input. A reduction reads its input
// while the producer has left it in cache, instead of a hundred kernels later
// from memory, and moving readers earlier only shortens lifetimes.
std::vector<Tensor> locality_order(const std::vector<Tensor>& order);

using GradMap = std::unordered_map<const Node*, Tensor>;
// Gradient nodes of `loss` for every node on a path to a tensor in `wrt`;
// nodes in `stop` are treated as leaves.
GradMap build_gradients(const Tensor& loss, const std::vector<Tensor>& wrt, const NodeSet* stop = nullptr);

// A copy of the graph `outputs` need (same ops, attributes and layouts), for
// running it again on other inputs beside the original: the leaves in
// `shared` (parameters) are the same nodes, every other leaf gets a buffer of
// its own holding its current values. Returns the copies of `outputs`;
// `copies` receives every node's copy under the original's node.
std::vector<Tensor> clone_graph(const std::vector<Tensor>& outputs, const NodeSet& shared, GradMap& copies);

}  // namespace nabla
