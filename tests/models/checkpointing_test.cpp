// Gradient checkpointing in GPT-2 and ViT (Llama's is in lora_test.cpp): the
// same loss and gradients with blocks (and GPT-2's logits, in chunks)
// recomputed in the backward, dropout's masks drawn alike both times, in a
// smaller arena.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "nabla/models/gpt2.h"
#include "nabla/models/vit.h"
#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

struct Measured {
  std::vector<std::vector<float>> values;  // loss, then each parameter's gradient
  size_t arena = 0;
};

Measured run(const Tensor& loss, const nn::Params& params) {
  Graph g;
  g.backward(loss);
  Executor ex(g, {.threads = 2});
  ex.run();
  Measured r;
  r.arena = ex.memory().arena_bytes;
  r.values.push_back(ex.read<float>(loss));
  for (const auto& [_, p] : params.list()) r.values.push_back(ex.read<float>(g.grad(p)));
  return r;
}

void expect_same(const Measured& kept, const Measured& recomputed, const nn::Params& params) {
  EXPECT_NEAR(recomputed.values[0][0], kept.values[0][0], 1e-6 * std::abs(kept.values[0][0]));
  for (size_t i = 1; i < kept.values.size(); ++i) {
    float scale = 0, diff = 0;
    for (size_t k = 0; k < kept.values[i].size(); ++k) {
      scale = std::max(scale, std::abs(kept.values[i][k]));
      diff = std::max(diff, std::abs(recomputed.values[i][k] - kept.values[i][k]));
    }
    EXPECT_GT(scale, 0) << params.list()[i - 1].first;
    EXPECT_LE(diff, 1e-5 * scale) << params.list()[i - 1].first;
  }
  EXPECT_LT(recomputed.arena, kept.arena * 0.8) << "checkpointed " << recomputed.arena << " bytes, kept " << kept.arena;
}

TEST(GradientCheckpointing, Gpt2SameLossAndGradients) {
  models::Gpt2Config c;
  c.vocab_size = 40;
  c.n_positions = 32;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 32;
  c.dropout = 0.1;
  c.tokenizer = "byte";
  models::Gpt2 gpt(c, 3);
  std::vector<int32_t> ids(3 * 25);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((7 * i + i * i) % 40);
  const Tensor tokens = Tensor::from_vector<int32_t>({3, 25}, ids);
  gpt.dropout_seed.data_as<int32_t>()[0] = 5;
  Measured got[2];
  for (bool checkpoint : {false, true}) {
    gpt.set_gradient_checkpointing(checkpoint, /*chunk_logits=*/7 * c.vocab_size);  // 7-row chunks, the last short
    EXPECT_EQ(gpt.gradient_checkpointing(), checkpoint);
    got[checkpoint] = run(gpt.next_token_loss(tokens, /*train=*/true), gpt.params());
  }
  expect_same(got[0], got[1], gpt.params());
}

TEST(GradientCheckpointing, VitSameLossAndGradients) {
  models::VitConfig c = models::vit_preset("fmnist");
  c.img_size = 32;
  c.patch_size = 4;
  c.in_chans = 1;
  c.embed_dim = 32;
  c.depth = 4;
  c.num_heads = 2;
  c.num_classes = 10;
  c.drop_rate = 0.1;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  std::vector<float> pixels(4 * 32 * 32);
  for (float& p : pixels) p = normal(gen);
  const Tensor images = Tensor::from_vector<float>({4, 1, 32, 32}, pixels);
  const Tensor labels = Tensor::from_vector<int32_t>({4}, {4, 0, 9, 2});
  for (const char* pool : {"token", "avg"}) {
    SCOPED_TRACE(pool);
    c.global_pool = pool;
    models::Vit vit(c, 5);
    vit.dropout_seed.data_as<int32_t>()[0] = 77;
    Measured got[2];
    for (bool checkpoint : {false, true}) {
      vit.set_gradient_checkpointing(checkpoint);
      got[checkpoint] = run(cross_entropy(vit.forward(images, /*train=*/true), labels), vit.params());
    }
    expect_same(got[0], got[1], vit.params());
  }
}

}  // namespace
