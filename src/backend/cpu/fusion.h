// The CPU backend's rewrite of a graph after autodiff. Autodiff sums a
// tensor's gradient contributions with plain `add` and builds each op's
// backward from that op's rule alone; this pass turns the sums and rules
// that a fused kernel does better on a CPU into that kernel:
//   add(g, scatter_slice(x))        -> add_slice(g, x)        (a slice's adjoint)
//   add(g, scatter_add_rows(v, i))  -> add_rows(g, v, i)      (get_rows' adjoint)
//   add(g, [reshape of] matmul(a, b)), 2-D
//                                   -> matmul_add(a, b, g)    (the product accumulates onto g)
//   add(g, dx of layer_norm_affine_back(x, dy, gamma))
//                                   -> layer_norm_affine_back_add(x, dy, gamma, g)
//   attention_probs_back(q, k, p, matmul(dO, v^T))
//                                   -> attention_probs_values_back(q, k, p, v, dO)
// (either operand of an add, in that order of preference). A sparse adjoint
// added into the other contribution never materialises its zeros; the
// others save a pass over memory each. Nodes the rules do not touch, and
// whose inputs they do not touch, stay the same nodes.
#pragma once

#include <vector>

#include "core/graph_internal.h"
#include "nabla/tensor.h"

namespace nabla::cpu {

// The rewritten graph's tensors for `outputs`, in order; `replaced` (when
// given) receives the new tensor of every node that changed, keyed by the
// original. Under CompositeMode nothing is fused: the outputs come back as
// they are.
std::vector<Tensor> fuse(const std::vector<Tensor>& outputs, GradMap* replaced = nullptr);

}  // namespace nabla::cpu
