// Losses and gradients are bit-identical at 1, 2 and 4 threads.
#include <gtest/gtest.h>

#include <cmath>
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
StepResult train_step(int threads, bool bf16_matmul = false) {
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
  Executor ex(g, {.threads = threads, .bf16_matmul = bf16_matmul});
  ex.run();
  StepResult r;
  r.loss = ex.read<float>(loss);
  for (const Tensor& p : g.parameters()) r.grads.push_back(ex.read<float>(g.grad(p)));
  return r;
}

void expect_bit_identical_across_threads(bool bf16_matmul) {
  StepResult one = train_step(1, bf16_matmul);
  for (int threads : {2, 4}) {
    StepResult other = train_step(threads, bf16_matmul);
    ASSERT_EQ(std::memcmp(one.loss.data(), other.loss.data(), sizeof(float)), 0) << "threads " << threads;
    ASSERT_EQ(one.grads.size(), other.grads.size());
    for (size_t i = 0; i < one.grads.size(); ++i) {
      ASSERT_EQ(one.grads[i].size(), other.grads[i].size());
      EXPECT_EQ(std::memcmp(one.grads[i].data(), other.grads[i].data(), one.grads[i].size() * sizeof(float)), 0)
          << "gradient " << i << " differs at " << threads << " threads";
    }
  }
}

}  // namespace

TEST(Determinism, BitIdenticalAcrossThreadCounts) { expect_bit_identical_across_threads(false); }

// The bf16 matmul option: still bit-identical at any thread count.
TEST(Determinism, Bf16MatmulBitIdenticalAcrossThreadCounts) { expect_bit_identical_across_threads(true); }

// bf16 operands: the loss and gradients move by about bf16's precision
// (2^-8 relative per operand), no more, and do move (the option is in effect).
TEST(Bf16Matmul, CloseToF32) {
  StepResult f32 = train_step(2), bf16 = train_step(2, true);
  EXPECT_NE(f32.loss[0], bf16.loss[0]);
  EXPECT_NEAR(bf16.loss[0], f32.loss[0], 2e-2 * std::fabs(f32.loss[0]));
  for (size_t i = 0; i < f32.grads.size(); ++i) {
    double diff = 0, norm = 0;
    for (size_t k = 0; k < f32.grads[i].size(); ++k) {
      diff += std::pow(double(bf16.grads[i][k]) - f32.grads[i][k], 2);
      norm += std::pow(double(f32.grads[i][k]), 2);
    }
    EXPECT_GT(diff, 0) << "gradient " << i;
    EXPECT_LT(std::sqrt(diff), 2e-2 * std::sqrt(norm)) << "gradient " << i;
  }
}
