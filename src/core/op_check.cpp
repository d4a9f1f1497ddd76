#include "core/op_check.h"

#include <cmath>
#include <optional>
#include <random>

#include "backend/cpu/kernel.h"
#include "nabla/executor.h"
#include "nabla/graph.h"

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

namespace {

struct CaseSetup {
  std::vector<Tensor> leaves;
  std::vector<Layout> layouts;
  std::vector<bool> checked;
};

CaseSetup make_case(const GradCase& c, Layout l, uint64_t seed) {
  std::mt19937_64 rng(seed);
  CaseSetup s;
  for (const CaseInput& in : c.inputs) {
    Layout il = input_takes(in.shape, l) ? l : Layout::contiguous;
    s.layouts.push_back(il);
    s.leaves.push_back(make_leaf(in, leaf_shape(in.shape, il), rng));
    s.checked.push_back(in.checked);
  }
  return s;
}

Tensor build_case(const GradCase& c, const CaseSetup& s, const std::vector<Tensor>& xs) {
  std::vector<Tensor> views;
  for (size_t i = 0; i < xs.size(); ++i) views.push_back(layout_view(xs[i], c.inputs[i].shape, s.layouts[i]));
  return c.build(views);
}

}  // namespace

GradcheckResult check_composite(const OpDef& op, const GradCase& c, Layout l, int threads, uint64_t seed) {
  CaseSetup s = make_case(c, l, seed);
  std::vector<Tensor> wrt;
  for (size_t i = 0; i < s.leaves.size(); ++i) {
    if (s.checked[i] && s.leaves[i].dtype() == DType::f64) wrt.push_back(s.leaves[i]);
  }
  auto values = [&](bool composite) {
    std::optional<CompositeMode> mode;
    if (composite) mode.emplace();
    Tensor y = build_case(c, s, s.leaves);
    std::mt19937_64 rng(seed + 7);
    std::normal_distribution<double> n(0.0, 1.0);
    Tensor v = Tensor::zeros(DType::f64, y.shape());
    for (int64_t i = 0; i < v.numel(); ++i) v.data_as<double>()[i] = n(rng);
    std::vector<Tensor> outs{y};
    if (!wrt.empty()) {
      std::vector<Tensor> gs = grad(sum(y * v), wrt);
      outs.insert(outs.end(), gs.begin(), gs.end());
    }
    std::vector<Tensor> got = eval(outs, {.threads = threads});
    std::vector<std::vector<double>> out;
    for (const Tensor& t : got) out.push_back(t.to_vector<double>());
    return out;
  };
  std::vector<std::vector<double>> fused = values(false), reference = values(true);
  GradcheckResult r;
  for (size_t k = 0; k < fused.size(); ++k) {
    double scale = 1.0;
    for (double x : reference[k]) scale = std::max(scale, std::abs(x));
    for (size_t j = 0; j < fused[k].size(); ++j) {
      double err = std::abs(fused[k][j] - reference[k][j]) / (1e-10 * scale);
      r.f64_max_error = std::max(r.f64_max_error, err);
      ++r.checked;
      if (!(err <= 1.0) && r.ok) {
        r.ok = false;
        r.message = std::string(op.name) + " vs its composite: " + (k == 0 ? "output" : "gradient " + std::to_string(k - 1)) +
                    " entry " + std::to_string(j) + ": fused " + std::to_string(fused[k][j]) + ", composite " +
                    std::to_string(reference[k][j]);
      }
    }
  }
  return r;
}

GradcheckResult check_op_case(const OpDef& op, const GradCase& c, Layout l, int threads, uint64_t seed,
                              const std::string& backend) {
  CaseSetup s = make_case(c, l, seed);
  Function f = [&c, &s](const std::vector<Tensor>& xs) { return build_case(c, s, xs); };
  GradcheckOptions opt;
  opt.threads = threads;
  // Several threads: also split every kernel into one-item chunks, so tiny
  // test tensors still cross chunk boundaries and run on several threads.
  if (threads > 1) opt.max_grain = 1;
  opt.seed = seed + 1;
  opt.cotangent = l == Layout::transposed  ? Cotangent::transposed
                  : l == Layout::broadcast ? Cotangent::broadcast
                                           : Cotangent::dense;
  opt.backend = backend;
  return gradcheck(f, s.leaves, opt, s.checked);
}

