// DoRA (PEFT's use_dora) on nn::Linear and the Llama family: the layer starts
// as the base, computes m * (W + s B A) / ||W + s B A|| (what merging folds
// in), PEFT's dropout form while training, the same on a quantized base,
// and its PEFT folder round-trips. Its gradients against PEFT's formula are
// tests/oracle/lora_oracle.py's.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nabla/gguf.h"
#include "nabla/models/gguf.h"
#include "nabla/models/llama.h"
#include "nabla/models/lora.h"
#include "nabla/nabla.hpp"

#include "models/small_llama.h"
#include "temp_dir.h"

using namespace nabla;

namespace {

// A layer [out 5, in 7] with a bias and a DoRA adapter of rank 3 whose B and
// magnitude are random (A is drawn by add_lora).
struct Layer {
  nn::Params params, adapters;
  nn::Linear linear;
  Tensor seed = Tensor::zeros(DType::i32, {1});
  explicit Layer(double dropout = 0) {
    nn::Init init(4);
    linear = nn::Linear(params, "model.layers.0.mlp.up_proj", 7, 5, true, init, 0.3);
    nn::add_lora({&linear}, {.r = 3, .alpha = 6, .dropout = dropout, .dora = true, .targets = {"up_proj"}}, adapters,
                 init, seed);
  }
  void randomize() {
    nn::Init init(9);
    for (const Tensor* t : {&linear.lora.b, &linear.lora.magnitude}) {
      const std::vector<float> v = init.normal(t->shape(), 0.4).to_vector<float>();
      std::vector<float> cur = t->to_vector<float>();
      for (size_t i = 0; i < v.size(); ++i) cur[i] = t == &linear.lora.b ? v[i] : cur[i] * (1 + v[i]);
      Tensor(*t).copy_from(cur.data(), cur.size() * sizeof(float));
    }
  }
};

std::vector<float> values(const Tensor& t) { return eval(t).to_vector<float>(); }

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " " << i;
}

TEST(Dora, StartsAsTheBaseWithTheWeightsRowNorms) {
  Layer l;
  const nn::Linear& d = l.linear;
  EXPECT_EQ(l.adapters.get("base_model.model.model.layers.0.mlp.up_proj.lora_magnitude_vector").shape(), Shape({5}));
  const std::vector<float> w = d.weight.to_vector<float>(), m = d.lora.magnitude.to_vector<float>();
  for (int64_t o = 0; o < 5; ++o) {
    double n2 = 0;
    for (int64_t i = 0; i < 7; ++i) n2 += double(w[size_t(o * 7 + i)]) * w[size_t(o * 7 + i)];
    EXPECT_NEAR(m[size_t(o)], std::sqrt(n2), 1e-6) << o;
  }
  const Tensor x = nn::Init(2).normal({2, 4, 7}, 1.0);
  nn::Linear plain = d;
  plain.lora = {};
  expect_close(values(d(x)), values(plain(x)), 1e-6, "DoRA at the start");
}

// The layer's output is x W'^T + b with W' = m * (W + s B A) / ||row||,
// which merge_adapter folds into the weight.
TEST(Dora, ComputesTheMagnitudeTimesTheNormalizedWeightAsMerged) {
  Layer l;
  l.randomize();
  const Tensor x = nn::Init(2).normal({2, 4, 7}, 1.0);
  const std::vector<float> adapted = values(l.linear(x));
  nn::Linear merged = l.linear;
  merged.weight = Tensor::from_vector<float>(l.linear.weight.shape(), l.linear.weight.to_vector<float>());
  merged.merge_adapter();
  EXPECT_FALSE(merged.lora.defined());
  expect_close(adapted, values(merged(x)), 2e-6, "merged");
  nn::Linear plain = l.linear;
  plain.lora = {};
  const std::vector<float> base = values(plain(x));
  double moved = 0;
  for (size_t i = 0; i < base.size(); ++i) moved = std::max(moved, double(std::abs(base[i] - adapted[i])));
  EXPECT_GT(moved, 0.1) << "the adapter changes nothing";
}

// With dropout while training, PEFT's form: x W^T + b + (m/n - 1) x_d W^T
// + (m/n) s x_d A^T B^T, x_d the dropped-out input (the same mask here).
TEST(Dora, TrainsWithDropoutAsPeftComputes) {
  Layer l(0.3);
  l.randomize();
  const nn::Linear& d = l.linear;
  const Tensor x = nn::Init(2).normal({2, 4, 7}, 1.0);
  const Tensor xd = dropout(x, 0.3, l.seed, true, d.lora.salt);
  const Tensor w = transpose(d.weight);
  const Tensor m = d.lora.magnitude / d.dora_norm();
  const Tensor want = matmul(x, w) + d.bias + (m - scalar_like(1.0, m)) * matmul(xd, w) +
                      m * scale(matmul(matmul(xd, transpose(d.lora.a)), transpose(d.lora.b)), d.lora.scale);
  expect_close(values(d(x, true)), values(want), 1e-5, "training with dropout");
  // Not training: no dropout, the merged form.
  expect_close(values(d(x, false)),
               values(m * (matmul(scale(matmul(x, transpose(d.lora.a)), d.lora.scale), transpose(d.lora.b)) +
                           matmul(x, w)) + d.bias),
               1e-5, "inference");
}

