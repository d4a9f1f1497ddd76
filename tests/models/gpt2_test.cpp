// GPT-2: the key/value-cache decoding step gives the same logits as the
// full forward pass, position by position; config round trip.
#include <gtest/gtest.h>

#include <cmath>

#include "nabla/models/gpt2.h"
#include "nabla/nabla.hpp"

#include "models/decoding_check.h"

using namespace nabla;

TEST(Gpt2, CachedDecodingMatchesTheFullForward) {
  models::Gpt2Config c;
  c.vocab_size = 11;
  c.n_positions = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.tokenizer = "byte";
  models::Gpt2 model(c, 3);
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2};
  const int64_t T = int64_t(ids.size());
  Tensor tokens = Tensor::from_vector<int32_t>({1, T}, ids);
  std::vector<float> full = eval(model.forward(tokens, false)).to_vector<float>();  // [1, T, V]

  expect_decoding_matches(model.decode_step(T), ids, full, c.vocab_size);
}

TEST(Gpt2, ConfigRoundTripsAndRejectsOtherArchitectures) {
  models::Gpt2Config c = models::gpt2_preset("gpt2-small-byte");
  models::Gpt2Config back = models::Gpt2Config::from_json(c.to_json());
  EXPECT_EQ(back.n_embd, 384);
  EXPECT_EQ(back.vocab_size, 256);
  EXPECT_EQ(back.tokenizer, "byte");
  EXPECT_THROW(models::Gpt2Config::from_json(R"({"architecture": "vit"})"), IoError);
  EXPECT_THROW(models::gpt2_preset("gpt5"), UsageError);
}

TEST(Gpt2, ParameterNamesFollowHuggingFace) {
  models::Gpt2 model(models::gpt2_preset("gpt2"), 1);
  const nn::Params& p = model.params();
  EXPECT_EQ(p.get("wte.weight").shape(), (Shape{50257, 768}));
  EXPECT_EQ(p.get("wpe.weight").shape(), (Shape{1024, 768}));
  EXPECT_EQ(p.get("h.0.attn.c_attn.weight").shape(), (Shape{768, 2304}));
  EXPECT_EQ(p.get("h.11.mlp.c_proj.weight").shape(), (Shape{3072, 768}));
  EXPECT_EQ(p.get("ln_f.bias").shape(), (Shape{768}));
  EXPECT_NEAR(double(p.count()), 124.44e6, 0.01e6);  // GPT-2 small's 124M
}
