#pragma once

#include <unordered_map>
#include <vector>

#include "nabla/tensor.h"

namespace nabla {

// Inputs before users; each node once. Holds the handles, so nodes stay alive.
std::vector<Tensor> topo_order(const std::vector<Tensor>& outputs);

using GradMap = std::unordered_map<const Node*, Tensor>;
// Gradient nodes of `loss` for every node on a path to a tensor in `wrt`.
GradMap build_gradients(const Tensor& loss, const std::vector<Tensor>& wrt);

}  // namespace nabla
