// Executor: plans memory once, resolves every operand's address, then runs
// the kernels in topological order.
#include "nabla/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "backend/backend.h"
#include "backend/cpu/strided.h"
#include "backend/cpu/thread_pool.h"
#include "core/graph_internal.h"
#include "core/node.h"
#include "core/op.h"
#include "core/planner.h"
#include "core/rewrite.h"
#include "nabla/error.h"

namespace nabla {

struct Executor::Impl {
  const Backend* backend = nullptr;
  std::vector<Tensor> order;
  std::vector<Tensor> outputs;
  // The graph as given, held so that the nodes `replaced` is keyed by stay
  // alive (a freed node's address could name another tensor).
  std::vector<Tensor> given;
  std::vector<Tensor> originals;  // Graph::originals()' originals, kept alive for the same reason
  GradMap replaced;  // a node the backend's rewrite or a composite replaced -> its replacement
  std::unordered_map<const Node*, int64_t> pos;
  MemoryPlan plan;
  std::unique_ptr<Buffer> arena;
  // Host leaves of a graph on a backend with memory of its own: their copy
  // there, refreshed at every run.
  std::unordered_map<const Node*, std::unique_ptr<Buffer>> staged;
  std::vector<const Node*> staged_updates;  // staged leaves an update op writes: copied back after a run
  // Host leaves kept there between runs instead (parameters, what update ops
  // write): their Buffer's mirror, sent when the host has written them and
  // brought back when the host reads them (Buffer::sync_host).
  std::vector<Node*> mirrored;
  std::vector<Node*> mirrored_updates;  // mirrored leaves an update op writes
  // On a host backend: every host leaf, brought up to date before a run, and
  // those an update op writes, whose mirrors a run makes stale.
  std::vector<Node*> host_leaves, host_updates;
  std::vector<bool> readable;  // by position: leaf, output, or a view of one
  struct Step {
    const OpDef* op;
    TensorView out;
    int64_t position;
  };
  std::vector<Step> steps;
  std::vector<std::vector<size_t>> stage_steps;  // each stage's steps, in order
  std::vector<size_t> all_steps;                 // 0, 1, ...: run() runs them as one
  std::unique_ptr<Program> program;
  ExecOptions options;
  std::vector<double> step_seconds;  // profiling: total per step
  std::vector<std::vector<std::function<void()>>> after_step;  // on_computed's, by step (empty: none)
  // host_copy's: where from, into what, this run's fence; by step.
  struct HostCopy {
    const Backend* backend;
    const void* src;
    size_t bytes;
    void* host;
    std::unique_ptr<Fence> fence;
    std::function<void()> queued;
    ~HostCopy() { backend->release_host(host); }
  };
  std::vector<std::unique_ptr<HostCopy>> host_copies;
  std::vector<std::vector<size_t>> copies_after_step;
  int64_t profiled_runs = 0;

  void* base(const Node* n) const {
    const Node* r = n->root();
    if (r->is_leaf()) {
      auto s = staged.find(r);
      if (s != staged.end()) return s->second->data;
      if (!r->buffer->device && r->buffer->mirror && r->buffer->mirror->device == backend) return r->buffer->mirror->data;
      return r->buffer->data;
    }
    return static_cast<char*>(arena->data) + plan.offset[pos.at(r)];
  }
  TensorView view(const Tensor& t) const {
    const Node* n = t.node();
    TensorView v;
    v.data = static_cast<char*>(base(n)) + n->offset * static_cast<int64_t>(dtype_size(n->dtype));
    v.dtype = n->dtype;
    v.shape = n->shape;
    v.strides = n->strides;
    v.contiguous = t.is_contiguous();
    return v;
  }
  // The values of view v in host memory, row-major.
  void copy_to_host(const TensorView& v, void* dst) const;
  void check_finite(const Step& s) const;
  // Runs these steps after copying staged leaves in, and copies back what
  // update ops wrote into them.
  // A profile counts runs of the whole graph or of stage 0 (`counted`).
  void run_steps(const std::vector<size_t>& which, bool counted);
  // The graph's tensor for t: t's own node, or what replaced it.
  Tensor compiled(Tensor t) const {
    for (auto it = replaced.find(t.node()); it != replaced.end(); it = replaced.find(t.node())) t = it->second;
    return t;
  }
  // The step that writes `root` (a view's root node); -1 where none does (a
  // leaf). UsageError naming `given` where it is not part of this graph.
  int64_t step_writing(const Node* root, const Tensor& given) const {
    auto it = pos.find(root);
    if (it == pos.end()) throw UsageError("executor: " + to_string(given) + " is not part of this graph");
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].position == it->second) return int64_t(i);
    }
    return -1;
  }
};