// The norm is a constant to the backward: the magnitude, A and B get
// gradients; the weight's norm passes none to them.
TEST(Dora, TheNormTakesNoGradient) {
  Layer l;
  l.randomize();
  const nn::Linear& d = l.linear;
  const Tensor x = nn::Init(2).normal({3, 7}, 1.0);
  const Tensor loss = sum(square(d(x)));
  const auto g = grad(loss, {d.lora.a, d.lora.b, d.lora.magnitude});
  // With n held fixed, y = (m/n) (x W^T + s x A^T B^T) + b: its gradient in
  // closed form for B: s (x A^T)^T ((m/n) dL/dy), dL/dy = 2 y.
  const Tensor y = d(x);
  const Tensor mn = d.lora.magnitude / d.dora_norm();
  const Tensor dy = scale(y, 2.0) * mn;
  const Tensor want_b = scale(matmul(transpose(dy), matmul(x, transpose(d.lora.a))), d.lora.scale);
  expect_close(values(g[1]), values(want_b), 1e-5, "dL/dB");
  EXPECT_EQ(g[2].shape(), Shape({5}));
}

// On a base kept quantized (QLoRA), the norms come from the dequantized rows:
// the same output as on those rows in f32.
TEST(Dora, OnAQuantizedBaseAsOnItsDequantizedWeight) {
  models::LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  testing_support::TempDir dir;
  models::Llama f32(c, 5);
  save_checkpoint(dir.file("m.safetensors"), c.to_json(), f32.params());
  Checkpoint ckpt = models::load_any_checkpoint(dir.file("m.safetensors"));
  models::GgufExportOptions q8{.matrix_type = GgmlType::q8_0, .tokenizer = "byte"};
  models::gguf_from_checkpoint(ckpt, q8).write(dir.file("m.gguf"));
  models::Llama kept(models::load_any_checkpoint(dir.file("m.gguf"), /*keep_stored=*/true));
  models::Llama dequantized(models::load_any_checkpoint(dir.file("m.gguf")));
  const nn::LoraConfig dora{.r = 4, .alpha = 8, .dora = true};
  kept.add_lora(dora, 3);
  dequantized.add_lora(dora, 3);
  for (const auto& [name, t] : kept.adapter().list()) {
    EXPECT_NEAR(std::abs(t.to_vector<float>()[0]), std::abs(dequantized.adapter().get(name).to_vector<float>()[0]),
                1e-5)
        << name;
  }
  const Tensor ids = Tensor::from_vector<int32_t>({1, 6}, {1, 5, 9, 2, 6, 5});
  expect_close(values(kept.forward(ids)), values(dequantized.forward(ids)), 2e-4, "Q8_0 kept vs dequantized");
}

TEST(Dora, PeftFolderRoundTripsAndLlamaCppAdaptersRefuseIt) {
  testing_support::TempDir dir;
  const models::LlamaConfig c = testing_models::small_llama();
  models::Llama m(c, 3);
  m.add_lora({.r = 2, .alpha = 4, .dora = true, .targets = {"q_proj", "down_proj"}}, 2);
  nn::Init init(8);
  for (auto& [name, t] : m.adapter().list()) {
    std::vector<float> v = t.to_vector<float>();
    const std::vector<float> r = init.normal(t.shape(), 0.2).to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) v[i] += r[i];
    Tensor(t).copy_from(v.data(), v.size() * sizeof(float));
  }
  models::save_peft_adapter(dir.path(), m.lora(), m.adapter(), "");
  EXPECT_NE(read_file(dir.file("adapter_config.json")).find("\"use_dora\": true"), std::string::npos);
  models::Llama other(c, 3);
  const models::PeftAdapter back = models::attach_peft_adapter(other, dir.path());
  EXPECT_TRUE(back.config.dora);
  const Tensor ids = Tensor::from_vector<int32_t>({1, 5}, {3, 1, 4, 1, 5});
  EXPECT_EQ(values(other.forward(ids)), values(m.forward(ids)));
  bool magnitude = false;
  for (const auto& [name, t] : back.weights.tensors) {
    magnitude = magnitude || name == "base_model.model.model.layers.1.mlp.down_proj.lora_magnitude_vector";
  }
  EXPECT_TRUE(magnitude);
  try {
    models::gguf_lora_adapter(c, back);
    ADD_FAILURE() << "a DoRA adapter written as llama.cpp's";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("merge it into the model instead"), std::string::npos) << e.what();
  }
  // Merged into the model, the same outputs.
  models::Llama merged(c, 3);
  models::attach_peft_adapter(merged, dir.path());
  merged.merge_lora();
  expect_close(values(merged.forward(ids)), values(m.forward(ids)), 1e-5, "merged model");
  // A DoRA config whose weights lack the magnitudes is refused.
  nn::LoraConfig plain = back.config;
  plain.dora = false;
  models::Llama lora_only(c, 3);
  lora_only.add_lora(plain, 1);
  models::save_peft_adapter(dir.file("plain"), plain, lora_only.adapter(), "");
  std::string config = read_file(dir.file("plain/adapter_config.json"));
  config.replace(config.find("\"use_dora\": false"), 17, "\"use_dora\": true");
  write_file_atomic(dir.file("plain/adapter_config.json"), config);
  models::Llama wants_dora(c, 3);
  EXPECT_THROW(models::attach_peft_adapter(wants_dora, dir.file("plain")), IoError);
}

}  // namespace
