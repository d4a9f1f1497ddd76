// A ViT's, a GPT-2's and a Llama's training step (loss and every parameter
// gradient; the Llama's also with LoRA adapters on a frozen base) on
// each backend with memory of its own (tests/backends.h) against the CPU's:
// the CPU's fused kernels and rewrite against other kernels, through whole
// models; then whole training steps (TrainStep: forward, backward, norm,
// clip, AdamW as one graph).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/models/vit.h"
#include "nabla/nabla.hpp"
#include "nabla/trainer.h"
#include "backends.h"
#include "small_llama.h"

using namespace nabla;

namespace {

// f32 through a few dozen ops, summed in other orders: the gradients agree
// within kTolerance of each tensor's largest value.
constexpr double kTolerance = 2e-4;

void expect_same_step(const Tensor& loss, const nn::Params& params, const std::string& backend) {
  std::vector<Tensor> wrt;
  for (const auto& [name, p] : params.list()) wrt.push_back(p);
  std::vector<Tensor> outputs{loss};
  for (const Tensor& g : grad(loss, wrt)) outputs.push_back(g);
  const std::vector<Tensor> cpu = eval(outputs, {.threads = 2});
  const std::vector<Tensor> reference = eval(outputs, {.backend = backend});
  EXPECT_NEAR(reference[0].item(), cpu[0].item(), kTolerance * std::abs(cpu[0].item()));
  for (size_t i = 1; i < outputs.size(); ++i) {
    const std::vector<float> a = cpu[i].to_vector<float>(), b = reference[i].to_vector<float>();
    double scale = 0, worst = 0;
    for (float x : a) scale = std::max(scale, double(std::abs(x)));
    for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, double(std::abs(a[j] - b[j])));
    EXPECT_LE(worst, kTolerance * scale) << params.list()[i - 1].first << ": largest gradient " << scale;
  }
}

// Three TrainStep steps (run, update with clipping) on `backend` from the
// parameters' current values, which are restored afterwards: each step's
// loss and norm, then every parameter's values.
struct Trained {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> params;
};
Trained train_steps(const Tensor& loss, const nn::Params& params, const optim::AdamWConfig& config, double lr,
                    const std::string& backend) {
  std::vector<std::vector<float>> initial;
  for (const auto& [name, p] : params.list()) initial.push_back(p.to_vector<float>());
  TrainStep step(loss, params, {}, config, ExecOptions{.threads = 2, .backend = backend});
  Trained out;
  for (double clip : {0.0, 1e-3, 0.0}) {
    step.run();
    out.losses.push_back(step.loss());
    out.norms.push_back(step.update(lr, clip));
  }
  for (size_t i = 0; i < initial.size(); ++i) {
    Tensor p = params.list()[i].second;
    out.params.push_back(p.to_vector<float>());
    p.assign<float>(initial[i]);
  }
  return out;
}

// AdamW's update is about lr * m / sqrt(v): where a gradient is near zero
// against eps, a rounding difference in it can flip the step's sign (with
// eps 1e-8 the parameters here differ by up to 1.3% of lr). With eps 1e-2
// the update moves by at most lr / eps per unit change of the gradient, and
// the parameters agree to about 1e-5 of lr (2026-12-05); 1e-3 of lr leaves a
// wide margin, while a wrong update (bias correction, decay, the clip's
// scale) is off by a sizeable fraction of lr.
void expect_same_training(const Tensor& loss, const nn::Params& params, const std::string& backend) {
  const optim::AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-2, .weight_decay = 0.1};
  constexpr double kLr = 1e-2;
  const Trained cpu = train_steps(loss, params, config, kLr, "cpu");
  const Trained reference = train_steps(loss, params, config, kLr, backend);
  // Identical run to run (no float atomics, no order left to the device).
  const Trained again = train_steps(loss, params, config, kLr, backend);
  EXPECT_EQ(again.losses, reference.losses);
  EXPECT_EQ(again.norms, reference.norms);
  EXPECT_EQ(again.params, reference.params);
  for (size_t s = 0; s < cpu.losses.size(); ++s) {
    EXPECT_NEAR(reference.losses[s], cpu.losses[s], kTolerance * cpu.losses[s]) << "step " << s;
    EXPECT_NEAR(reference.norms[s], cpu.norms[s], kTolerance * cpu.norms[s]) << "step " << s;
  }
  ASSERT_GT(cpu.norms[1], 1e-3);  // the second step is clipped
  double moved = 0, worst = 0;
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    const std::vector<float> before = params.list()[i].second.to_vector<float>();
    double off = 0;
    for (size_t j = 0; j < before.size(); ++j) {
      moved = std::max(moved, double(std::abs(cpu.params[i][j] - before[j])));
      off = std::max(off, double(std::abs(reference.params[i][j] - cpu.params[i][j])));
    }
    EXPECT_LE(off, 1e-3 * kLr) << params.list()[i].first;
    worst = std::max(worst, off);
  }
  EXPECT_GT(moved, kLr);  // the steps did move the parameters
  std::printf("largest difference %.3g of lr; parameters moved up to %.3g of lr\n", worst / kLr, moved / kLr);
}