namespace {

template <class T>
int64_t first_non_finite(const T* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i])) return i;
  }
  return -1;
}

bool env_check_finite() {
  const char* e = std::getenv("NABLA_CHECK_FINITE");
  return e && *e && std::strcmp(e, "0") != 0;
}

}  // namespace

void Executor::Impl::copy_to_host(const TensorView& v, void* dst) const {
  const size_t elem = dtype_size(v.dtype);
  if (backend->host_memory()) {
    cpu::copy_strided(v.data, v.shape, v.strides, elem, dst);
    return;
  }
  // The span the view reaches (strides are never negative), then its elements.
  int64_t span = v.numel() > 0 ? 1 : 0;
  for (size_t i = 0; i < v.shape.size(); ++i) span += v.shape[i] > 0 ? (v.shape[i] - 1) * v.strides[i] : 0;
  std::vector<char> host(size_t(span) * elem);
  backend->copy_out(host.data(), v.data, host.size());
  cpu::copy_strided(host.data(), v.shape, v.strides, elem, dst);
}

void Executor::Impl::check_finite(const Step& s) const {
  const TensorView& out = s.out;
  if (!is_floating(out.dtype)) return;
  std::vector<char> host;
  const void* values = out.data;
  if (!backend->host_memory()) {
    host.resize(size_t(out.numel()) * dtype_size(out.dtype));
    copy_to_host(out, host.data());
    values = host.data();
  }
  int64_t bad = -1;
  double value = 0;
  if (out.dtype == DType::f32) {
    bad = first_non_finite(static_cast<const float*>(values), out.numel());
    if (bad >= 0) value = static_cast<const float*>(values)[bad];
  } else {
    bad = first_non_finite(static_cast<const double*>(values), out.numel());
    if (bad >= 0) value = static_cast<const double*>(values)[bad];
  }
  if (bad < 0) return;
  const Node* n = order[s.position].node();
  std::string inputs;
  for (const Tensor& in : n->inputs) inputs += (inputs.empty() ? "" : ", ") + to_string(in);
  throw Error("check_finite: '" + std::string(n->op->name) + "' at graph position " +
              std::to_string(s.position) + " produced " + (std::isnan(value) ? "NaN" : "Inf") +
              " at element " + std::to_string(bad) + " of " + to_string(n->shape) + "; inputs: " + inputs);
}

