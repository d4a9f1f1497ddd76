#include "backend/cpu/fusion.h"

#include <unordered_map>

#include "core/node.h"
#include "core/op.h"
#include "core/rewrite.h"
#include "nabla/error.h"
#include "ops/internal_ops.h"
#include "ops/norm.h"

namespace nabla {
namespace ops {
extern const OpDef op_add;
extern const OpDef op_scatter_slice;
extern const OpDef op_scatter_add_rows;
extern const OpDef op_matmul;
extern const OpDef op_reshape;
extern const OpDef op_slice;
extern const OpDef op_layer_norm_affine_back;
extern const OpDef op_attention_probs_back;
}  // namespace ops

namespace cpu {
namespace {

bool is(const Tensor& t, const OpDef& op) { return t.node()->op == &op; }

// The adjoint of a slice or of get_rows: zeros with a few values filled in.
bool is_sparse(const Tensor& t) { return is(t, ops::op_scatter_slice) || is(t, ops::op_scatter_add_rows); }

// `sparse` added to `dense` without materialising sparse's zeros; undefined
// where sparse is not is_sparse.
Tensor add_sparse(const Tensor& dense, const Tensor& sparse) {
  const Node* n = sparse.node();
  if (n->op == &ops::op_scatter_slice) {
    const auto& a = n->attrs.ints;  // {axis, start, stop, step, full shape...}
    return add_slice(dense, n->inputs[0], a[0], a[1], a[2], a[3]);
  }
  if (n->op == &ops::op_scatter_add_rows) return add_rows(dense, n->inputs[0], n->inputs[1]);
  return Tensor();
}

// t's 2-D matmul, t being one or a reshape of one (as a linear layer's input
// gradient arrives); undefined otherwise.
Tensor product_of(const Tensor& t) {
  const Tensor p = is(t, ops::op_reshape) ? t.node()->inputs[0] : t;
  return is(p, ops::op_matmul) && p.rank() == 2 ? p : Tensor();
}

// The 2-D matmul of two 2-D operands that `product` is (or a reshape of),
// when `other` can be seen in its shape without a copy; undefined otherwise.
Tensor product_onto(const Tensor& other, const Tensor& product) {
  const Tensor p = product_of(product);
  if (!p.defined()) return Tensor();
  const std::vector<Tensor>& in = p.node()->inputs;
  if (in[0].rank() != 2 || in[1].rank() != 2) return Tensor();
  if (other.shape() != p.shape() && !other.is_contiguous()) return Tensor();  // its reshape would copy
  return p;
}

// `product` added to `other` by the product itself: matmul_add accumulates
// it onto other, in other's memory when other dies there, instead of writing
// a zeroed product and adding it in another pass (q, k and v's gradients
// reaching their shared input). Undefined where product_onto is.
Tensor add_product(const Tensor& other, const Tensor& product) {
  const Tensor p = product_onto(other, product);
  if (!p.defined()) return Tensor();
  const std::vector<Tensor>& in = p.node()->inputs;
  return reshape(matmul_add(in[0], in[1], reshape(other, p.shape())), other.shape());
}

// acc + g by a kernel that does better than add, or undefined. The adjoints
// of slice and get_rows are zeros with a few values filled in: added into
// the other contribution (in its memory when it dies there), not built full
// size and summed, which for a fused qkv weight or a tied embedding would
// touch the whole tensor three times over.
Tensor fused_sum(const Tensor& acc, const Tensor& g) {
  if (Tensor r = add_sparse(acc, g); r.defined()) return r;
  if (Tensor r = add_sparse(g, acc); r.defined()) return r;
  if (Tensor r = add_product(acc, g); r.defined()) return r;
  return add_product(g, acc);
}

// Whether fused_sum(acc, g) is defined, without building it.
bool has_fused_sum(const Tensor& acc, const Tensor& g) {
  return is_sparse(g) || is_sparse(acc) || product_onto(acc, g).defined() || product_onto(g, acc).defined();
}

// A gradient sum: add of two operands of its own shape and dtype.
bool is_sum(const Node& n) {
  if (n.op != &ops::op_add || n.inputs.size() != 2) return false;
  for (const Tensor& in : n.inputs) {
    if (in.shape() != n.shape || in.dtype() != n.dtype) return false;
  }
  return true;
}

// The layer_norm_affine_back node whose dx (the first x.numel() elements of
// its flat result, seen in x's shape) g is; null otherwise.
const Node* layer_norm_dx_of(const Tensor& g) {
  const Tensor s = is(g, ops::op_reshape) ? g.node()->inputs[0] : g;
  if (!is(s, ops::op_slice)) return nullptr;
  const Tensor& flat = s.node()->inputs[0];
  if (!is(flat, ops::op_layer_norm_affine_back)) return nullptr;
  const Tensor& x = flat.node()->inputs[0];
  const auto& a = s.node()->attrs.ints;  // {axis, start, stop, step}
  const bool dx = a[0] == 0 && a[1] == 0 && a[2] == x.numel() && a[3] == 1 && g.shape() == x.shape();
  return dx ? flat.node() : nullptr;
}

// attention_probs_back(q, k, p, dp) with dp = dO v^T as matmul_heads'
// backward makes it (a matmul of heads-first views of dO and v):
// attention_probs_values_back makes dp per query block in cache instead of
// reading it from memory. Undefined otherwise.
Tensor attention_values_back(const Node& n, const std::vector<Tensor>& in) {
  const Tensor& dp = in[3];
  if (!is(dp, ops::op_matmul)) return Tensor();
  const Tensor &dout = dp.node()->inputs[0], &v_t = dp.node()->inputs[1];
  for (const Tensor& t : {dout, v_t}) {
    if (t.rank() != 4 || t.dim(0) != dp.dim(0) || t.dim(1) != dp.dim(1)) return Tensor();
  }
  const auto heads_first = [](const Tensor& t) { return permute(t, {0, 2, 1, 3}); };
  return attention_probs_values_back(in[0], in[1], in[2], heads_first(transpose(v_t)), heads_first(dout),
                                     n.attrs.reals[0]);
}

// Whether `t` is computed from node `n`. A node's id is larger than its
// inputs' (creation order), so nodes older than n are not searched.
bool depends_on(const Tensor& t, const Node* n) {
  std::vector<const Node*> stack{t.node()};
  NodeSet seen{t.node()};
  while (!stack.empty()) {
    const Node* m = stack.back();
    stack.pop_back();
    if (m == n) return true;
    if (m->id < n->id) continue;
    for (const Tensor& in : m->inputs) {
      if (seen.insert(in.node()).second) stack.push_back(in.node());
    }
  }
  return false;
}

}  // namespace

std::vector<Tensor> fuse(const std::vector<Tensor>& outputs, GradMap* replaced) {
  if (CompositeMode::active()) return outputs;
  const std::vector<Tensor> order = topo_order(outputs);
  std::unordered_map<const Node*, int> readers;
  for (const Tensor& t : order) {
    for (const Tensor& in : t.node()->inputs) ++readers[in.node()];
  }
  NodeSet is_output;
  for (const Tensor& t : outputs) is_output.insert(t.node());
  const auto only_reader = [&](const Tensor& t) { return readers[t.node()] == 1 && !is_output.count(t.node()); };

  // A layer norm's backward -> the gradient acc it takes in, where the sum
  // add(acc, dx) becomes dx of layer_norm_affine_back_add(..., acc): the sum
  // must be dx's one reader (nothing else sees dx alone), and acc must not
  // depend on the norm's backward.
  std::unordered_map<const Node*, Tensor> absorb;
  std::unordered_map<const Node*, const Node*> absorbed_by;  // sum -> layer norm backward
  for (const Tensor& t : order) {
    const Node& n = *t.node();
    if (!is_sum(n) || has_fused_sum(n.inputs[0], n.inputs[1])) continue;
    const Tensor &acc = n.inputs[0], &g = n.inputs[1];
    const Node* back = layer_norm_dx_of(g);
    if (!back || absorb.count(back) || is_output.count(back)) continue;
    if (!only_reader(g) || (is(g, ops::op_reshape) && !only_reader(g.node()->inputs[0]))) continue;
    if (depends_on(acc, back)) continue;
    absorb.emplace(back, acc);
    absorbed_by.emplace(&n, back);
  }

  RewriteRule rule;
  rule.also_after = [&](const Node& n) -> const Node* {
    auto a = absorb.find(&n);
    return a == absorb.end() ? nullptr : a->second.node();
  };
  std::unordered_map<const Node*, Tensor> absorbing;  // the layer norm's new backward
  rule.replace = [&](const Node& n, const std::vector<Tensor>& in, const auto& now) -> Tensor {
    if (auto a = absorb.find(&n); a != absorb.end()) {
      Tensor r = layer_norm_affine_back(in[0], in[1], in[2], ops::norm_eps(n.attrs), now(a->second));
      absorbing.emplace(&n, r);
      return r;
    }
    if (auto s = absorbed_by.find(&n); s != absorbed_by.end()) {
      const Tensor x = s->second->inputs[0];
      return reshape(slice(absorbing.at(s->second), 0, 0, x.numel()), x.shape());
    }
    if (is_sum(n)) return fused_sum(in[0], in[1]);
    if (n.op == &ops::op_attention_probs_back) return attention_values_back(n, in);
    return Tensor();
  };
  return rewrite_graph(outputs, rule, replaced);
}

}  // namespace cpu
}  // namespace nabla