namespace {

Tensor to_f32(const Tensor& t) {
  if (t.dtype() != DType::f64) return t;
  const std::vector<double> v = t.to_vector<double>();
  return Tensor::from_vector<float>(t.shape(), std::vector<float>(v.begin(), v.end()));
}

}  // namespace

GradcheckResult check_backend(const OpDef& op, const GradCase& c, Layout l, const std::string& backend,
                              uint64_t seed) {
  GradcheckResult r;
  for (const DType dtype : {DType::f64, DType::f32}) {
    CaseSetup s = make_case(c, l, seed);
    if (dtype == DType::f32) {
      for (Tensor& t : s.leaves) t = to_f32(t);
    }
    std::vector<Tensor> wrt;
    for (size_t i = 0; i < s.leaves.size(); ++i) {
      if (s.checked[i] && s.leaves[i].dtype() == dtype) wrt.push_back(s.leaves[i]);
    }
    Tensor y = build_case(c, s, s.leaves);
    std::vector<Tensor> outs{y};
    if (!wrt.empty() && is_floating(y.dtype())) {
      std::mt19937_64 rng(seed + 7);
      std::normal_distribution<double> n(0.0, 1.0);
      std::vector<double> v(size_t(y.numel()));
      for (double& x : v) x = n(rng);
      Tensor cot = Tensor::from_vector<double>(y.shape(), v);
      if (y.dtype() == DType::f32) cot = to_f32(cot);
      std::vector<Tensor> gs = grad(sum(y * cot), wrt);
      outs.insert(outs.end(), gs.begin(), gs.end());
    }
    const std::vector<Tensor> want = eval(outs, {.threads = 2});
    const std::vector<Tensor> got = eval(outs, {.threads = 1, .backend = backend});
    const double tol = dtype == DType::f64 ? kBackendF64 : kBackendF32;
    for (size_t k = 0; k < outs.size(); ++k) {
      std::vector<double> w(size_t(want[k].numel())), g(size_t(got[k].numel()));
      for (int64_t j = 0; j < want[k].numel(); ++j) {
        w[size_t(j)] = want[k].item(j);
        g[size_t(j)] = got[k].item(j);
      }
      double scale = 1.0;
      for (double x : w) scale = std::max(scale, std::abs(x));
      for (size_t j = 0; j < w.size(); ++j) {
        const double err = std::abs(g[j] - w[j]) / (tol * scale + tol * std::abs(w[j]));
        ++r.checked;
        double& worst = dtype == DType::f64 ? r.f64_max_error : r.f32_max_error;
        worst = std::max(worst, std::isnan(err) ? INFINITY : err);
        if (!(err <= 1.0) && r.ok) {
          r.ok = false;
          r.message = std::string(op.name) + " on " + backend + " vs cpu, " + dtype_name(dtype) + " " +
                      (k == 0 ? std::string("output") : "gradient " + std::to_string(k - 1)) + " entry " +
                      std::to_string(j) + ": " + backend + " " + std::to_string(g[j]) + ", cpu " + std::to_string(w[j]);
        }
      }
    }
  }
  return r;
}

std::vector<std::string> registry_problems() {
  std::vector<std::string> problems;
  for (const OpDef* op : all_ops()) {
    std::string name = op->name;
    bool any_diff = false;
    for (size_t i = 0; i < op->inputs.size(); ++i) any_diff = any_diff || op->differentiable(i);
    if (any_diff && !op->backward && !op->composite) {
      problems.push_back(name + ": differentiates an input but has no backward");
    }
    if (op->fused && !op->composite) problems.push_back(name + ": is fused but has no composite");
    if (!op->is_view && !cpu::kernel_of(*op)) problems.push_back(name + ": has no CPU kernel");
    if (!op->mutates.empty()) {
      // An update op: no function to differentiate (tests/core/update_ops_test.cpp).
      if (any_diff) problems.push_back(name + ": updates inputs in place but differentiates one");
      if (op->cases) problems.push_back(name + ": updates inputs in place but has gradient cases");
      continue;
    }
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