namespace {

// Each op `backend` has no kernel for replaced by its composite (whose ops
// may need the same), when the graph is compiled; UsageError naming the op
// and the backend where there is none.
std::vector<Tensor> lower_to_kernels(const std::vector<Tensor>& outputs, const Backend& backend,
                                     GradMap* replaced) {
  RewriteRule rule;
  rule.replace = [&](const Node& n, const std::vector<Tensor>& in, const auto&) -> Tensor {
    if (n.is_view() || backend.has_kernel(*n.op)) return Tensor();
    if (!n.op->composite) {
      throw UsageError(std::string(n.op->name) + ": the " + backend.name() +
                       " backend has no kernel for this op, and the op has no composite to run instead");
    }
    return lower_to_kernels({n.op->composite(in, n.attrs)}, backend, nullptr)[0];
  };
  return rewrite_graph(outputs, rule, replaced);
}

// `order` with the update ops (OpDef::mutates) moved after every other node,
// so that every other reader of the leaves they write has run; UsageError
// where that cannot be: a mutated input that is not a leaf, a leaf two
// updates write, or a node reading an update's token.
std::vector<Tensor> order_updates_last(const std::vector<Tensor>& order) {
  std::vector<Tensor> rest, updates;
  std::unordered_map<const Node*, const Node*> writer;  // leaf -> the update that writes it
  NodeSet tokens;
  for (const Tensor& t : order) {
    const Node* n = t.node();
    for (const Tensor& in : n->inputs) {
      if (tokens.count(in.node())) {
        throw UsageError(std::string(n->op->name) + ": reads the token of '" + in.op_name() +
                         "', an update op's output that holds nothing");
      }
    }
    if (n->is_leaf() || n->op->mutates.empty()) {
      rest.push_back(t);
      continue;
    }
    for (int i : n->op->mutates) {
      const Tensor& in = n->inputs[size_t(i)];
      const std::string what = std::string(n->op->name) + ": input '" + n->op->input(size_t(i)).name + "' (" +
                               to_string(in) + (in.name().empty() ? "" : " '" + in.name() + "'") + ")";
      if (!in.is_leaf()) throw UsageError(what + " is updated in place and must be a leaf");
      if (!writer.emplace(in.node(), n).second) throw UsageError(what + " is updated by two nodes of the graph");
    }
    tokens.insert(n);
    updates.push_back(t);
  }
  rest.insert(rest.end(), updates.begin(), updates.end());
  return rest;
}

// The outputs in the order the schedule's depth-first walk meets them:
// stage by stage, each stage's last-added first. Gradients are added in the
// parameters' forward order, so the last layer's come first and each one
// runs as soon as its layer's backward is done, instead of after every
// layer's: the activations and the output gradient it reads die there.
std::vector<Tensor> backward_first(const std::vector<Tensor>& outputs, const std::vector<int>& stages) {
  std::vector<size_t> at(outputs.size());
  for (size_t i = 0; i < at.size(); ++i) at[i] = i;
  auto stage = [&](size_t i) { return i < stages.size() ? stages[i] : 0; };
  std::stable_sort(at.begin(), at.end(), [&](size_t a, size_t b) { return stage(a) != stage(b) ? stage(a) < stage(b) : a > b; });
  std::vector<Tensor> out;
  for (size_t i : at) out.push_back(outputs[i]);
  return out;
}

// The stage of each position of `order`: the earliest stage whose outputs
// need it (Graph::add_output). UsageError for a node that reads a value of an
// earlier stage other than an output or a leaf: its memory may be reused by
// the time its stage runs.
std::vector<int> assign_stages(const std::vector<Tensor>& order, const std::unordered_map<const Node*, int64_t>& pos,
                               const std::vector<Tensor>& outputs, const std::vector<int>& output_stage) {
  constexpr int kNone = -1;
  std::vector<int> stage(order.size(), kNone);
  std::vector<size_t> by_stage(outputs.size());
  for (size_t i = 0; i < by_stage.size(); ++i) by_stage[i] = i;
  std::stable_sort(by_stage.begin(), by_stage.end(),
                   [&](size_t a, size_t b) { return output_stage[a] < output_stage[b]; });
  // Taken in stage order, a marked node's inputs are all marked already.
  std::vector<const Node*> todo;
  for (size_t o : by_stage) {
    todo.push_back(outputs[o].node());
    while (!todo.empty()) {
      const Node* n = todo.back();
      todo.pop_back();
      int& s = stage[size_t(pos.at(n))];
      if (s != kNone) continue;
      s = output_stage[o];
      for (const Tensor& in : n->inputs) todo.push_back(in.node());
    }
  }
  NodeSet output_roots;
  for (const Tensor& t : outputs) output_roots.insert(t.node()->root());
  for (size_t i = 0; i < order.size(); ++i) {
    const Node* n = order[i].node();
    if (n->is_leaf()) continue;
    for (const Tensor& in : n->inputs) {
      const Node* r = in.node()->root();
      const int from = stage[size_t(pos.at(r))];
      if (r->is_leaf() || from == stage[i] || output_roots.count(r)) continue;
      throw UsageError("executor: '" + std::string(n->op->name) + "' of stage " + std::to_string(stage[i]) +
                       " reads " + to_string(in) + " of stage " + std::to_string(from) +
                       ", which is not an output: its memory may be reused before stage " +
                       std::to_string(stage[i]) + " runs; make it an output of stage " + std::to_string(from));
    }
  }
  return stage;
}

}  // namespace

