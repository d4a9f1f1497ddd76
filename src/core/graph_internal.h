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

using GradMap = std::unordered_map<const Node*, Tensor>;
// Gradient nodes of `loss` for every node on a path to a tensor in `wrt`;
// nodes in `stop` are treated as leaves.
GradMap build_gradients(const Tensor& loss, const std::vector<Tensor>& wrt, const NodeSet* stop = nullptr);

}  // namespace nabla