Tensor random_leaf(Shape shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(size_t(numel(shape)));
  for (float& x : v) x = n(rng);
  return Tensor::from_vector<float>(std::move(shape), v);
}

class BackendModels : public testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(BackendModels, VitStepAgrees) {
  // 65 tokens: attention keeps its probabilities (attention_probs), with
  // dropout drawn alike on both backends.
  models::VitConfig c = models::vit_preset("fmnist");
  c.img_size = 32;
  c.patch_size = 4;
  c.in_chans = 1;
  c.embed_dim = 32;
  c.depth = 2;
  c.num_heads = 2;
  c.num_classes = 10;
  c.global_pool = "token";
  c.drop_rate = 0.1;
  models::Vit vit(c, 5);
  const Tensor images = random_leaf({3, 1, 32, 32}, 1);
  const Tensor labels = Tensor::from_vector<int32_t>({3}, {4, 0, 9});
  vit.dropout_seed.data_as<int32_t>()[0] = 77;
  const Tensor loss = cross_entropy(vit.forward(images, /*train=*/true), labels);
  expect_same_step(loss, vit.params(), GetParam());
  expect_same_training(loss, vit.params(), GetParam());
}

TEST_P(BackendModels, Gpt2StepAgrees) {
  models::Gpt2Config c;
  c.vocab_size = 40;
  c.n_positions = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = 0.1;
  c.tokenizer = "byte";
  models::Gpt2 gpt(c, 3);
  std::vector<int32_t> ids(2 * 13);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((7 * i + 3) % 40);
  const Tensor tokens = Tensor::from_vector<int32_t>({2, 13}, ids);
  gpt.dropout_seed.data_as<int32_t>()[0] = 5;
  const Tensor loss = gpt.next_token_loss(tokens, /*train=*/true);
  expect_same_step(loss, gpt.params(), GetParam());
  expect_same_training(loss, gpt.params(), GetParam());
}

// The small Llama (tests/models/small_llama.h): GQA, rope, RMS norm,
// SwiGLU, biases, an untied head: every parameter trained, then LoRA
// adapters (with dropout) on a frozen base.
using testing_models::small_llama;

Tensor llama_tokens() {
  std::vector<int32_t> ids(2 * 13);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((7 * i + i * i) % 37);
  return Tensor::from_vector<int32_t>({2, 13}, ids);
}

TEST_P(BackendModels, LlamaStepAgrees) {
  models::Llama llama(small_llama(), 3);
  const Tensor loss = llama.next_token_loss(llama_tokens(), /*train=*/true);
  expect_same_step(loss, llama.params(), GetParam());
  expect_same_training(loss, llama.params(), GetParam());
}

TEST_P(BackendModels, LlamaLoraStepAgrees) {
  models::Llama llama(small_llama(), 3);
  llama.add_lora({.r = 4, .alpha = 8, .dropout = 0.1}, 5);
  // B starts at zero (PEFT's init): give it values, so A's gradients are not all zero.
  int k = 0;
  for (const auto& [name, p] : llama.adapter().list()) {
    Tensor t = p;
    std::vector<float> v(size_t(t.numel()));
    for (float& x : v) x = 0.05f * float((k++ % 7) - 3);
    t.assign<float>(v);
  }
  const Tensor loss = llama.next_token_loss(llama_tokens(), /*train=*/true);
  expect_same_step(loss, llama.adapter(), GetParam());
  expect_same_training(loss, llama.adapter(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendModels, testing::ValuesIn(testing_backends::device_backends()),
                         [](const auto& info) { return testing_backends::test_name(info.param); });
