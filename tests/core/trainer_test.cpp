// TrainStep: what it compiles for the optimizer.
#include <gtest/gtest.h>

#include <cmath>

#include "core/node.h"
#include "nabla/nabla.hpp"
#include "nabla/trainer.h"

using namespace nabla;

namespace {
Tensor ramp(Shape shape, double scale) {
  Tensor t = Tensor::zeros(DType::f32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = float(std::sin(scale * double(i + 1)));
  return t;
}
}  // namespace

// layer_norm_affine's backward gives dx, dgamma and dbeta in one buffer; the
// step copies the parameters' gradients out, so that buffer is not held for
// the rest of the step, and they read as the gradients computed on their own.
TEST(TrainStep, ParameterGradientsHaveMemoryOfTheirOwn) {
  nn::Params params;
  Tensor gamma = params.add("gamma", ramp({16}, 0.3)), beta = params.add("beta", ramp({16}, 0.7));
  Tensor x = ramp({8, 16}, 1.1);
  Tensor loss = sum(square(layer_norm(x, gamma, beta, 1e-5) * ramp({8, 16}, 0.5)));
  std::vector<Tensor> expect = eval(grad(loss, {gamma, beta}), {.threads = 1});
  TrainStep step(loss, params, {}, optim::AdamWConfig{}, ExecOptions{.threads = 1});
  step.run();
  ASSERT_EQ(step.gradients().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Tensor& g = step.gradients()[i];
    EXPECT_FALSE(g.node()->is_view()) << params.list()[i].first;
    std::vector<float> got = step.executor().read<float>(g), want = expect[i].to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-4 * (1 + std::abs(want[j])));
  }
}
