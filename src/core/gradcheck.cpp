// The public gradient checker: analytic VJP against central differences in
// f64, then the f32 kernels against the f64 gradients.
#include "nabla/gradcheck.h"

#include <cmath>
#include <random>
#include <sstream>

#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/graph.h"
#include "nabla/ops.h"

namespace nabla {

namespace {

Tensor cast_leaf(const Tensor& t, DType to) {
  if (t.dtype() == to || !is_floating(t.dtype())) return t;
  std::vector<double> v = t.to_vector<double>();
  Tensor out = Tensor::zeros(to, t.shape());
  float* p = static_cast<float*>(out.data());
  for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<float>(v[i]);
  return out;
}

// L = <v, y>, with v reaching y through the chosen route.
Tensor route_loss(const Tensor& y, const Tensor& v, Cotangent how) {
  if (how == Cotangent::transposed && y.rank() >= 2) return sum(transpose(y) * v);
  if (how == Cotangent::broadcast && y.rank() >= 1) return sum(sum(y, {-1}, true) * v);
  return sum(y * v);
}

Shape cotangent_shape(const Tensor& y, Cotangent how) {
  Shape s = y.shape();
  if (how == Cotangent::transposed && y.rank() >= 2) std::swap(s[s.size() - 1], s[s.size() - 2]);
  if (how == Cotangent::broadcast && y.rank() >= 1) s.back() = 1;
  return s;
}

std::string describe(size_t input, int64_t flat, const Shape& shape) {
  std::ostringstream os;
  os << "input " << input << " " << to_string(shape) << " entry " << flat;
  return os.str();
}

}  // namespace

GradcheckResult gradcheck(const Function& f, const std::vector<Tensor>& inputs, const GradcheckOptions& opt,
                          std::vector<bool> differentiable) {
  GradcheckResult res;
  if (differentiable.empty()) differentiable.assign(inputs.size(), true);
  if (differentiable.size() != inputs.size()) {
    throw UsageError("gradcheck: differentiable has " + std::to_string(differentiable.size()) +
                     " flags for " + std::to_string(inputs.size()) + " inputs");
  }
  std::vector<size_t> targets;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].is_leaf()) throw UsageError("gradcheck: inputs must be leaves");
    if (is_floating(inputs[i].dtype()) && inputs[i].dtype() != DType::f64) {
      throw DTypeError(std::string("gradcheck: floating inputs must be f64, input ") + std::to_string(i) + " is " +
                       dtype_name(inputs[i].dtype()));
    }
    if (inputs[i].dtype() == DType::f64 && differentiable[i]) targets.push_back(i);
  }
  ExecOptions exec{.threads = opt.threads, .plan_memory = opt.plan_memory, .max_grain = opt.max_grain};
  exec.backend = opt.backend;

  // ---- f64: analytic.
  Tensor y = f(inputs);
  if (y.dtype() != DType::f64) {
    throw DTypeError(std::string("gradcheck: f must return f64 for f64 inputs, got ") + dtype_name(y.dtype()));
  }
  std::mt19937_64 rng(opt.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Tensor v = Tensor::zeros(DType::f64, cotangent_shape(y, opt.cotangent));
  for (int64_t i = 0; i < v.numel(); ++i) v.data_as<double>()[i] = normal(rng);
  Tensor loss = route_loss(y, v, opt.cotangent);
  std::vector<Tensor> wrt;
  for (size_t i : targets) wrt.push_back(inputs[i]);
  std::vector<Tensor> grads = grad(loss, wrt);
  Graph g({loss, y});
  for (const Tensor& t : grads) g.add_output(t);
  Executor ex(g, exec);
  ex.run();
  std::vector<double> y64 = ex.read<double>(y);
  std::vector<std::vector<double>> analytic;
  for (const Tensor& t : grads) analytic.push_back(ex.read<double>(t));

  // ---- f64: central differences of the loss alone.
  Graph fg({loss});
  Executor fx(fg, exec);
  for (size_t k = 0; k < targets.size(); ++k) {
    Tensor x = inputs[targets[k]];
    double* p = x.data_as<double>();
    for (int64_t j = 0; j < x.numel(); ++j) {
      double saved = p[j];
      p[j] = saved + opt.step;
      fx.run();
      double lp = fx.read<double>(loss)[0];
      p[j] = saved - opt.step;
      fx.run();
      double lm = fx.read<double>(loss)[0];
      p[j] = saved;
      double numeric = (lp - lm) / (2 * opt.step);
      double err = std::abs(analytic[k][j] - numeric) / (opt.f64_atol + opt.f64_rtol * std::abs(numeric));
      ++res.checked;
      if (!(err <= res.f64_max_error)) res.f64_max_error = std::isnan(err) ? INFINITY : err;
      if (!(err <= 1.0) && res.ok) {
        res.ok = false;
        std::ostringstream os;
        os << "f64 gradient of " << describe(targets[k], j, x.shape()) << ": analytic " << analytic[k][j]
           << ", finite difference " << numeric;
        res.message = os.str();
      }
    }
  }
  if (!opt.check_f32) return res;

  // ---- f32 kernels against the f64 results.
  std::vector<Tensor> inputs32;
  for (const Tensor& t : inputs) inputs32.push_back(cast_leaf(t, DType::f32));
  Tensor y32 = f(inputs32);
  Tensor loss32 = route_loss(y32, cast_leaf(v, DType::f32), opt.cotangent);
  std::vector<Tensor> wrt32;
  for (size_t i : targets) wrt32.push_back(inputs32[i]);
  std::vector<Tensor> grads32 = grad(loss32, wrt32);
  Graph g32({loss32, y32});
  for (const Tensor& t : grads32) g32.add_output(t);
  Executor ex32(g32, exec);
  ex32.run();

  auto compare = [&](const std::vector<double>& ref, const std::vector<float>& got, const std::string& what) {
    double scale = 1.0;
    for (double r : ref) scale = std::max(scale, std::abs(r));
    for (size_t j = 0; j < ref.size(); ++j) {
      double err = std::abs(double(got[j]) - ref[j]) / (opt.f32_atol * scale + opt.f32_rtol * std::abs(ref[j]));
      if (!(err <= res.f32_max_error)) res.f32_max_error = std::isnan(err) ? INFINITY : err;
      if (!(err <= 1.0) && res.ok) {
        res.ok = false;
        std::ostringstream os;
        os << "f32 " << what << " entry " << j << ": f32 " << got[j] << ", f64 " << ref[j];
        res.message = os.str();
      }
    }
  };
  compare(y64, ex32.read<float>(y32), "output");
  for (size_t k = 0; k < targets.size(); ++k) {
    compare(analytic[k], ex32.read<float>(grads32[k]), "gradient of input " + std::to_string(targets[k]));
  }
  return res;
}

}  // namespace nabla
