// A ViT's and a GPT-2's training step (loss and every parameter gradient) on
// the reference backend against the CPU's: the CPU's fused kernels and
// rewrite against plain kernels, through whole models.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "nabla/models/gpt2.h"
#include "nabla/models/vit.h"
#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

// f32 through a few dozen ops, summed in other orders: the gradients agree
// within kTolerance of each tensor's largest value.
constexpr double kTolerance = 2e-4;

void expect_same_step(const Tensor& loss, const nn::Params& params) {
  std::vector<Tensor> wrt;
  for (const auto& [name, p] : params.list()) wrt.push_back(p);
  std::vector<Tensor> outputs{loss};
  for (const Tensor& g : grad(loss, wrt)) outputs.push_back(g);
  const std::vector<Tensor> cpu = eval(outputs, {.threads = 2});
  const std::vector<Tensor> reference = eval(outputs, {.backend = "reference"});
  EXPECT_NEAR(reference[0].item(), cpu[0].item(), kTolerance * std::abs(cpu[0].item()));
  for (size_t i = 1; i < outputs.size(); ++i) {
    const std::vector<float> a = cpu[i].to_vector<float>(), b = reference[i].to_vector<float>();
    double scale = 0, worst = 0;
    for (float x : a) scale = std::max(scale, double(std::abs(x)));
    for (size_t j = 0; j < a.size(); ++j) worst = std::max(worst, double(std::abs(a[j] - b[j])));
    EXPECT_LE(worst, kTolerance * scale) << params.list()[i - 1].first << ": largest gradient " << scale;
  }
}

Tensor random_leaf(Shape shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(size_t(numel(shape)));
  for (float& x : v) x = n(rng);
  return Tensor::from_vector<float>(std::move(shape), v);
}

}  // namespace

TEST(BackendModels, VitStepAgrees) {
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
  expect_same_step(cross_entropy(vit.forward(images, /*train=*/true), labels), vit.params());
}

TEST(BackendModels, Gpt2StepAgrees) {
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
  expect_same_step(gpt.next_token_loss(tokens, /*train=*/true), gpt.params());
}
