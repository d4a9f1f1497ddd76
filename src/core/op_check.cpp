#include "core/op_check.h"

#include <random>

#include "nabla/error.h"

namespace nabla {

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::transposed: return "transposed";
    case Layout::strided: return "strided";
    case Layout::broadcast: return "broadcast";
    case Layout::offset: return "offset";
  }
  return "?";
}

namespace {

int first_axis_over_one(const Shape& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] > 1) return static_cast<int>(i);
  }
  return -1;
}

int last_axis_over_one(const Shape& s) {
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] > 1) return static_cast<int>(i);
  }
  return -1;
}

bool input_takes(const Shape& s, Layout l) {
  switch (l) {
    case Layout::contiguous: return true;
    case Layout::transposed: return s.size() >= 2 && s[s.size() - 1] > 1 && s[s.size() - 2] > 1;
    case Layout::strided: return last_axis_over_one(s) >= 0;
    case Layout::broadcast: return first_axis_over_one(s) >= 0;
    case Layout::offset: return true;
  }
  return false;
}

// The leaf's shape for an input of shape s in layout l.
Shape leaf_shape(const Shape& s, Layout l) {
  Shape out = s;
  switch (l) {
    case Layout::contiguous: break;
    case Layout::transposed: std::swap(out[out.size() - 1], out[out.size() - 2]); break;
    case Layout::strided: out[last_axis_over_one(s)] *= 2; break;
    case Layout::broadcast: out[first_axis_over_one(s)] = 1; break;
    case Layout::offset: out = {numel(s) + 3}; break;
  }
  return out;
}

// The view of `leaf` that has shape s in layout l.
Tensor layout_view(const Tensor& leaf, const Shape& s, Layout l) {
  switch (l) {
    case Layout::contiguous: return leaf;
    case Layout::transposed: return transpose(leaf);
    case Layout::strided: {
      int a = last_axis_over_one(s);
      return slice(leaf, a, 0, leaf.shape()[a], 2);
    }
    case Layout::broadcast: return expand(leaf, s);
    case Layout::offset: return reshape(slice(leaf, 0, 3, 3 + numel(s)), s);
  }
  return leaf;
}

Tensor make_leaf(const CaseInput& in, const Shape& shape, std::mt19937_64& rng) {
  if (in.init == Init::integers) {
    Tensor t = Tensor::zeros(DType::i32, shape);
    std::uniform_int_distribution<int32_t> d(static_cast<int32_t>(in.lo), static_cast<int32_t>(in.hi) - 1);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<int32_t>()[i] = d(rng);
    return t;
  }
  Tensor t = Tensor::zeros(DType::f64, shape);
  std::normal_distribution<double> n(0.0, 1.0);
  std::uniform_real_distribution<double> u(in.lo, in.hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<double>()[i] = in.init == Init::uniform ? u(rng) : n(rng);
  return t;
}

}  // namespace

bool layout_applies(const GradCase& c, Layout l) {
  for (const CaseInput& in : c.inputs) {
    if (input_takes(in.shape, l)) return true;
  }
  return false;
}

GradcheckResult check_op_case(const OpDef& op, const GradCase& c, Layout l, int threads, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Tensor> leaves;
  std::vector<Layout> layouts;
  std::vector<bool> checked;
  for (const CaseInput& in : c.inputs) {
    Layout il = input_takes(in.shape, l) ? l : Layout::contiguous;
    layouts.push_back(il);
    leaves.push_back(make_leaf(in, leaf_shape(in.shape, il), rng));
    checked.push_back(in.checked);
  }
  Function f = [&c, &layouts](const std::vector<Tensor>& xs) {
    std::vector<Tensor> views;
    for (size_t i = 0; i < xs.size(); ++i) views.push_back(layout_view(xs[i], c.inputs[i].shape, layouts[i]));
    return c.build(views);
  };
  GradcheckOptions opt;
  opt.threads = threads;
  // Several threads: also split every kernel into one-item chunks, so tiny
  // test tensors still cross chunk boundaries and run on several threads.
  if (threads > 1) opt.max_grain = 1;
  opt.seed = seed + 1;
  opt.cotangent = l == Layout::transposed  ? Cotangent::transposed
                  : l == Layout::broadcast ? Cotangent::broadcast
                                           : Cotangent::dense;
  return gradcheck(f, leaves, opt, checked);
}

std::vector<std::string> registry_problems() {
  std::vector<std::string> problems;
  for (const OpDef* op : all_ops()) {
    std::string name = op->name;
    bool any_diff = false;
    for (size_t i = 0; i < op->inputs.size(); ++i) any_diff = any_diff || op->differentiable(i);
    if (any_diff && !op->backward) problems.push_back(name + ": differentiates an input but has no backward");
    if (!op->is_view && !op->forward) problems.push_back(name + ": has no CPU kernel");
    if (!op->cases) {
      problems.push_back(name + ": has no gradient cases");
      continue;
    }
    std::vector<GradCase> cases = op->cases();
    if (cases.empty()) problems.push_back(name + ": has no gradient cases");
    bool strided = false;
    for (const GradCase& c : cases) strided = strided || layout_applies(c, Layout::strided);
    if (!strided) problems.push_back(name + ": no gradient case can take a strided layout");
  }
  return problems;
}

}  // namespace nabla