Executor::Executor(const Graph& graph, ExecOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = options;
  m.backend = &find_backend(options.backend);
  const Backend& backend = *m.backend;
  if (m.options.threads <= 0) m.options.threads = cpu::default_threads();
  m.options.check_finite = m.options.check_finite || env_check_finite();
  const char* prof = std::getenv("NABLA_PROFILE");
  m.options.profile = m.options.profile || (prof && *prof && std::strcmp(prof, "0") != 0);
  m.given = graph.outputs();
  for (const auto& [original, compiled] : graph.originals()) {
    m.originals.push_back(original);
    m.replaced.emplace(original.node(), compiled);
  }
  m.outputs = backend.rewrite(m.given, &m.replaced);
  m.outputs = lower_to_kernels(m.outputs, backend, &m.replaced);
  m.order = order_updates_last(locality_order(topo_order(backward_first(m.outputs, graph.stages()))));
  std::unordered_set<const Node*> updated;  // leaves update ops write
  for (const Tensor& t : m.order) {
    for (int i : t.node()->op->mutates) updated.insert(t.node()->inputs[size_t(i)].node());
  }
  for (size_t i = 0; i < m.order.size(); ++i) {
    Node* n = m.order[i].node();
    m.pos[n] = static_cast<int64_t>(i);
    if (n->shape.size() > static_cast<size_t>(cpu::kMaxRank)) {
      throw ShapeError(std::string(n->op->name) + ": rank " + std::to_string(n->shape.size()) +
                       " exceeds the supported maximum of " + std::to_string(cpu::kMaxRank));
    }
    if (!backend.supports(n->dtype)) {
      throw DTypeError(std::string(n->op->name) + ": the " + backend.name() + " backend has no " +
                       dtype_name(n->dtype) + " kernels");
    }
    if (!n->is_leaf()) continue;
    const Backend* device = n->buffer->device;
    if (device && device != &backend) {
      throw UsageError("executor: " + to_string(m.order[i]) + (n->name.empty() ? "" : " '" + n->name + "'") +
                       " lives on '" + device->name() + "' and the graph runs on '" + backend.name() +
                       "': move it with to(\"" + backend.name() + "\")");
    }
    if (device) continue;
    if (backend.host_memory()) {
      m.host_leaves.push_back(n);
      continue;
    }
    // Parameters and what update ops write stay on the backend between runs
    // (unless another backend's mirror holds them: then copied every run).
    Buffer& b = *n->buffer;
    if ((n->is_param || updated.count(n)) && (!b.mirror || b.mirror->device == &backend)) {
      if (!b.mirror) {
        b.mirror = std::make_unique<Buffer>(backend, b.bytes);
        b.mirror_current = false;
      }
      m.mirrored.push_back(n);
      if (updated.count(n)) m.mirrored_updates.push_back(n);
      continue;
    }
    m.staged.emplace(n, std::make_unique<Buffer>(backend, n->buffer->bytes));
  }
  for (const Tensor& t : m.order) {
    for (int i : t.node()->op->mutates) {
      Node* leaf = t.node()->inputs[size_t(i)].node();
      if (m.staged.count(leaf)) m.staged_updates.push_back(leaf);
      if (backend.host_memory() && !leaf->buffer->device) m.host_updates.push_back(leaf);
    }
  }
  m.plan = plan_memory(m.order, m.outputs, options.plan_memory, options.inplace);
  size_t arena_bytes = m.plan.report.arena_bytes;
  if (options.memory_limit && arena_bytes > options.memory_limit) {
    throw Error("executor: the planned arena needs " + std::to_string(arena_bytes) +
                " bytes, over the memory limit of " + std::to_string(options.memory_limit) + " bytes");
  }
  m.arena = std::make_unique<Buffer>(backend, arena_bytes);

  m.readable.assign(m.order.size(), false);
  for (size_t i = 0; i < m.order.size(); ++i) m.readable[i] = m.order[i].node()->root()->is_leaf();
  for (const Tensor& out : m.outputs) {
    const Node* root = out.node()->root();
    for (size_t i = 0; i < m.order.size(); ++i) {
      if (m.order[i].node()->root() == root) m.readable[i] = true;
    }
  }

  const std::vector<int> stage = assign_stages(m.order, m.pos, m.outputs, graph.stages());
  m.stage_steps.resize(graph.stages().empty() ? 1 : size_t(*std::max_element(graph.stages().begin(), graph.stages().end()) + 1));
  std::vector<KernelCall> calls;
  for (size_t i = 0; i < m.order.size(); ++i) {
    const Tensor& t = m.order[i];
    const Node* n = t.node();
    if (n->is_leaf() || n->is_view()) continue;
    KernelCall c{n->op, {}};
    for (const Tensor& in : n->inputs) c.operands.in.push_back(m.view(in));
    c.operands.out = m.view(t);
    c.operands.attrs = &n->attrs;
    m.stage_steps[size_t(stage[i])].push_back(m.steps.size());
    m.all_steps.push_back(m.steps.size());
    m.steps.push_back({n->op, c.operands.out, static_cast<int64_t>(i)});
    calls.push_back(std::move(c));
  }
  m.program = backend.compile(std::move(calls), m.options);
}

