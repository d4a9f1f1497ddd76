// Graph construction and reverse-mode autodiff.
#include "nabla/graph.h"

#include <algorithm>
#include <unordered_set>

#include "core/graph_internal.h"
#include "core/node.h"
#include "core/op.h"
#include "ops/internal_ops.h"
#include "nabla/error.h"

namespace nabla {

std::vector<Tensor> topo_order(const std::vector<Tensor>& outputs, const NodeSet* stop) {
  std::vector<Tensor> order;
  std::unordered_set<const Node*> done;
  // Iterative post-order DFS: deep graphs (long training unrolls) must not
  // overflow the stack.
  struct Frame {
    Tensor t;
    size_t next_input;
  };
  std::vector<Frame> stack;
  for (const Tensor& out : outputs) {
    if (!out.defined()) throw UsageError("graph: an output is an undefined tensor");
    if (done.count(out.node())) continue;
    stack.push_back({out, 0});
    std::unordered_set<const Node*> on_stack{out.node()};
    while (!stack.empty()) {
      Frame& f = stack.back();
      const auto& inputs = f.t.node()->inputs;
      bool expand = !stop || !stop->count(f.t.node());
      if (expand && f.next_input < inputs.size()) {
        const Tensor& in = inputs[f.next_input++];
        if (!done.count(in.node()) && !on_stack.count(in.node())) {
          on_stack.insert(in.node());
          stack.push_back({in, 0});
        }
      } else {
        done.insert(f.t.node());
        on_stack.erase(f.t.node());
        order.push_back(f.t);
        stack.pop_back();
      }
    }
  }
  return order;
}

std::vector<Tensor> locality_order(const std::vector<Tensor>& order) {
  const size_t n = order.size();
  std::unordered_map<const Node*, size_t> index;
  for (size_t i = 0; i < n; ++i) index[order[i].node()] = i;
  // Distinct inputs of each node, and the nodes reading each one.
  std::vector<std::vector<size_t>> inputs(n), readers(n);
  for (size_t i = 0; i < n; ++i) {
    for (const Tensor& in : order[i].node()->inputs) {
      const size_t j = index.at(in.node());
      if (std::find(inputs[i].begin(), inputs[i].end(), j) == inputs[i].end()) {
        inputs[i].push_back(j);
        readers[j].push_back(i);
      }
    }
  }
  const auto eager = [&](size_t i) {
    const Node* node = order[i].node();
    if (node->is_leaf()) return false;
    if (node->is_view()) return true;
    int64_t largest = 0;
    for (const Tensor& in : node->inputs) largest = std::max(largest, in.numel());
    return 4 * order[i].numel() <= largest;
  };
  std::vector<char> emitted(n, 0);
  std::vector<Tensor> out;
  out.reserve(n);
  std::vector<size_t> stack;
  for (size_t first = 0; first < n; ++first) {
    if (emitted[first]) continue;
    stack.push_back(first);
    while (!stack.empty()) {
      const size_t i = stack.back();
      stack.pop_back();
      if (emitted[i]) continue;
      emitted[i] = 1;
      out.push_back(order[i]);
      // Readers in reverse so the first reader in the old order comes out first.
      for (auto r = readers[i].rbegin(); r != readers[i].rend(); ++r) {
        if (emitted[*r] || !eager(*r)) continue;
        if (std::all_of(inputs[*r].begin(), inputs[*r].end(), [&](size_t j) { return emitted[j] != 0; })) {
          stack.push_back(*r);
        }
      }
    }
  }
  return out;
}

std::vector<Tensor> find_parameters(const std::vector<Tensor>& outputs) {
  std::vector<Tensor> params;
  for (const Tensor& t : topo_order(outputs)) {
    if (t.node()->is_param) params.push_back(t);
  }
  return params;
}

std::vector<Tensor> clone_graph(const std::vector<Tensor>& outputs, const NodeSet& shared, GradMap& copy) {
  for (const Tensor& t : topo_order(outputs)) {
    const Node& n = *t.node();
    if (n.is_leaf()) {
      if (shared.count(&n)) {
        copy.emplace(&n, t);
        continue;
      }
      n.buffer->sync_host();
      Tensor c = Tensor::from_data(n.dtype, n.shape, n.buffer->data);
      c.node()->name = n.name;
      copy.emplace(&n, c);
      continue;
    }
    // The shape rule already ran for these inputs' shapes: copy its result.
    auto c = std::make_shared<Node>(n);
    for (Tensor& in : c->inputs) in = copy.at(in.node());
    c->id = next_node_id();
    copy.emplace(&n, Tensor(std::move(c)));
  }
  std::vector<Tensor> out;
  for (const Tensor& t : outputs) out.push_back(copy.at(t.node()));
  return out;
}

namespace {

// The nodes `from` depends on through nodes `inside` accepts, those alone
// (from included when accepted), in creation order: inputs before users.
template <class Inside>
std::vector<Node*> reached_through(Node* from, Inside inside) {
  std::vector<Node*> nodes, stack{from};
  NodeSet seen;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!inside(*n) || !seen.insert(n).second) continue;
    nodes.push_back(n);
    for (const Tensor& in : n->inputs) stack.push_back(in.node());
  }
  std::sort(nodes.begin(), nodes.end(), [](const Node* a, const Node* b) { return a->id < b->id; });
  return nodes;
}

}  // namespace

