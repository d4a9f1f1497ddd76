#include "core/rewrite.h"

#include <unordered_map>

#include "core/op.h"
#include "nabla/error.h"

namespace nabla {

namespace ops {
extern const OpDef op_contiguous;
}  // namespace ops

namespace {

// Post-order over the nodes `outputs` need, each after its inputs and after
// the node rule.also_after names for it.
std::vector<const Node*> rewrite_order(const std::vector<Tensor>& outputs, const RewriteRule& rule) {
  std::vector<const Node*> order;
  std::unordered_map<const Node*, bool> seen;
  struct Frame {
    const Node* n;
    size_t next;
  };
  std::vector<Frame> stack;
  const auto dep = [&](const Node* n, size_t i) -> const Node* {
    if (i < n->inputs.size()) return n->inputs[i].node();
    return i == n->inputs.size() && rule.also_after ? rule.also_after(*n) : nullptr;
  };
  for (const Tensor& out : outputs) {
    if (seen.count(out.node())) continue;
    stack.push_back({out.node(), 0});
    seen[out.node()] = true;
    while (!stack.empty()) {
      Frame& f = stack.back();
      if (const Node* d = dep(f.n, f.next); d) {
        ++f.next;
        if (seen.emplace(d, true).second) stack.push_back({d, 0});
        continue;
      }
      order.push_back(f.n);
      stack.pop_back();
    }
  }
  return order;
}

}  // namespace

std::vector<Tensor> rewrite_graph(const std::vector<Tensor>& outputs, const RewriteRule& rule, GradMap* replaced) {
  std::unordered_map<const Node*, Tensor> now;
  const std::function<Tensor(const Tensor&)> current = [&](const Tensor& t) {
    auto it = now.find(t.node());
    return it == now.end() ? t : it->second;
  };
  for (const Node* n : rewrite_order(outputs, rule)) {
    if (n->is_leaf()) continue;
    std::vector<Tensor> in;
    bool changed = false;
    for (const Tensor& t : n->inputs) {
      in.push_back(current(t));
      changed = changed || !in.back().same(t);
    }
    Tensor r = rule.replace(*n, in, current);
    if (r.defined()) {
      if (r.shape() != n->shape || r.dtype() != n->dtype) {
        throw Error(std::string("internal: a rewrite of '") + n->op->name + "' gave " + to_string(r) +
                    " for a " + dtype_name(n->dtype) + to_string(n->shape));
      }
      // Views of n keep their strides and offset, which hold over r's root
      // when r is its shape contiguous at offset 0 there.
      if (r.offset() != 0 || !r.is_contiguous()) r = apply(ops::op_contiguous, {r});
    } else if (changed) {
      auto c = std::make_shared<Node>(*n);
      c->inputs = std::move(in);
      c->id = next_node_id();
      r = Tensor(std::move(c));
    } else {
      continue;
    }
    now.emplace(n, r);
  }
  std::vector<Tensor> out;
  for (const Tensor& t : outputs) out.push_back(current(t));
  if (replaced) {
    for (auto& [n, t] : now) replaced->emplace(n, t);
  }
  return out;
}

}  // namespace nabla
