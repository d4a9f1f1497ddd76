// Losses and gradients are bit-identical at 1, 2 and 4 threads.
#include <gtest/gtest.h>

#include <cstring>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

Tensor random_leaf(Shape shape, uint32_t seed) {
  Tensor t = Tensor::zeros(DType::f32, shape);
  uint32_t s = seed * 2654435761u + 7;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    t.data_as<float>()[i] = (float(s >> 8) / float(1 << 24)) * 2 - 1;
  }
  return t;
}

struct StepResult {
  std::vector<float> loss;
  std::vector<std::vector<float>> grads;
};

// An MLP large enough that every kernel splits into many chunks.
StepResult train_step(int threads) {
  Tensor x = random_leaf({512, 96}, 1);
  Tensor w1 = random_leaf({96, 256}, 2).requires_grad();
  Tensor b1 = random_leaf({256}, 3).requires_grad();
  Tensor w2 = random_leaf({256, 10}, 4).requires_grad();
  Tensor labels = Tensor::zeros(DType::i32, {512});
  for (int i = 0; i < 512; ++i) labels.data_as<int32_t>()[i] = (i * 7) % 10;
  Tensor h = silu(matmul(x, w1) * 0.1 + b1);
  Tensor logits = matmul(h, w2);
  Tensor m = max(logits, {-1}, true);
  Tensor lse = log(sum(exp(logits - m), {-1}, true)) + m;
  Tensor eye = Tensor::zeros(DType::f32, {10, 10});
  for (int i = 0; i < 10; ++i) eye.data_as<float>()[i * 11] = 1;
  Tensor picked = sum(logits * get_rows(eye, labels), {-1}, true);
  Tensor loss = mean(lse - picked) + sum(square(w1)) * 1e-4;
  Graph g;
  g.backward(loss);
  Executor ex(g, {.threads = threads});
  ex.run();
  StepResult r;
  r.loss = ex.read<float>(loss);
  for (const Tensor& p : g.parameters()) r.grads.push_back(ex.read<float>(g.grad(p)));
  return r;
}

}  // namespace

TEST(Determinism, BitIdenticalAcrossThreadCounts) {
  StepResult one = train_step(1);
  for (int threads : {2, 4}) {
    StepResult other = train_step(threads);
    ASSERT_EQ(std::memcmp(one.loss.data(), other.loss.data(), sizeof(float)), 0) << "threads " << threads;
    ASSERT_EQ(one.grads.size(), other.grads.size());
    for (size_t i = 0; i < one.grads.size(); ++i) {
      ASSERT_EQ(one.grads[i].size(), other.grads[i].size());
      EXPECT_EQ(std::memcmp(one.grads[i].data(), other.grads[i].data(), one.grads[i].size() * sizeof(float)), 0)
          << "gradient " << i << " differs at " << threads << " threads";
    }
  }
}