uint64_t recompute_mark() { return next_node_id(); }

void recompute_region(uint64_t before, const Tensor& y) {
  if (!y.defined()) throw UsageError("recompute: the region's output is undefined");
  if (const uint64_t now = next_node_id(); before >= now) {
    throw UsageError("recompute: mark " + std::to_string(before) + " was not taken yet (ids so far go to " +
                     std::to_string(now) + ")");
  }
  auto region = std::make_shared<RecomputeRegion>();
  region->output = y.node_ptr();
  // The nodes built since the mark (ids after `before`) that y depends on:
  // what the region read from outside is not the region's.
  for (Node* n : reached_through(y.node(), [&](const Node& n) { return n.id > before && !n.is_leaf() && !n.region; })) {
    n->region = region;
  }
}

Tensor recompute(const std::function<Tensor()>& fn) {
  const uint64_t before = recompute_mark();
  const Tensor y = fn();
  if (!y.defined()) throw UsageError("recompute: the function returned an undefined tensor");
  recompute_region(before, y);
  return y;
}

namespace {

// The copies of one region's nodes that its backward rules read instead of
// the forward's: the same ops on the same outside inputs, each read through
// after(input, gate), so that nothing of the copy runs before the gradient
// `gate` reaching the region's output exists.
class RegionCopies {
 public:
  RegionCopies(const RecomputeRegion& region, const Tensor& gate) : gate_(gate) {
    const std::shared_ptr<Node> output = region.output.lock();
    if (!output) return;
    for (const Node* n : reached_through(output.get(), [&](const Node& n) { return n.region.get() == &region; })) {
      auto c = std::make_shared<Node>(*n);
      for (Tensor& in : c->inputs) in = read(in);
      c->region.reset();
      c->id = next_node_id();
      copies_.emplace(n, Tensor(std::move(c)));
    }
  }
  // What a copied node reads in place of `t`.
  Tensor read(const Tensor& t) {
    if (auto it = copies_.find(t.node()); it != copies_.end()) return it->second;
    if (t.node()->is_leaf() || !gate_.defined()) return t;
    auto [it, inserted] = gated_.try_emplace(t.node());
    if (inserted) it->second = after(t, gate_);
    return it->second;
  }

 private:
  Tensor gate_;
  GradMap copies_, gated_;
};

}  // namespace

GradMap build_gradients(const Tensor& loss, const std::vector<Tensor>& wrt, const NodeSet* stop) {
  if (!loss.defined()) throw UsageError("backward: the loss is an undefined tensor");
  if (loss.numel() != 1) {
    throw ShapeError("backward: the loss must have one element, got shape " + to_string(loss.shape()));
  }
  if (!is_floating(loss.dtype())) {
    throw DTypeError(std::string("backward: the loss must be f32 or f64, got ") + dtype_name(loss.dtype()));
  }
  std::vector<Tensor> order = topo_order({loss}, stop);

  // A node needs a gradient when it is a target or a differentiable input of
  // it needs one; everything else is skipped, so no node is built in vain.
  std::unordered_set<const Node*> targets;
  for (const Tensor& t : wrt) targets.insert(t.node());
  std::unordered_set<const Node*> needs;
  for (const Tensor& t : order) {
    const Node* n = t.node();
    if (targets.count(n)) {
      needs.insert(n);
      continue;
    }
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      if (n->op->differentiable(i) && needs.count(n->inputs[i].node())) {
        needs.insert(n);
        break;
      }
    }
  }

  GradMap grads;
  std::unordered_map<const RecomputeRegion*, std::unique_ptr<RegionCopies>> regions;
  grads[loss.node()] = Tensor::full(loss.dtype(), loss.shape(), 1.0);
  for (size_t k = order.size(); k-- > 0;) {
    const Tensor& t = order[k];
    const Node* n = t.node();
    auto it = grads.find(n);
    if (it == grads.end() || n->is_leaf() || !needs.count(n)) continue;
    const Tensor dout = it->second;

    std::vector<bool> needed(n->inputs.size());
    bool any = false;
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      needed[i] = n->op->differentiable(i) && needs.count(n->inputs[i].node());
      any = any || needed[i];
    }
    if (!any) continue;
    if (stop && stop->count(n)) continue;
    std::vector<Tensor> inputs = n->inputs;
    Tensor out = t;
    if (n->region) {
      // The rule reads the region's copies, built once the gradient reaches
      // the region's output (processed first: it depends on every node here).
      auto [r, fresh] = regions.try_emplace(n->region.get());
      if (fresh) {
        const std::shared_ptr<Node> output = n->region->output.lock();
        auto gate = output ? grads.find(output.get()) : grads.end();
        r->second = std::make_unique<RegionCopies>(*n->region, gate != grads.end() ? gate->second : Tensor());
      }
      for (Tensor& in : inputs) in = r->second->read(in);
      out = r->second->read(t);
    }
    BackwardArgs args{inputs, out, dout, n->attrs, needed};
    Grads g = n->op->backward ? n->op->backward(args) : composite_backward(args, *n->op);
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      if (!needed[i]) continue;
      const Tensor& in = n->inputs[i];
      // A rule that returns the wrong shape is a bug in nabla, not the caller's.
      if (i >= g.size() || !g[i].defined() || g[i].shape() != in.shape() || g[i].dtype() != in.dtype()) {
        throw Error(std::string("internal: backward of '") + n->op->name + "' returned " +
                    (i < g.size() ? to_string(g[i]) : "nothing") + " for input '" + n->op->input(i).name +
                    "' of " + to_string(in));
      }
      // Used several times: the contributions are summed in the order they
      // arrive. Which sums a backend fuses is its own rewrite's business.
      auto [slot, inserted] = grads.try_emplace(in.node(), g[i]);
      if (!inserted) slot->second = add(slot->second, g[i]);
    }
  }
  return grads;
}

