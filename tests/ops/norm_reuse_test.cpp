// Regression: ggml's rms_norm_back gave wrong gradients on its threaded path
// because a buffer the backward read had already been reused. Here a stack of
// layer_norms and rms_norms (affine, residual adds, a loss through all of
// them) gives the planner many buffers to reuse while the fused backward ops
// still read forward values; every gradient must match finite differences at
// 1, 2 and 4 threads, with the memory plan on.
//
//   N rows, C features: x [N, C]; gamma*, beta* [C]; w [C, C]
#include <gtest/gtest.h>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

constexpr int64_t N = 4, C = 6;

Tensor random_leaf(Shape shape, uint32_t seed, double offset = 0) {
  Tensor t = Tensor::zeros(DType::f64, shape);
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    t.data_as<double>()[i] = offset + (double(s >> 8) / double(1 << 24)) * 2 - 1;
  }
  return t;
}

// in: x, gamma1, beta1, gamma2, gamma3, beta3, gamma4, w.
Tensor norm_stack(const std::vector<Tensor>& in) {
  const Tensor &x = in[0], &g1 = in[1], &b1 = in[2], &g2 = in[3], &g3 = in[4], &b3 = in[5],
               &g4 = in[6], &w = in[7];
  Tensor acc = Tensor::scalar(0.0, x.dtype());
  Tensor h = x;
  for (int block = 0; block < 2; ++block) {
    // Pre-norm residual blocks, as in a transformer.
    h = h + matmul(layer_norm(h, g1, b1, 1e-5), w);
    h = h + gelu(rms_norm(h, g2, 1e-5));
    acc = acc + sum(layer_norm(h, 1e-5) * h) * 0.1;
    h = h + layer_norm(h, g3, b3, 1e-5) * 0.5;
    h = rms_norm(h, g4, 1e-5) + h * 0.25;
    acc = acc + sum(square(rms_norm(h, 1e-5))) * 0.05;
  }
  return tanh(layer_norm(h, 1e-5)) + acc;
}

std::vector<Tensor> stack_inputs() {
  return {random_leaf({N, C}, 1),   random_leaf({C}, 2, 1.0), random_leaf({C}, 3),
          random_leaf({C}, 4, 1.0), random_leaf({C}, 5, 1.0), random_leaf({C}, 6),
          random_leaf({C}, 7, 1.0), random_leaf({C, C}, 8)};
}

}  // namespace

TEST(NormReuse, GradientsMatchFiniteDifferencesWithReuseAtAnyThreadCount) {
  std::vector<Tensor> inputs = stack_inputs();
  int64_t entries = 0;
  for (const Tensor& t : inputs) entries += t.numel();
  for (int threads : {1, 2, 4}) {
    GradcheckOptions opt;
    opt.threads = threads;
    opt.plan_memory = true;
    opt.max_grain = threads > 1 ? 1 : 0;  // split every kernel into one-item chunks
    GradcheckResult r = gradcheck(norm_stack, inputs, opt);
    EXPECT_TRUE(r.ok) << "threads " << threads << ": " << r.message;
    EXPECT_EQ(r.checked, entries) << "threads " << threads;
  }
}

TEST(NormReuse, PlanReusesBuffersAndMatchesTheUnplannedRun) {
  std::vector<Tensor> inputs = stack_inputs();
  Tensor loss = sum(norm_stack(inputs));
  std::vector<Tensor> grads = grad(loss, inputs);
  Graph g({loss});
  for (const Tensor& t : grads) g.add_output(t);

  Executor planned(g, {.threads = 4, .plan_memory = true, .max_grain = 1});
  Executor unplanned(g, {.threads = 1, .plan_memory = false});
  // Reuse really happened, so the backward ran while forward buffers were
  // being recycled.
  EXPECT_LT(planned.memory().arena_bytes, unplanned.memory().arena_bytes);
  EXPECT_EQ(unplanned.memory().arena_bytes, unplanned.memory().unplanned_bytes);
  planned.run();
  unplanned.run();
  // Bit-identical: kernels split work independently of the thread count.
  for (const Tensor& t : g.outputs()) EXPECT_EQ(planned.read<double>(t), unplanned.read<double>(t));
}