Executor::~Executor() = default;
Executor::Executor(Executor&&) noexcept = default;
Executor& Executor::operator=(Executor&&) noexcept = default;

void Executor::run() { impl_->run_steps(impl_->all_steps, true); }

void Executor::run(int stage) {
  if (stage < 0 || size_t(stage) >= impl_->stage_steps.size()) {
    throw UsageError("executor: run of stage " + std::to_string(stage) + "; the graph has " +
                     std::to_string(impl_->stage_steps.size()) + " (0 to " +
                     std::to_string(impl_->stage_steps.size() - 1) + ")");
  }
  impl_->run_steps(impl_->stage_steps[size_t(stage)], stage == 0);
}

int Executor::stages() const { return int(impl_->stage_steps.size()); }

void Executor::Impl::run_steps(const std::vector<size_t>& which, bool counted) {
  for (Node* leaf : host_leaves) leaf->buffer->sync_host();
  for (const auto& [leaf, copy] : staged) {
    leaf->buffer->sync_host();
    backend->copy_in(copy->data, leaf->buffer->data, copy->bytes);
  }
  for (Node* leaf : mirrored) {
    Buffer& b = *leaf->buffer;
    if (b.mirror_current) continue;
    b.sync_host();
    backend->copy_in(b.mirror->data, b.data, b.bytes);
    b.mirror_current = true;
  }
  if (options.profile) {
    step_seconds.resize(steps.size(), 0.0);
    if (counted) ++profiled_runs;
  }
  for (size_t i : which) {
    if (!options.profile) {
      program->run(i);
    } else {
      auto t0 = std::chrono::steady_clock::now();
      program->run(i);
      backend->synchronize();
      step_seconds[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (options.check_finite) check_finite(steps[i]);
    if (!copies_after_step.empty()) {
      for (size_t c : copies_after_step[i]) {
        HostCopy& h = *host_copies[c];
        h.fence = backend->copy_out_queued(h.host, h.src, h.bytes);
        if (h.queued) h.queued();
      }
    }
    if (!after_step.empty() && !after_step[i].empty()) {
      backend->synchronize();
      for (const auto& done : after_step[i]) done();
    }
  }
  // What update ops wrote into staged leaves goes back to the host leaves.
  backend->synchronize();
  for (const Node* leaf : staged_updates) backend->copy_out(leaf->buffer->data, staged.at(leaf)->data, leaf->buffer->bytes);
  // The updated leaves' latest values are their mirrors' now (or, on the
  // host, their own).
  for (Node* leaf : mirrored_updates) leaf->buffer->host_current = false;
  for (Node* leaf : host_updates) leaf->buffer->mirror_current = false;
}

std::string Executor::profile() const {
  const Impl& m = *impl_;
  if (m.step_seconds.empty()) return "";
  std::map<std::string, std::pair<double, int>> by_op;
  double total = 0;
  for (size_t i = 0; i < m.step_seconds.size(); ++i) {
    auto& e = by_op[m.steps[i].op->name];
    e.first += m.step_seconds[i];
    e.second += 1;
    total += m.step_seconds[i];
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_op.begin(), by_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::string out;
  char line[160];
  for (const auto& [name, e] : rows) {
    std::snprintf(line, sizeof line, "%-20s %6.1f%% %10.1f ms %6d nodes\n", name.c_str(),
                  total > 0 ? 100 * e.first / total : 0.0, 1e3 * e.first, e.second);
    out += line;
  }
  // Where the time goes by op and shape: nodes of one op with the same
  // operand shapes (a layer's copies) are one line, with the mean time of
  // one node in one run.
  std::map<std::string, std::pair<double, int>> by_shape;
  for (size_t i = 0; i < m.step_seconds.size(); ++i) {
    const Node* n = m.order[m.steps[i].position].node();
    std::string ins;
    for (const Tensor& in : n->inputs) ins += (ins.empty() ? "" : ", ") + to_string(in.shape()) + (in.is_contiguous() ? "" : "s");
    auto& e = by_shape[std::string(n->op->name) + " " + to_string(n->shape) + " <- " + ins];
    e.first += m.step_seconds[i];
    e.second += 1;
  }
  rows.assign(by_shape.begin(), by_shape.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  out += "by op and shape (total over " + std::to_string(m.profiled_runs) + " runs, nodes, mean per node and run):\n";
  for (size_t k = 0; k < std::min<size_t>(24, rows.size()); ++k) {
    const auto& [key, e] = rows[k];
    std::snprintf(line, sizeof line, "  %5.1f%% %9.1f ms %4d x %8.1f us  ", total > 0 ? 100 * e.first / total : 0.0,
                  1e3 * e.first, e.second, 1e6 * e.first / (double(e.second) * double(m.profiled_runs)));
    out += line + key + "\n";
  }
  return out;
}

void Executor::reset_profile() {
  impl_->step_seconds.assign(impl_->step_seconds.size(), 0.0);
  impl_->profiled_runs = 0;
}

bool Executor::on_computed(const Tensor& given, std::function<void()> done) {
  if (!given.defined()) throw UsageError("executor: on_computed of an undefined tensor");
  Impl& m = *impl_;
  const int64_t step = m.step_writing(m.compiled(given).node()->root(), given);
  if (step < 0) return false;
  m.after_step.resize(m.steps.size());
  m.after_step[size_t(step)].push_back(std::move(done));
  return true;
}

int Executor::host_copy(const Tensor& given, std::function<void()> queued) {
  if (!given.defined()) throw UsageError("executor: host_copy of an undefined tensor");
  Impl& m = *impl_;
  const Tensor t = m.compiled(given);
  auto it = m.pos.find(t.node());
  if (it == m.pos.end()) throw UsageError("executor: " + to_string(given) + " is not part of this graph");
  if (!m.readable[it->second]) {
    throw UsageError("executor: host_copy of " + to_string(t) + ", an intermediate whose memory the plan reuses");
  }
  if (!t.is_contiguous()) throw UsageError("executor: host_copy of the strided " + to_string(t));
  const int64_t step = m.step_writing(t.node()->root(), given);
  if (step < 0) return -1;
  const size_t bytes = size_t(t.numel()) * dtype_size(t.dtype());
  std::unique_ptr<Impl::HostCopy> h(
      new Impl::HostCopy{m.backend, m.view(t).data, bytes, m.backend->allocate_host(bytes), nullptr, std::move(queued)});
  m.copies_after_step.resize(m.steps.size());
  m.copies_after_step[size_t(step)].push_back(m.host_copies.size());
  m.host_copies.push_back(std::move(h));
  return int(m.host_copies.size()) - 1;
}

const void* Executor::host_copied(int id) const {
  const Impl& m = *impl_;
  if (id < 0 || size_t(id) >= m.host_copies.size()) {
    throw UsageError("executor: no host copy " + std::to_string(id) + " (" + std::to_string(m.host_copies.size()) +
                     " registered)");
  }
  const Impl::HostCopy& h = *m.host_copies[size_t(id)];
  if (!h.fence) throw UsageError("executor: host copy " + std::to_string(id) + " read before a run");
  h.fence->wait();
  return h.host;
}

const MemoryReport& Executor::memory() const { return impl_->plan.report; }
int Executor::threads() const { return impl_->options.threads; }

void Executor::read(const Tensor& t, void* dst, size_t bytes) const {
  if (!t.defined()) throw UsageError("executor: read of an undefined tensor");
  read_checked(t, t.dtype(), dst, bytes);
}

void Executor::read_checked(const Tensor& given, DType dtype, void* dst, size_t bytes) const {
  if (!given.defined()) throw UsageError("executor: read of an undefined tensor");
  const Tensor t = impl_->compiled(given);
  auto it = impl_->pos.find(t.node());
  if (it == impl_->pos.end()) throw UsageError("executor: " + to_string(t) + " is not part of this graph");
  if (!impl_->readable[it->second]) {
    throw UsageError("executor: " + to_string(t) +
                     " is an intermediate whose memory the plan reuses; add it to the graph's outputs");
  }
  if (dtype != t.dtype()) {
    throw DTypeError(std::string("executor: read as ") + dtype_name(dtype) + " of a " + dtype_name(t.dtype()) +
                     " tensor");
  }
  size_t need = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  if (bytes != need) {
    throw ShapeError("executor: read of " + to_string(t) + " needs " + std::to_string(need) +
                     " bytes, got a buffer of " + std::to_string(bytes));
  }
  impl_->copy_to_host(impl_->view(t), dst);
}

const void* Executor::data(const Tensor& given) const {
  if (!given.defined()) throw UsageError("executor: data() of an undefined tensor");
  const Tensor t = impl_->compiled(given);
  auto it = impl_->pos.find(t.node());
  if (it == impl_->pos.end()) throw UsageError("executor: " + to_string(t) + " is not part of this graph");
  if (!impl_->readable[it->second]) {
    throw UsageError("executor: " + to_string(t) + " is an intermediate whose memory the plan reuses");
  }
  if (!t.is_contiguous()) throw UsageError("executor: data() of the strided " + to_string(t) + "; use read()");
  if (!impl_->backend->host_memory()) {
    throw UsageError("executor: data() of " + to_string(t) + " in the memory of the '" + impl_->backend->name() +
                     "' backend; use read()");
  }
  return impl_->view(t).data;
}

Tensor Executor::fetch(const Tensor& t) const {
  Tensor out = Tensor::zeros(t.dtype(), t.shape());
  read(t, out.data(), static_cast<size_t>(t.numel()) * dtype_size(t.dtype()));
  return out;
}

std::vector<Tensor> eval(const std::vector<Tensor>& outputs, ExecOptions options) {
  Graph g(outputs);
  Executor ex(g, options);
  ex.run();
  std::vector<Tensor> values;
  for (const Tensor& t : outputs) values.push_back(ex.fetch(t));
  return values;
}

Tensor eval(const Tensor& output, ExecOptions options) { return eval(std::vector<Tensor>{output}, options)[0]; }

}  // namespace nabla