Grads composite_backward(const BackwardArgs& g, const OpDef& op) {
  if (!op.composite) throw Error(std::string("internal: '") + op.name + "' has neither backward nor composite");
  // Differentiate <dout, composite(inputs)> with the inputs and dout held as
  // leaves of this local graph: partial derivatives, dout a constant.
  Tensor y = op.composite(g.inputs, g.attrs);
  Tensor loss = sum(y * g.dout);
  NodeSet stop{g.dout.node()};
  std::vector<Tensor> wrt;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    stop.insert(g.inputs[i].node());
    if (g.needs(i)) wrt.push_back(g.inputs[i]);
  }
  GradMap grads = build_gradients(loss, wrt, &stop);
  Grads d(g.inputs.size());
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (!g.needs(i)) continue;
    auto it = grads.find(g.inputs[i].node());
    d[i] = it != grads.end() ? it->second : zeros_like(g.inputs[i]);
  }
  return d;
}

std::vector<Tensor> grad(const Tensor& loss, const std::vector<Tensor>& wrt) {
  for (const Tensor& t : wrt) {
    if (!t.defined()) throw UsageError("grad: a tensor in wrt is undefined");
    require_floating("grad", t, "a tensor in wrt");
  }
  GradMap grads = build_gradients(loss, wrt);
  std::vector<Tensor> out;
  for (const Tensor& t : wrt) {
    auto it = grads.find(t.node());
    out.push_back(it != grads.end() ? it->second : zeros_like(t));
  }
  return out;
}

Graph::Graph(std::vector<Tensor> outputs) {
  for (const Tensor& t : outputs) add_output(t);
}

void Graph::add_output(const Tensor& t, int stage) {
  if (!t.defined()) throw UsageError("graph: an output is an undefined tensor");
  if (stage < 0) throw UsageError("graph: stage " + std::to_string(stage) + " of " + to_string(t) + " is negative");
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (outputs_[i].same(t)) {
      stages_[i] = std::min(stages_[i], stage);
      return;
    }
  }
  outputs_.push_back(t);
  stages_.push_back(stage);
}

void Graph::add_output(const Tensor& compiled, const Tensor& original, int stage) {
  if (!original.defined()) throw UsageError("graph: an output's original is an undefined tensor");
  add_output(compiled, stage);
  if (!original.same(compiled)) originals_.emplace_back(original, compiled);
}

void Graph::backward(const Tensor& loss, const std::vector<Tensor>& wrt) {
  add_output(loss);
  std::vector<Tensor> targets = find_parameters({loss});
  for (const Tensor& t : wrt) {
    bool seen = false;
    for (const Tensor& p : targets) seen = seen || p.same(t);
    if (!seen) targets.push_back(t);
  }
  std::vector<Tensor> gs = nabla::grad(loss, targets);
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].is_parameter()) {
      bool seen = false;
      for (const Tensor& p : parameters_) seen = seen || p.same(targets[i]);
      if (!seen) parameters_.push_back(targets[i]);
    }
    grads_[targets[i].node()] = gs[i];
    add_output(gs[i]);
  }
}

bool Graph::has_grad(const Tensor& t) const { return t.defined() && grads_.count(t.node()); }

const Tensor& Graph::grad(const Tensor& t) const {
  auto it = t.defined() ? grads_.find(t.node()) : grads_.end();
  if (it == grads_.end()) {
    throw UsageError("graph: no gradient was built for " + to_string(t) +
                     "; mark it requires_grad or pass it to backward()");
  }
  return it->second;
}

std::vector<Node*> Graph::nodes() const {
  std::vector<Node*> out;
  for (const Tensor& t : topo_order(outputs_)) out.push_back(t.node());
  return out;
}

}  // namespace nabla
