// Checks analytic gradients against finite differences, for any function.
//
// For a random cotangent v, the loss L(x) = <v, f(x)> is differentiated by
// nabla's autodiff (the vector-Jacobian product) and by central differences of
// L in f64. Then the same graph in f32 is compared with the f64 gradients.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nabla/tensor.h"

namespace nabla {

// How the cotangent reaches f's output. Non-dense routes make the backward
// rules receive strided incoming gradients.
enum class Cotangent { dense, transposed, broadcast };

struct GradcheckOptions {
  double step = 1e-6;        // finite-difference step (f64)
  double f64_atol = 1e-7, f64_rtol = 1e-6;
  double f32_atol = 1e-4, f32_rtol = 1e-3;  // relative to the gradient's scale
  int threads = 1;
  bool plan_memory = true;
  bool check_f32 = true;
  int64_t max_grain = 0;  // ExecOptions::max_grain
  Cotangent cotangent = Cotangent::dense;
  uint64_t seed = 1;
  std::string backend = "cpu";  // ExecOptions::backend
};

struct GradcheckResult {
  bool ok = true;
  double f64_max_error = 0;  // worst |analytic - numeric| / (atol + rtol |numeric|), <= 1 passes
  double f32_max_error = 0;  // likewise for f32 against f64
  int checked = 0;           // gradient entries compared
  std::string message;       // the first failure, naming the input and entry
};

using Function = std::function<Tensor(const std::vector<Tensor>&)>;

// `inputs` are f64 leaves (i32 leaves are passed through untouched). Every
// f64 input listed in `differentiable` (all f64 inputs when empty) is checked.
GradcheckResult gradcheck(const Function& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {},
                          std::vector<bool> differentiable = {});

}  // namespace nabla
