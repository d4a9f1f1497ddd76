// Rewriting a graph node by node: the machinery under a backend's fusions
// and the executor's choice of composites for ops a backend has no kernel
// for. Graphs are immutable; a rewrite builds new nodes where something
// changed and keeps every other node as it is.
#pragma once

#include <functional>
#include <vector>

#include "core/graph_internal.h"
#include "core/node.h"

namespace nabla {

struct RewriteRule {
  // n's replacement given its inputs' current tensors (`in`, already
  // rewritten), or undefined to keep n (copied when an input changed). A
  // replacement must have n's shape and dtype; one that is not contiguous at
  // offset 0 is made so (views of n keep their layout over it).
  std::function<Tensor(const Node& n, const std::vector<Tensor>& in, const std::function<Tensor(const Tensor&)>& now)>
      replace;
  // A node that must be rewritten before n although n does not read it (a
  // tensor the replacement of n will take in); null when none.
  std::function<const Node*(const Node& n)> also_after;
};

// The rewritten graph's tensors for `outputs`, in order; `replaced` (when
// given) receives the new tensor of every node that changed, keyed by the
// original.
std::vector<Tensor> rewrite_graph(const std::vector<Tensor>& outputs, const RewriteRule& rule,
                                  GradMap* replaced = nullptr);

}  // namespace nabla
