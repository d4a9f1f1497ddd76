// The Llama family's model: Hugging Face's names and shapes, its config.json
// keys, grouped-query attention equal to attention over repeated key/value
// heads, and training through the shared step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>

#include "nabla/checkpoint.h"
#include "nabla/models/gguf.h"
#include "nabla/models/llama.h"
#include "nabla/nabla.hpp"
#include "nabla/tokenizer.h"
#include "nabla/trainer.h"

#include "models/decoding_check.h"
#include "temp_dir.h"
#include "small_llama.h"

using namespace nabla;
using models::Llama;
using models::LlamaConfig;

namespace {

LlamaConfig small_config() { return testing_models::small_llama(); }

// Gains other than the initial ones, so that a norm read, written or applied
// in the wrong place shows.
void vary_norms(const Llama& m) {
  for (const auto& [name, t] : m.params().list()) {
    if (name.find("norm") == std::string::npos) continue;
    std::vector<float> w(size_t(t.numel()));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.6f + 0.1f * float((i * 7 + name.size()) % 9);
    Tensor(t).assign(w);  // a handle to the same leaf
  }
}

Tensor tokens(int64_t B, int64_t T, int64_t vocab, int64_t seed) {
  std::vector<int32_t> ids(size_t(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((7 * i + 3 * seed + i * i) % vocab);
  return Tensor::from_vector<int32_t>({B, T}, ids);
}

}  // namespace

TEST(Llama, HasHuggingFacesNamesAndShapes) {
  const LlamaConfig c = small_config();
  Llama m(c, 1);
  EXPECT_EQ(m.params().count(), c.parameter_count());
  const auto& p = m.params();
  EXPECT_EQ(p.get("model.embed_tokens.weight").shape(), (Shape{37, 24}));
  EXPECT_EQ(p.get("model.layers.1.self_attn.q_proj.weight").shape(), (Shape{36, 24}));
  EXPECT_EQ(p.get("model.layers.1.self_attn.q_proj.bias").shape(), (Shape{36}));
  EXPECT_EQ(p.get("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{12, 24}));
  EXPECT_EQ(p.get("model.layers.1.self_attn.v_proj.bias").shape(), (Shape{12}));
  EXPECT_EQ(p.get("model.layers.1.self_attn.o_proj.weight").shape(), (Shape{24, 36}));
  EXPECT_EQ(p.get("model.layers.0.mlp.gate_proj.weight").shape(), (Shape{40, 24}));
  EXPECT_EQ(p.get("model.layers.0.mlp.up_proj.weight").shape(), (Shape{40, 24}));
  EXPECT_EQ(p.get("model.layers.0.mlp.down_proj.weight").shape(), (Shape{24, 40}));
  EXPECT_EQ(p.get("model.layers.0.input_layernorm.weight").shape(), (Shape{24}));
  EXPECT_EQ(p.get("model.layers.0.post_attention_layernorm.weight").shape(), (Shape{24}));
  EXPECT_EQ(p.get("model.norm.weight").shape(), (Shape{24}));
  EXPECT_EQ(p.get("lm_head.weight").shape(), (Shape{37, 24}));
  EXPECT_THROW(p.get("model.layers.0.self_attn.o_proj.bias"), UsageError);
  EXPECT_EQ(p.list().size(), 1 + 2 * 12 + 1 + 1u);  // 12 a layer: 2 norms, 4 + 3 weights, 3 biases

  LlamaConfig tied = c;
  tied.tie_word_embeddings = true;
  tied.attention_bias = false;
  Llama t(tied, 1);
  EXPECT_EQ(t.params().count(), tied.parameter_count());
  EXPECT_THROW(t.params().get("lm_head.weight"), UsageError);
  // SmolLM2-135M's shape, counted without building it.
  EXPECT_EQ(models::llama_preset("smollm2-135m").parameter_count(), 134515008);

  // Qwen3: each query and key head RMS-normed, no biases, a head size of its own.
  LlamaConfig qwen3 = tied;
  qwen3.model_type = "qwen3";
  qwen3.head_dim = 8;
  Llama q3(qwen3, 1);
  EXPECT_EQ(q3.params().count(), qwen3.parameter_count());
  EXPECT_EQ(q3.params().get("model.layers.1.self_attn.q_proj.weight").shape(), (Shape{48, 24}));
  EXPECT_EQ(q3.params().get("model.layers.1.self_attn.q_norm.weight").shape(), (Shape{8}));
  EXPECT_EQ(q3.params().get("model.layers.1.self_attn.k_norm.weight").shape(), (Shape{8}));
  EXPECT_THROW(t.params().get("model.layers.1.self_attn.q_norm.weight"), UsageError);
}

TEST(Llama, ReadsConfigJsonKeys) {
  // As Hugging Face writes them: unused keys, a null head_dim, Qwen2's
  // implicit q/k/v biases.
  const std::string hf = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": null, "rms_norm_eps": 1e-05, "rope_theta": 100000,
    "max_position_embeddings": 8192, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "bos_token_id": 0})";
  const LlamaConfig c = LlamaConfig::from_json(hf);
  EXPECT_EQ(c.kv_heads(), 3);
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.parameter_count(), models::llama_preset("smollm2-135m").parameter_count());
  const LlamaConfig back = LlamaConfig::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_NE(c.to_json().find("\"architectures\":[\"LlamaForCausalLM\"]"), std::string::npos) << c.to_json();

  const std::string qwen = R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2})";
  EXPECT_TRUE(LlamaConfig::from_json(qwen).attention_bias);
  // Qwen3-0.6B's config.json, abridged: attention_bias as given, q/k norms.
  const LlamaConfig q3 = LlamaConfig::from_json(R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
  EXPECT_TRUE(q3.qk_norm());
  EXPECT_FALSE(q3.attention_bias);
  EXPECT_EQ(q3.head_size(), 128);
  // embedding + 28 x (2 norms; q and o 2048 x 1024, k and v 1024 x 1024; 3 MLP matrices; q/k norms) + norm:
  // 0.6B, 0.44B of them outside the embedding, as Qwen3-0.6B's model card gives.
  EXPECT_EQ(q3.parameter_count(),
            151936 * 1024 + 28 * (2 * 1024 + 2 * 2048 * 1024 + 2 * 1024 * 1024 + 3 * 1024 * 3072 + 2 * 128) + 1024);
  EXPECT_EQ(q3.parameter_count(), 596049920);
  EXPECT_NE(q3.to_json().find("\"architectures\":[\"Qwen3ForCausalLM\"]"), std::string::npos) << q3.to_json();
  EXPECT_EQ(LlamaConfig::from_json(q3.to_json()).to_json(), q3.to_json());
  EXPECT_FALSE(LlamaConfig::from_json(qwen).qk_norm());
  // Mistral-7B-v0.1's config.json: a 4096-token sliding window; 7,241,732,096
  // parameters.
  const std::string mistral = R"({"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32000})";
  const LlamaConfig m7 = LlamaConfig::from_json(mistral);
  EXPECT_EQ(m7.sliding_window, 4096);
  EXPECT_EQ(m7.parameter_count(), 7241732096);
  EXPECT_NE(m7.to_json().find("\"architectures\":[\"MistralForCausalLM\"]"), std::string::npos) << m7.to_json();
  EXPECT_NE(m7.to_json().find("\"sliding_window\":4096"), std::string::npos) << m7.to_json();
  EXPECT_EQ(LlamaConfig::from_json(m7.to_json()).to_json(), m7.to_json());
  // v0.3's window is null: every earlier token.
  const std::string window_key = "\"sliding_window\": 4096";
  auto with_window = [&](const std::string& value) {
    std::string j = mistral;
    return j.replace(j.find(window_key), window_key.size(), "\"sliding_window\": " + value);
  };
  const std::string v3 = with_window("null");
  EXPECT_EQ(LlamaConfig::from_json(v3).sliding_window, 0);
  EXPECT_NE(LlamaConfig::from_json(v3).to_json().find("\"sliding_window\":null"), std::string::npos);
  EXPECT_THROW(LlamaConfig::from_json(with_window("\"4k\"")), IoError);
  EXPECT_THROW(LlamaConfig::from_json(with_window("0")), IoError);
  // Qwen's sliding_window is off unless use_sliding_window.
  const std::string qwen_window = R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "sliding_window": 64, "use_sliding_window": false})";
  EXPECT_EQ(LlamaConfig::from_json(qwen_window).sliding_window, 0);
  EXPECT_THROW(LlamaConfig::from_json(R"({"model_type": "llama", "vocab_size": 100})"), IoError);
  EXPECT_THROW(LlamaConfig::from_json(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 30,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4})"), UsageError);  // 30 / 4
  EXPECT_THROW(LlamaConfig::from_json(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 3})"),
               UsageError);
}

// The key/value-cache step (grouped query heads, rotary positions with Llama
// 3's scaling, q/k/v biases) gives the full forward pass's logits.
TEST(Llama, CachedDecodingMatchesTheFullForward) {
  LlamaConfig c = small_config();
  c.rope_scaling = {.type = "llama3", .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                    .original_max_position_embeddings = 4};
  Llama m(c, 7);
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5};
  const int64_t T = int64_t(ids.size());
  const std::vector<float> full = eval(m.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  expect_decoding_matches(m.decode_step(T), ids, full, c.vocab_size);

  // Qwen3's q/k head norms, applied before the rotation on both paths.
  LlamaConfig q3 = small_config();
  q3.model_type = "qwen3";
  q3.attention_bias = false;
  q3.head_dim = 8;
  Llama n(q3, 8);
  vary_norms(n);
  const std::vector<float> q3_full = eval(n.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  expect_decoding_matches(n.decode_step(T), ids, q3_full, q3.vocab_size);
}

// Mistral's sliding window: with one layer, a token's output depends on its
// last `window` tokens alone, at any position (rotary scores depend on
// distances only); cached decoding closes the positions before the window
// as the fused attention skips them.
TEST(Llama, MistralAttendsWithinItsWindow) {
  LlamaConfig c = small_config();
  c.attention_bias = false;
  c.model_type = "mistral";
  c.sliding_window = 4;
  c.num_hidden_layers = 1;
  Llama one_layer(c, 3);
  vary_norms(one_layer);
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  const int64_t T = int64_t(ids.size()), V = c.vocab_size, W = c.sliding_window;
  const std::vector<float> full = eval(one_layer.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  const std::vector<int32_t> last(ids.end() - W, ids.end());
  const std::vector<float> tail = eval(one_layer.forward(Tensor::from_vector<int32_t>({1, W}, last))).to_vector<float>();
  for (int64_t v = 0; v < V; ++v) {
    EXPECT_NEAR(full[size_t((T - 1) * V + v)], tail[size_t((W - 1) * V + v)], 2e-5) << "logit " << v;
  }
  // Not Llama's: with every earlier token the last logits differ.
  LlamaConfig unwindowed = c;
  unwindowed.sliding_window = 0;
  Llama llama(unwindowed, 3);
  vary_norms(llama);
  const std::vector<float> all = eval(llama.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  EXPECT_GT(std::abs(all[size_t((T - 1) * V)] - full[size_t((T - 1) * V)]), 1e-4);
  // Rows within the window are Llama's.
  EXPECT_EQ(std::vector<float>(full.begin(), full.begin() + W * V), std::vector<float>(all.begin(), all.begin() + W * V));

  c.num_hidden_layers = 2;
  Llama two_layers(c, 5);
  const std::vector<float> two = eval(two_layers.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  expect_decoding_matches(two_layers.decode_step(T), ids, two, V);

  LlamaConfig windowed_llama = small_config();
  windowed_llama.sliding_window = 6;
  EXPECT_THROW(windowed_llama.validate(), UsageError);
}

// Gemma 3 1B's config.json (transformers 4.50: sliding_window_pattern, no
// layer_types): every sixth layer full, the rest windows of 512 tokens;
// 999,885,952 parameters. What nabla does not compute is refused.
TEST(Llama, Gemma3ReadsItsConfig) {
  const std::string gemma = R"({"architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null,
    "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 262144})";
  const LlamaConfig c = LlamaConfig::from_json(gemma);
  EXPECT_TRUE(c.gemma());
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.parameter_count(), 999885952);
  ASSERT_EQ(c.layer_types.size(), 26u);
  for (int64_t i = 0; i < 26; ++i) EXPECT_EQ(c.layer_window(i), (i + 1) % 6 == 0 ? 0 : 512) << "layer " << i;
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.rope_local_base_freq, 10000);
  EXPECT_NE(c.to_json().find("\"architectures\":[\"Gemma3ForCausalLM\"]"), std::string::npos) << c.to_json();
  EXPECT_NE(c.to_json().find("\"hidden_activation\":\"gelu_pytorch_tanh\""), std::string::npos) << c.to_json();
  EXPECT_EQ(LlamaConfig::from_json(c.to_json()).to_json(), c.to_json());
  auto with = [&](const std::string& key, const std::string& value) {
    std::string j = gemma;
    const size_t at = j.find("\"" + key + "\": ");
    const size_t end = j.find_first_of(",}", at);
    return j.replace(at, end - at, "\"" + key + "\": " + value);
  };
  EXPECT_THROW(LlamaConfig::from_json(with("final_logit_softcapping", "30.0")), IoError);
  EXPECT_THROW(LlamaConfig::from_json(with("attn_logit_softcapping", "50.0")), IoError);
  EXPECT_THROW(LlamaConfig::from_json(with("hidden_activation", "\"gelu\"")), IoError);
  EXPECT_THROW(LlamaConfig::from_json(with("sliding_window_pattern", "0")), IoError);
  EXPECT_THROW(LlamaConfig::from_json(with("attention_bias", "true")), UsageError);
  // transformers 4.53's layer_types, which must name every layer.
  const std::string listed = with("sliding_window_pattern", "6, \"layer_types\": [\"full_attention\"]");
  EXPECT_THROW(LlamaConfig::from_json(listed), UsageError);
  LlamaConfig llama = small_config();
  llama.layer_types = {"full_attention", "full_attention"};
  EXPECT_THROW(llama.validate(), UsageError);
}

// Gemma 2 2B's config.json: Gemma 3's block without q/k norms, the even
// layers sliding, scores capped at 50 and logits at 30; 2,614,341,888
// parameters. A small one decodes as its full forward computes (caps and
// windows on both paths); layers llama.cpp's gemma2 would not slide as it
// does have no GGUF (GgufRoundTrip has one that does).
TEST(Llama, Gemma2ReadsItsConfigAndCapsItsScores) {
  const LlamaConfig c = LlamaConfig::from_json(R"({"architectures": ["Gemma2ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
    "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
    "use_cache": true, "vocab_size": 256000})");
  EXPECT_TRUE(c.gemma());
  EXPECT_FALSE(c.gemma3());
  EXPECT_FALSE(c.qk_norm());
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.parameter_count(), 2614341888);
  EXPECT_EQ(c.attn_logit_softcapping, 50);
  EXPECT_EQ(c.final_logit_softcapping, 30);
  for (int64_t i = 0; i < 26; ++i) EXPECT_EQ(c.layer_window(i), i % 2 == 0 ? 4096 : 0) << "layer " << i;
  EXPECT_NE(c.to_json().find("\"architectures\":[\"Gemma2ForCausalLM\"]"), std::string::npos) << c.to_json();
  EXPECT_EQ(LlamaConfig::from_json(c.to_json()).to_json(), c.to_json());
  LlamaConfig gemma3 = c;
  gemma3.model_type = "gemma3_text";
  EXPECT_THROW(gemma3.validate(), UsageError);  // no caps there

  LlamaConfig small = small_config();
  small.model_type = "gemma2";
  small.attention_bias = false;
  small.tie_word_embeddings = true;
  small.sliding_window = 3;
  small.layer_types = {"sliding_attention", "full_attention"};
  small.query_pre_attn_scalar = 6;
  small.attn_logit_softcapping = 0.5;
  small.final_logit_softcapping = 2;
  small.initializer_range = 0.3;  // scores past the cap
  Llama m(small, 4);
  vary_norms(m);
  EXPECT_EQ(m.params().count(), small.parameter_count());
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const int64_t T = int64_t(ids.size());
  const std::vector<float> full = eval(m.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  for (float z : full) EXPECT_LE(std::abs(z), 2.0f);
  expect_decoding_matches(m.decode_step(T), ids, full, small.vocab_size);
  LlamaConfig uncapped = small;
  uncapped.attn_logit_softcapping = 0;
  Llama u(uncapped, 4);
  vary_norms(u);
  const std::vector<float> plain = eval(u.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  float d = 0;
  for (size_t i = 0; i < full.size(); ++i) d = std::max(d, std::abs(full[i] - plain[i]));
  EXPECT_GT(d, 1e-3);
  // Packed documents (segments) compute as they would alone, through the composed capped attention.
  const std::vector<int32_t> second(ids.begin() + 4, ids.end());
  const std::vector<float> alone =
      eval(m.forward(Tensor::from_vector<int32_t>({1, T - 4}, second))).to_vector<float>();
  const std::vector<int32_t> docs = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1};
  const std::vector<float> packed = eval(m.forward(Tensor::from_vector<int32_t>({1, T}, ids), false,
                                                   Tensor::from_vector<int32_t>({1, T}, docs)))
                                        .to_vector<float>();
  for (size_t i = 0; i < alone.size(); ++i) EXPECT_NEAR(packed[4 * size_t(small.vocab_size) + i], alone[i], 2e-5) << i;
  // llama.cpp's gemma2 slides the even layers: a model that does not has no GGUF.
  nabla::testing_support::TempDir dir;
  small.layer_types = {"full_attention", "sliding_attention"};
  save_checkpoint(dir.file("g2.safetensors"), small.to_json(), Llama(small, 1).params());
  try {
    models::gguf_from_checkpoint(load_checkpoint(dir.file("g2.safetensors")));
    ADD_FAILURE() << "a gemma2 GGUF whose layer 0 is full attention";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the even layers as sliding"), std::string::npos) << e.what();
  }
}

// Gemma 3 4B's config.json (Gemma3ForConditionalGeneration): the text model
// from text_config, Gemma3TextConfig's defaults for the rest; 3,209,008,128
// parameters outside the embedding (the Gemma 3 report's 3,209M).
TEST(Llama, Gemma3MultimodalConfigGivesItsTextModel) {
  const LlamaConfig c = LlamaConfig::from_json(R"({"architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
      "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14,
      "vision_use_head": false}})");
  EXPECT_TRUE(c.multimodal);
  EXPECT_TRUE(c.gemma());
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.kv_heads(), 4);
  EXPECT_EQ(c.head_size(), 256);
  EXPECT_EQ(c.rope_scaling.factor, 8);
  EXPECT_EQ(c.parameter_count() - c.vocab_size * c.hidden_size - c.hidden_size, 3209008128);
  for (int64_t i = 0; i < 34; ++i) EXPECT_EQ(c.layer_window(i), (i + 1) % 6 == 0 ? 0 : 1024) << "layer " << i;
}

// A small Gemma 3: Hugging Face's names (four norms a block, q/k norms),
// gains that start at 0 (scaled by 1 + weight), cached decoding past the
// sliding layer's window equal to the full forward, and no GGUF for layers
// other than llama.cpp's fixed pattern (GgufRoundTrip has one that is).
TEST(Llama, Gemma3BuildsDecodesAndRefusesOtherGgufLayers) {
  LlamaConfig c = small_config();
  c.model_type = "gemma3_text";
  c.attention_bias = false;
  c.tie_word_embeddings = true;
  c.head_dim = 8;
  c.sliding_window = 3;
  c.layer_types = {"sliding_attention", "full_attention"};
  c.query_pre_attn_scalar = 10;
  c.rope_theta = 1e4;
  c.rope_local_base_freq = 100;
  Llama m(c, 4);
  EXPECT_EQ(m.params().count(), c.parameter_count());
  const auto& list = m.params().list();
  std::vector<std::string> names;
  for (const auto& [name, t] : list) names.push_back(name);
  for (const char* want : {"model.layers.1.pre_feedforward_layernorm.weight",
                           "model.layers.1.post_feedforward_layernorm.weight",
                           "model.layers.0.post_attention_layernorm.weight", "model.layers.0.self_attn.q_norm.weight",
                           "model.layers.0.self_attn.k_norm.weight", "model.norm.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  EXPECT_EQ(std::find(names.begin(), names.end(), "lm_head.weight"), names.end());
  for (const auto& [name, t] : list) {
    if (name.find("norm") == std::string::npos) continue;
    const std::vector<float> w = t.to_vector<float>();
    EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](float x) { return x == 0; })) << name;
  }
  vary_norms(m);
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const int64_t T = int64_t(ids.size());
  const std::vector<float> full = eval(m.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  expect_decoding_matches(m.decode_step(T), ids, full, c.vocab_size);

  nabla::testing_support::TempDir dir;
  save_checkpoint(dir.file("g.safetensors"), c.to_json(), m.params());
  try {
    models::gguf_from_checkpoint(load_checkpoint(dir.file("g.safetensors")));
    ADD_FAILURE() << "a gemma3 GGUF whose layer 1 is full attention";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("every sixth layer as full, the others sliding; this model's layer 1 "
                                         "is full_attention"),
              std::string::npos)
        << e.what();
  }
}

// SmolLM3-3B's config.json: Llama's maths with every fourth layer without
// rotary positions (no_rope_layers); tied (SmolLM3Config's default);
// 3,075,098,624 parameters.
TEST(Llama, SmolLM3ReadsItsConfig) {
  std::string listed;
  for (int i = 0; i < 36; ++i) listed += std::string(i ? ", " : "") + ((i + 1) % 4 ? "1" : "0");
  const std::string smol = R"({"architectures": ["SmolLM3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": null, "eos_token_id": 128012, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 65536,
    "max_window_layers": 28, "mlp_bias": false, "model_type": "smollm3", "no_rope_layer_interval": 4,
    "no_rope_layers": [)" + listed + R"(], "num_attention_heads": 16, "num_hidden_layers": 36,
    "num_key_value_heads": 4, "pad_token_id": 128004, "pretraining_tp": 2, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 5000000.0, "sliding_window": null, "torch_dtype": "bfloat16",
    "use_cache": false, "use_sliding_window": false, "vocab_size": 128256})";
  const LlamaConfig c = LlamaConfig::from_json(smol);
  EXPECT_EQ(c.model_type, "smollm3");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qk_norm());
  EXPECT_EQ(c.parameter_count(), 3075098624);
  ASSERT_EQ(c.no_rope_layers.size(), 36u);
  for (int64_t i = 0; i < 36; ++i) EXPECT_EQ(c.layer_rotates(i), (i + 1) % 4 != 0) << "layer " << i;
  EXPECT_NE(c.to_json().find("\"architectures\":[\"SmolLM3ForCausalLM\"]"), std::string::npos) << c.to_json();
  EXPECT_EQ(LlamaConfig::from_json(c.to_json()).to_json(), c.to_json());
  auto with = [&](const std::string& key, const std::string& value) {
    std::string j = smol;
    const size_t at = j.find("\"" + key + "\": ");
    const size_t end = key == "no_rope_layers" ? j.find(']', at) + 1 : j.find_first_of(",}", at);
    return j.replace(at, end - at, "\"" + key + "\": " + value);
  };
  // Without the list, every no_rope_layer_interval-th layer is NoPE.
  const std::string unlisted = with("no_rope_layers", "null");
  EXPECT_EQ(LlamaConfig::from_json(unlisted).no_rope_layers, c.no_rope_layers);
  const LlamaConfig every_third = LlamaConfig::from_json(
      std::string(unlisted).replace(unlisted.find("\"no_rope_layer_interval\": 4"), 27, "\"no_rope_layer_interval\": 3"));
  for (int64_t i = 0; i < 36; ++i) EXPECT_EQ(every_third.layer_rotates(i), (i + 1) % 3 != 0) << "layer " << i;
  // transformers reads at least one entry a layer; the ones past the last layer are not used.
  EXPECT_EQ(LlamaConfig::from_json(with("no_rope_layers", "[" + listed + ", 1, 0]")).no_rope_layers, c.no_rope_layers);
  EXPECT_THROW(LlamaConfig::from_json(with("no_rope_layers", "[1, 1, 0]")), UsageError);
  EXPECT_THROW(LlamaConfig::from_json(with("no_rope_layers", "[2" + listed.substr(1) + "]")), UsageError);
  EXPECT_THROW(LlamaConfig::from_json(with("no_rope_layers", "\"every fourth\"")), IoError);
  EXPECT_THROW(LlamaConfig::from_json(
                   std::string(unlisted).replace(unlisted.find("\"no_rope_layer_interval\": 4"), 27,
                                                 "\"no_rope_layer_interval\": 0")),
               IoError);
  LlamaConfig llama = small_config();
  llama.no_rope_layers = {1, 0};
  EXPECT_THROW(llama.validate(), UsageError);
}

// A NoPE layer sees the tokens before a position as a set: in a one-layer
// model without rotations, the last position's logits do not change when
// earlier tokens trade places (they do with rotary positions). Cached
// decoding of a model mixing both kinds of layer equals its full forward.
TEST(Llama, SmolLM3NoPELayersSeeNoOrder) {
  LlamaConfig c = small_config();
  c.model_type = "smollm3";
  c.attention_bias = false;
  c.num_hidden_layers = 1;
  c.initializer_range = 0.3;  // scores far from uniform, so that positions show
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6}, swapped = {1, 3, 9, 1, 5, 4, 2, 6};
  const int64_t T = int64_t(ids.size()), V = c.vocab_size;
  auto last_logits = [&](const Llama& m, const std::vector<int32_t>& row) {
    const std::vector<float> all = eval(m.forward(Tensor::from_vector<int32_t>({1, T}, row))).to_vector<float>();
    return std::vector<float>(all.end() - V, all.end());
  };
  auto largest_difference = [](const std::vector<float>& a, const std::vector<float>& b) {
    float d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
    return d;
  };
  c.no_rope_layers = {0};
  const Llama nope(c, 11);
  EXPECT_LT(largest_difference(last_logits(nope, ids), last_logits(nope, swapped)), 2e-5);
  c.no_rope_layers = {1};
  const Llama rotary(c, 11);
  EXPECT_GT(largest_difference(last_logits(rotary, ids), last_logits(rotary, swapped)), 0.1);
  c.num_hidden_layers = 2;
  c.no_rope_layers = {1, 0};
  const Llama mixed(c, 11);
  // The same parameters as Llama's, under the same names.
  LlamaConfig llama = c;
  llama.model_type = "llama";
  llama.no_rope_layers = {};
  EXPECT_EQ(mixed.params().count(), Llama(llama, 11).params().count());
  const std::vector<float> full = eval(mixed.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  expect_decoding_matches(mixed.decode_step(T), ids, full, V);
}

// Qwen2, Qwen3 and SmolLM3 with use_sliding_window: the layers that
// layer_types names slide, else (as transformers derives them) Qwen's from
// max_window_layers on and SmolLM3's NoPE layers; without it none do, whatever
// sliding_window or layer_types say. Such a model computes its windows (cached
// decoding too) and has no llama.cpp GGUF.
TEST(Llama, QwenAndSmolLM3SlideWhereTheirConfigsSay) {
  const std::string shape = R"("vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64)";
  auto read = [&](const std::string& keys) { return LlamaConfig::from_json("{" + shape + ", " + keys + "}"); };
  auto windows = [](const LlamaConfig& c) {
    std::vector<int64_t> w;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) w.push_back(c.layer_window(i));
    return w;
  };
  const LlamaConfig qwen = read(R"("model_type": "qwen2", "use_sliding_window": true, "sliding_window": 8,
    "max_window_layers": 2)");
  EXPECT_EQ(windows(qwen), (std::vector<int64_t>{0, 0, 8, 8}));
  EXPECT_NE(qwen.to_json().find("\"max_window_layers\":2"), std::string::npos) << qwen.to_json();
  EXPECT_EQ(LlamaConfig::from_json(qwen.to_json()).to_json(), qwen.to_json());
  EXPECT_EQ(windows(read(R"("model_type": "qwen3", "use_sliding_window": true, "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention", "full_attention", "sliding_attention"])")),
            (std::vector<int64_t>{8, 0, 0, 8}));
  EXPECT_EQ(windows(read(R"("model_type": "qwen3", "use_sliding_window": true, "sliding_window": 8)")),
            (std::vector<int64_t>{0, 0, 0, 0}));  // max_window_layers 28 by default
  EXPECT_EQ(windows(read(R"("model_type": "qwen2", "use_sliding_window": false, "sliding_window": 8,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention"])")),
            (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(windows(read(R"("model_type": "qwen2", "use_sliding_window": true, "sliding_window": null)")),
            (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(windows(read(R"("model_type": "smollm3", "use_sliding_window": true, "sliding_window": 8,
    "no_rope_layer_interval": 2)")),
            (std::vector<int64_t>{0, 8, 0, 8}));
  EXPECT_THROW(read(R"("model_type": "llama", "use_sliding_window": true, "sliding_window": 8)"), IoError);
  EXPECT_THROW(read(R"("model_type": "qwen2", "use_sliding_window": true, "sliding_window": 8,
    "max_window_layers": -1)"), IoError);
  EXPECT_THROW(read(R"("model_type": "qwen2", "use_sliding_window": true, "sliding_window": 8,
    "layer_types": ["sliding_attention"])"), UsageError);

  LlamaConfig c = small_config();
  c.model_type = "qwen2";
  c.sliding_window = 3;
  c.layer_types = {"full_attention", "sliding_attention"};
  Llama m(c, 9);
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const int64_t T = int64_t(ids.size());
  const std::vector<float> full = eval(m.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  expect_decoding_matches(m.decode_step(T), ids, full, c.vocab_size);
  LlamaConfig unwindowed = c;
  unwindowed.sliding_window = 0;
  unwindowed.layer_types = {};
  const std::vector<float> all =
      eval(Llama(unwindowed, 9).forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  EXPECT_GT(std::abs(all.back() - full.back()), 1e-5);
  nabla::testing_support::TempDir dir;
  save_checkpoint(dir.file("q.safetensors"), c.to_json(), m.params());
  try {
    models::gguf_from_checkpoint(load_checkpoint(dir.file("q.safetensors")));
    ADD_FAILURE() << "a qwen2 GGUF with a sliding layer";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no sliding window"), std::string::npos) << e.what();
  }
}

// transformers 5 writes rope_parameters where 4 wrote rope_theta and
// rope_scaling (Gemma 3: one object per layer type); both read to the same
// config, as transformers reads them.
TEST(Llama, ReadsTransformers5RopeParameters) {
  const std::string shape = R"("model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "tie_word_embeddings": true)";
  // Llama 3.2 1B's rotations, as each version writes them.
  const LlamaConfig v4 = LlamaConfig::from_json("{" + shape + R"(, "rope_theta": 500000.0, "rope_scaling": {
    "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
    "rope_type": "llama3"}})");
  const std::string v5_rope = R"("rope_parameters": {"factor": 32.0, "high_freq_factor": 4.0,
    "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_type": "llama3"})";
  const LlamaConfig v5 = LlamaConfig::from_json("{" + shape + ", " + v5_rope + "}");
  EXPECT_EQ(v5.rope_theta, 500000);
  EXPECT_EQ(v5.rope_scaling.type, "llama3");
  EXPECT_EQ(v5.to_json(), v4.to_json());
  // rope_parameters' theta before the top-level one; a non-null rope_scaling before rope_parameters.
  EXPECT_EQ(LlamaConfig::from_json("{" + shape + R"(, "rope_theta": 10000.0, )" + v5_rope + "}").to_json(), v4.to_json());
  const LlamaConfig scaled = LlamaConfig::from_json("{" + shape + R"(, "rope_scaling": {"rope_type": "linear",
    "factor": 2.0}, )" + v5_rope + "}");
  EXPECT_EQ(scaled.rope_scaling.type, "linear");
  EXPECT_EQ(scaled.rope_theta, 10000);  // rope_parameters unread, its theta too (transformers' default)
  // No scaling: the type "default" or none.
  for (const char* rope : {R"({"rope_theta": 1000000.0, "rope_type": "default"})", R"({"rope_theta": 1000000.0})"}) {
    const LlamaConfig plain = LlamaConfig::from_json("{" + shape + ", \"rope_parameters\": " + rope + "}");
    EXPECT_EQ(plain.rope_theta, 1e6) << rope;
    EXPECT_TRUE(plain.rope_scaling.type.empty()) << rope;
  }
  // Gemma 3 4B's text model: linear scaling by 8 on the full layers, the sliding ones unscaled at base 10000.
  const std::string gemma = R"("model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2560,
    "intermediate_size": 10240, "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 1024, "max_position_embeddings": 131072)";
  const LlamaConfig gemma_v4 = LlamaConfig::from_json("{" + gemma + R"(, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}})");
  const std::string by_type = R"("rope_parameters": {"full_attention": {"factor": 8.0, "rope_theta": 1000000.0,
    "rope_type": "linear"}, "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}})";
  const LlamaConfig gemma_v5 = LlamaConfig::from_json("{" + gemma + ", " + by_type + "}");
  EXPECT_EQ(gemma_v5.rope_theta, 1e6);
  EXPECT_EQ(gemma_v5.rope_local_base_freq, 1e4);
  EXPECT_EQ(gemma_v5.rope_scaling.factor, 8);
  EXPECT_EQ(gemma_v5.to_json(), gemma_v4.to_json());
  const LlamaConfig local = LlamaConfig::from_json("{" + gemma + R"(, "rope_parameters": {"full_attention":
    {"rope_theta": 1000000.0, "rope_type": "default"}, "sliding_attention": {"rope_theta": 20000.0}}})");
  EXPECT_EQ(local.rope_local_base_freq, 2e4);
  EXPECT_TRUE(local.rope_scaling.type.empty());

  // What nabla does not compute is refused, naming the key.
  auto refused = [](const std::string& json, const std::string& says) {
    try {
      LlamaConfig::from_json(json);
      ADD_FAILURE() << "read " << json;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused("{" + shape + R"(, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}})",
          "rope_parameters type \"yarn\" is not supported");
  refused("{" + shape + R"(, "rope_parameters": {"rope_theta": -1.0}})", "rope_theta must be a positive number");
  refused("{" + shape + R"(, "rope_parameters": "default"})", "rope_parameters must be null or an object");
  refused("{" + shape + R"(, "rope_parameters": {"full_attention": {"rope_theta": 1e6},
    "sliding_attention": {"rope_theta": 1e4}}})", "model_type \"llama\" has none");
  refused("{" + gemma + R"(, "rope_parameters": {"full_attention": {"rope_theta": 1e6},
    "sliding_attention": {"rope_type": "linear", "factor": 2.0}}})", "rope_parameters.sliding_attention type");
  refused("{" + shape + R"(, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}})",
          "rope_parameters");  // llama3's other keys missing
  refused("{" + shape + R"(, "layer_types": ["sliding_attention"]})", "layer_types holds \"sliding_attention\"");
}

// A prompt's pass gives its last token's logits and fills the caches, and
// the steps after it give the full forward's logits.
// A prompt's pass of its first P tokens, then cached steps over a cache of
// ids.size() positions: each position's logits are the full forward's.
void expect_prompt_then_steps(const Llama& m, const std::vector<int32_t>& ids, int64_t P, const std::vector<float>& full) {
  const int64_t T = int64_t(ids.size()), V = m.config().vocab_size;
  nn::DecodeStep s = m.decode_step(T);
  nn::DecodeStep::Prompt prompt = m.prompt(P, T);
  Executor pass(Graph(prompt.outputs()), {.threads = 2});
  std::copy_n(ids.begin(), P, prompt.tokens.data_as<int32_t>());
  pass.run();
  s.remember_prompt(pass, prompt);
  const std::vector<float> last = pass.read<float>(prompt.logits);
  for (int64_t v = 0; v < V; ++v) ASSERT_NEAR(last[size_t(v)], full[size_t((P - 1) * V + v)], 1e-5) << v;
  Executor ex(Graph(s.outputs()), {.threads = 2});
  for (int64_t p = P; p < T; ++p) {
    s.token.data_as<int32_t>()[0] = ids[size_t(p)];
    s.position.data_as<int32_t>()[0] = int32_t(p);
    ex.run();
    const std::vector<float> logits = ex.read<float>(s.logits);
    for (int64_t v = 0; v < V; ++v) ASSERT_NEAR(logits[size_t(v)], full[size_t(p * V + v)], 1e-5) << p << " " << v;
    s.remember(ex, p);
  }
}

TEST(Llama, PromptPassThenCachedSteps) {
  LlamaConfig c = small_config();
  Llama m(c, 8);
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const int64_t T = int64_t(ids.size()), P = 6;
  expect_prompt_then_steps(m, ids, P, eval(m.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>());
  nn::DecodeStep::Prompt prompt = m.prompt(P);
  Executor pass(Graph(prompt.outputs()), {.threads = 2});
  pass.run();
  EXPECT_THROW(m.prompt(c.max_position_embeddings + 1), UsageError);
  EXPECT_THROW(m.decode_step(P - 1).remember_prompt(pass, prompt), UsageError);  // longer than the cache
}

// Phi-3-mini-4k-instruct's, Phi-3.5-mini-instruct's and Phi-4-mini-instruct's
// config.json (the longrope factors' values aside: 48 each, as theirs):
// 3,821,079,552, 3,821,079,552 and 3,836,021,760 parameters.
TEST(Llama, Phi3ReadsItsConfigs) {
  std::string factors = "[";
  for (int i = 0; i < 48; ++i) factors += (i ? ", " : "") + std::to_string(1.0 + 0.25 * i);
  factors += "]";
  const std::string mini = R"({"architectures": ["Phi3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
    "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": null, "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": true, "vocab_size": 32064})";
  const LlamaConfig m = LlamaConfig::from_json(mini);
  EXPECT_TRUE(m.phi3());
  EXPECT_EQ(m.parameter_count(), 3821079552);
  EXPECT_EQ(m.rotary_dims(), 96);
  EXPECT_EQ(m.layer_window(0), 2047);
  EXPECT_TRUE(m.rope_freq_factors().empty());
  EXPECT_EQ(m.rope_attention_factor(), 1);
  EXPECT_NE(m.to_json().find("\"architectures\":[\"Phi3ForCausalLM\"]"), std::string::npos) << m.to_json();
  EXPECT_EQ(LlamaConfig::from_json(m.to_json()).to_json(), m.to_json());
  auto with = [&](std::string j, const std::string& key, const std::string& value) {
    const size_t at = j.find("\"" + key + "\": ");
    const size_t end = j.find_first_of(",}", at);
    return j.replace(at, end - at, "\"" + key + "\": " + value);
  };
  // Phi-3.5-mini: longrope over 131,072 positions from 4,096 (the "su" of
  // the first Phi-3-128k configs is its older name).
  const std::string longrope = R"({"long_factor": )" + factors + R"(, "short_factor": )" + factors + R"(, "type": "longrope"})";
  auto phi35 = [&](const std::string& rope_scaling) {
    return with(with(with(mini, "max_position_embeddings", "131072"), "sliding_window", "262144"), "rope_scaling",
                rope_scaling);
  };
  const std::string mini35 = phi35(longrope);
  for (const std::string& j : {mini35, phi35(R"({"type": "su", "long_factor": )" + factors + R"(, "short_factor": )" +
                                             factors + "}")}) {
    const LlamaConfig l = LlamaConfig::from_json(j);
    EXPECT_EQ(l.parameter_count(), 3821079552);
    EXPECT_EQ(l.rope_scaling.type, "longrope");
    EXPECT_EQ(l.rope_scaling.original_max_position_embeddings, 4096);
    EXPECT_EQ(l.rope_scaling.factor, 32);
    EXPECT_DOUBLE_EQ(l.rope_attention_factor(), std::sqrt(1 + std::log(32.0) / std::log(4096.0)));  // 1.1902
    EXPECT_EQ(l.rope_freq_factors(), l.rope_scaling.short_factor);
    ASSERT_EQ(l.rope_scaling.long_factor.size(), 48u);
    EXPECT_EQ(l.rope_scaling.long_factor[47], 12.75);
    EXPECT_EQ(LlamaConfig::from_json(l.to_json()).to_json(), l.to_json()) << l.to_json();
  }
  const LlamaConfig explicit_factor =
      LlamaConfig::from_json(phi35(longrope.substr(0, longrope.size() - 1) + R"(, "attention_factor": 1.5})"));
  EXPECT_EQ(explicit_factor.rope_attention_factor(), 1.5);
  EXPECT_EQ(LlamaConfig::from_json(explicit_factor.to_json()).rope_attention_factor(), 1.5);
  // Phi-4-mini: grouped heads, three quarters of each head rotated, a tied head.
  const std::string phi4 = with(with(with(with(with(mini35, "vocab_size", "200064"), "num_attention_heads", "24"),
                                            "num_key_value_heads", "8"), "tie_word_embeddings", "true"),
                                 "rope_theta", "10000.0, \"partial_rotary_factor\": 0.75");
  const LlamaConfig p4 = LlamaConfig::from_json(phi4);
  EXPECT_EQ(p4.parameter_count(), 3836021760);
  EXPECT_EQ(p4.head_size(), 128);
  EXPECT_EQ(p4.rotary_dims(), 96);
  EXPECT_EQ(LlamaConfig::from_json(p4.to_json()).to_json(), p4.to_json());
  // What nabla's model does not compute, and configs that do not hold together.
  EXPECT_THROW(LlamaConfig::from_json(with(mini, "resid_pdrop", "0.1")), IoError);
  EXPECT_THROW(LlamaConfig::from_json(with(mini, "rope_scaling", R"({"type": "linear", "factor": 2.0})")), UsageError);
  EXPECT_THROW(LlamaConfig::from_json(with(phi4, "num_attention_heads", "32")), UsageError);  // 48 factors for 72 dims
  EXPECT_THROW(LlamaConfig::from_json(phi35(R"({"type": "longrope", "short_factor": [1]})")), IoError);
  EXPECT_THROW(LlamaConfig::from_json(with(mini, "rope_theta", "10000.0, \"partial_rotary_factor\": 0")), UsageError);
  EXPECT_THROW(LlamaConfig::from_json(with(mini, "attention_bias", "true")), UsageError);
  LlamaConfig llama = small_config();
  llama.partial_rotary_factor = 0.5;
  EXPECT_THROW(llama.validate(), UsageError);
  llama.partial_rotary_factor = 1;
  llama.rope_scaling = LlamaConfig::from_json(mini35).rope_scaling;
  EXPECT_THROW(llama.validate(), UsageError);  // longrope is Phi-3's
}

// A small Phi-3 in Phi-4-mini's shape: Hugging Face's fused names, the
// cached decoding and a prompt's pass equal to the full forward with
// longrope's long factors (rows past the original 4) and its short ones,
// LoRA on the fused projections by default, merged as it computed.
TEST(Llama, Phi3FusesItsProjectionsAndDecodes) {
  LlamaConfig c = small_config();
  c.model_type = "phi3";
  c.attention_bias = false;
  c.num_attention_heads = 4;
  c.head_dim = 8;
  c.partial_rotary_factor = 0.75;
  c.max_position_embeddings = 16;
  c.initializer_range = 0.2;  // logits far enough from 0 for the rotations to show
  c.rope_scaling = {.type = "longrope", .factor = 4, .original_max_position_embeddings = 4,
                    .short_factor = {1.0, 2.0, 3.5}, .long_factor = {1.5, 6.0, 20.0}};
  Llama m(c, 9);
  vary_norms(m);
  EXPECT_EQ(m.params().count(), c.parameter_count());
  EXPECT_EQ(m.params().get("model.layers.1.self_attn.qkv_proj.weight").shape(), (Shape{(4 + 2 * 2) * 8, 24}));
  EXPECT_EQ(m.params().get("model.layers.1.mlp.gate_up_proj.weight").shape(), (Shape{2 * 40, 24}));
  EXPECT_THROW(m.params().get("model.layers.0.self_attn.q_proj.weight"), UsageError);
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5};
  const int64_t T = int64_t(ids.size());
  const std::vector<float> full = eval(m.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  expect_decoding_matches(m.decode_step(T), ids, full, c.vocab_size);
  expect_prompt_then_steps(m, ids, 3, full);  // the prompt within the original length, the session past it
  const std::vector<int32_t> short_ids(ids.begin(), ids.begin() + 4);
  const std::vector<float> short_full = eval(m.forward(Tensor::from_vector<int32_t>({1, 4}, short_ids))).to_vector<float>();
  expect_decoding_matches(m.decode_step(4), short_ids, short_full, c.vocab_size);
  // The short factors differ from the long ones where it matters: the last of 4 tokens' logits.
  float d = 0;
  for (int64_t v = 0; v < c.vocab_size; ++v) d = std::max(d, std::abs(short_full[size_t(3 * c.vocab_size + v)] - full[size_t(3 * c.vocab_size + v)]));
  EXPECT_GT(d, 1e-3);

  m.add_lora({.r = 2, .alpha = 4}, 3);
  EXPECT_EQ(m.lora().targets, (std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  EXPECT_EQ(m.adapter().get("base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight").shape(),
            (Shape{64, 2}));
  for (const auto& [name, t] : m.adapter().list()) {  // B away from zero, so the adapters change the output
    std::vector<float> w(size_t(t.numel()));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * float(int((i * 5 + name.size()) % 7) - 3);
    Tensor(t).assign(w);
  }
  const std::vector<float> adapted = eval(m.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  m.merge_lora();
  const std::vector<float> merged = eval(m.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  float moved = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_NEAR(merged[i], adapted[i], 1e-5) << i;
    moved = std::max(moved, std::abs(adapted[i] - full[i]));
  }
  EXPECT_GT(moved, 1e-3);
  Llama again(c, 9);
  EXPECT_THROW(again.add_lora({.r = 2, .alpha = 4, .targets = {"q_proj"}}, 3), UsageError);
}

// Llama 3.2's rope_scaling: low frequencies divided by factor, high ones
// kept, those between blended (transformers' _compute_llama3_parameters).
TEST(Llama, ReadsRopeScaling) {
  const std::string llama32 = R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 128,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})";
  const LlamaConfig c = LlamaConfig::from_json(llama32);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  const std::vector<double> f = c.rope_freq_factors();
  ASSERT_EQ(f.size(), 32u);
  // Wavelength 2 pi 500000^(i/32): below 8192 / 4 up to i = 14, above 8192 from i = 18.
  for (int i = 0; i <= 14; ++i) EXPECT_EQ(f[i], 1.0) << i;
  for (int i = 18; i < 32; ++i) EXPECT_EQ(f[i], 32.0) << i;
  for (int i = 15; i <= 17; ++i) {
    const double wavelen = 2 * M_PI * std::pow(500000.0, i / 32.0), smooth = (8192 / wavelen - 1) / 3;
    EXPECT_NEAR(f[i], 1 / ((1 - smooth) / 32 + smooth), 1e-12) << i;
    EXPECT_GT(f[i], 1.0);
    EXPECT_LT(f[i], 32.0);
  }
  EXPECT_EQ(LlamaConfig::from_json(c.to_json()).to_json(), c.to_json());
  EXPECT_NE(c.to_json().find("\"rope_type\":\"llama3\""), std::string::npos) << c.to_json();

  auto with = [&](const std::string& scaling) {
    std::string s = llama32;
    const size_t at = s.find("{\"factor\"");
    return s.substr(0, at) + scaling + "}";
  };
  EXPECT_EQ(LlamaConfig::from_json(with(R"({"type": "linear", "factor": 4})")).rope_freq_factors(),
            std::vector<double>(32, 4.0));
  EXPECT_TRUE(LlamaConfig::from_json(with(R"({"rope_type": "default"})")).rope_freq_factors().empty());
  EXPECT_TRUE(LlamaConfig::from_json(with("null")).rope_freq_factors().empty());
  EXPECT_THROW(LlamaConfig::from_json(with(R"({"rope_type": "yarn", "factor": 4})")), IoError);
  EXPECT_THROW(LlamaConfig::from_json(with(R"({"rope_type": "llama3", "factor": 4})")), IoError);  // no low/high
  EXPECT_THROW(LlamaConfig::from_json(with(R"({"rope_type": "linear", "factor": -1})")), UsageError);
  EXPECT_THROW(LlamaConfig::from_json(with("[4]")), IoError);
}

// A key/value head serves its group of query heads: the model with 2
// key/value heads gives the logits of one with 6 whose k and v weights are
// the 2 heads' repeated for each group.
TEST(Llama, GroupedQueryAttentionIsRepeatedKeyValueHeads) {
  const LlamaConfig grouped = small_config();
  LlamaConfig full = grouped;
  full.num_key_value_heads = 6;
  Llama a(grouped, 3), b(full, 4);
  const int64_t hd = grouped.head_size(), g = 3;
  for (const auto& [name, t] : a.params().list()) {
    Tensor dst = b.params().get(name);
    const std::vector<float> src = t.to_vector<float>();
    const bool kv = name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos;
    if (!kv) {
      dst.assign<float>(src);
      continue;
    }
    // Rows of head h of the full model: key/value head h / g's.
    const int64_t row = t.rank() == 2 ? t.dim(1) : 1;
    std::vector<float> out;
    for (int64_t h = 0; h < 6; ++h) {
      const int64_t from = (h / g) * hd * row;
      out.insert(out.end(), src.begin() + from, src.begin() + from + hd * row);
    }
    dst.assign<float>(out);
  }
  const Tensor ids = tokens(2, 11, grouped.vocab_size, 1);
  const std::vector<float> la = eval(a.forward(ids)).to_vector<float>(), lb = eval(b.forward(ids)).to_vector<float>();
  ASSERT_EQ(la.size(), lb.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    worst = std::max(worst, double(std::abs(la[i] - lb[i])));
    scale = std::max(scale, double(std::abs(lb[i])));
  }
  EXPECT_LE(worst, 1e-6 * scale);
  EXPECT_GT(scale, 0.0);
}

// Later tokens do not change earlier logits (causal), and positions matter
// (rotary): the same token at two positions gives two outputs.
TEST(Llama, IsCausalAndPositional) {
  const LlamaConfig c = small_config();
  Llama m(c, 5);
  Tensor ids = tokens(1, 8, c.vocab_size, 2);
  const std::vector<float> before = eval(m.forward(ids)).to_vector<float>();
  std::vector<int32_t> changed = ids.to_vector<int32_t>();
  changed[7] = (changed[7] + 1) % int32_t(c.vocab_size);
  const std::vector<float> after =
      eval(m.forward(Tensor::from_vector<int32_t>({1, 8}, changed))).to_vector<float>();
  const size_t V = size_t(c.vocab_size);
  for (size_t i = 0; i < 7 * V; ++i) ASSERT_EQ(before[i], after[i]) << i;
  bool differs = false;
  for (size_t i = 7 * V; i < 8 * V; ++i) differs = differs || before[i] != after[i];
  EXPECT_TRUE(differs);
  const std::vector<float> same =
      eval(m.forward(Tensor::from_vector<int32_t>({1, 2}, {5, 5}))).to_vector<float>();
  bool position_matters = false;
  for (size_t i = 0; i < V; ++i) position_matters = position_matters || same[i] != same[V + i];
  EXPECT_TRUE(position_matters);
}

// Hugging Face's labels: -100 positions count for nothing, and the loss is
// the mean over the counted ones; the model trains through TrainStep.
TEST(Llama, LossFollowsLabelsAndTrains) {
  const LlamaConfig c = small_config();
  Llama m(c, 7);
  const Tensor ids = tokens(2, 9, c.vocab_size, 3);
  std::vector<int32_t> lab = ids.to_vector<int32_t>();
  for (size_t i = 0; i < lab.size(); i += 3) lab[i] = -100;
  const Tensor labels = Tensor::from_vector<int32_t>({2, 9}, lab);
  // By hand: log-softmax of the logits at t against labels[t + 1].
  const std::vector<float> logits = eval(m.forward(ids)).to_vector<float>();
  const size_t V = size_t(c.vocab_size);
  double total = 0;
  int counted = 0;
  for (size_t b = 0; b < 2; ++b) {
    for (size_t t = 0; t + 1 < 9; ++t) {
      const int32_t y = lab[b * 9 + t + 1];
      if (y < 0) continue;
      const float* row = &logits[(b * 9 + t) * V];
      double mx = row[0], z = 0;
      for (size_t k = 0; k < V; ++k) mx = std::max(mx, double(row[k]));
      for (size_t k = 0; k < V; ++k) z += std::exp(double(row[k]) - mx);
      total += mx + std::log(z) - row[y];
      ++counted;
    }
  }
  const Tensor loss = m.loss(ids, labels);
  EXPECT_NEAR(eval(loss).item(), total / counted, 1e-5 * total / counted);
  EXPECT_THROW(m.loss(ids, slice(labels, 1, 0, 8)), ShapeError);

  TrainStep step(loss, m.params(), {}, optim::AdamWConfig{}, ExecOptions{.threads = 2});
  float first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    step.run();
    (i == 0 ? first : last) = step.loss();
    step.update(3e-3, 1.0);
  }
  EXPECT_LT(last, 0.5f * first);
}

// nabla's GGUF export read back: the same config and, from F32, the same
// parameters bit for bit (q/k rows interleaved on the way out, back on the
// way in; Llama 3's rope_scaling through rope_freqs.weight).
TEST(Llama, GgufRoundTrip) {
  nabla::testing_support::TempDir dir;
  LlamaConfig llama3 = small_config();
  llama3.attention_bias = false;
  llama3.rope_scaling = {.type = "llama3", .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                         .original_max_position_embeddings = 16};
  LlamaConfig qwen2 = small_config();
  qwen2.model_type = "qwen2";
  qwen2.tie_word_embeddings = true;
  LlamaConfig linear = small_config();
  linear.attention_bias = false;
  linear.num_key_value_heads = 6;
  linear.rope_scaling = {.type = "linear", .factor = 2};
  LlamaConfig qwen3 = small_config();
  qwen3.model_type = "qwen3";
  qwen3.attention_bias = false;
  qwen3.head_dim = 10;
  LlamaConfig mistral = small_config();  // llama.cpp's llama: read back as model_type llama, without the window
  mistral.model_type = "mistral";
  mistral.attention_bias = false;
  mistral.sliding_window = 12;
  LlamaConfig gemma = small_config();  // llama.cpp's gemma3: norms stored as 1 + weight
  gemma.model_type = "gemma3_text";
  gemma.attention_bias = false;
  gemma.tie_word_embeddings = true;
  gemma.num_hidden_layers = 6;
  gemma.sliding_window = 5;
  for (int64_t l = 0; l < 6; ++l) gemma.layer_types.push_back(l == 5 ? "full_attention" : "sliding_attention");
  gemma.rope_scaling = {.type = "linear", .factor = 2};
  LlamaConfig smol = small_config();  // llama.cpp's smollm3: llama's tensors, every fourth layer NoPE
  smol.model_type = "smollm3";
  smol.attention_bias = false;
  smol.num_hidden_layers = 5;
  smol.no_rope_layers = {1, 1, 1, 0, 1};
  smol.rope_scaling = {.type = "linear", .factor = 2};
  LlamaConfig gemma2 = gemma;  // llama.cpp's gemma2: the even layers slide, caps as keys
  gemma2.model_type = "gemma2";
  gemma2.num_hidden_layers = 4;
  gemma2.layer_types = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  gemma2.attn_logit_softcapping = 20;
  gemma2.final_logit_softcapping = 15;
  LlamaConfig phi3 = small_config();  // llama.cpp's phi3: fused projections, longrope's factors as tensors
  phi3.model_type = "phi3";
  phi3.attention_bias = false;
  phi3.num_attention_heads = 3;
  phi3.num_key_value_heads = 1;
  phi3.head_dim = 8;
  phi3.partial_rotary_factor = 0.75;
  phi3.sliding_window = 12;
  phi3.rope_scaling = {.type = "longrope", .factor = 2, .original_max_position_embeddings = 16,
                       .short_factor = {1, 1.5, 3}, .long_factor = {2, 5, 11}};
  LlamaConfig phi3_factor = phi3;  // an attention factor of its own; no window
  phi3_factor.sliding_window = 0;
  phi3_factor.rope_scaling.attention_factor = 1.25;
  LlamaConfig phi3_4k = phi3;  // Phi-3-mini-4k's: no scaling, every head rotated
  phi3_4k.partial_rotary_factor = 1;
  phi3_4k.rope_scaling = {};
  int i = 0;
  for (LlamaConfig c : {llama3, qwen2, linear, qwen3, mistral, gemma, smol, gemma2, phi3, phi3_factor, phi3_4k}) {
    c.preset = "round-trip-" + std::to_string(i);
    c.vocab_size = 256;  // the byte tokenizer's, which the GGUF carries
    std::string stem = dir.file("m");  // (m + to_string: g++ 12 warns falsely of -Wrestrict here)
    stem += std::to_string(i++);
    const std::string ckpt = stem + ".safetensors", gguf = stem + ".gguf";
    Llama a(c, 5);
    vary_norms(a);
    save_checkpoint(ckpt, c.to_json(), a.params());
    models::gguf_from_checkpoint(load_checkpoint(ckpt)).write(gguf);
    Checkpoint back = models::load_any_checkpoint(gguf);
    EXPECT_EQ(back.architecture, "llama");
    const LlamaConfig got = models::llama_config_from_checkpoint(back);
    if (c.model_type == "mistral") {
      c.model_type = "llama";
      c.sliding_window = 0;
    }
    EXPECT_EQ(got.to_json(), c.to_json());
    Llama b(got, 6);
    load_params(back, b.params());
    for (size_t k = 0; k < a.params().list().size(); ++k) {
      const auto& [name, t] = a.params().list()[k];
      const std::vector<float> want = t.to_vector<float>(), got_values = b.params().list()[k].second.to_vector<float>();
      if (!c.gemma() || name.find("norm") == std::string::npos) {
        EXPECT_EQ(want, got_values) << name;
        continue;
      }
      for (size_t e = 0; e < want.size(); ++e) EXPECT_NEAR(want[e], got_values[e], 2e-7) << name;  // (w + 1) - 1
    }
  }
  // What llama.cpp's smollm3 does not compute: Llama 3's scaling (no
  // rope_freqs there), NoPE layers other than every fourth.
  for (const auto& [change, says] : std::vector<std::pair<std::function<void(LlamaConfig&)>, std::string>>{
           {[&](LlamaConfig& c) { c.rope_scaling = llama3.rope_scaling; }, "has no llama3 rope scaling"},
           {[](LlamaConfig& c) { c.no_rope_layers = {1, 1, 0, 1, 1}; }, "layer 2 does not"}}) {
    LlamaConfig c = smol;
    change(c);
    save_checkpoint(dir.file("smol.safetensors"), c.to_json(), Llama(c, 1).params());
    try {
      models::gguf_from_checkpoint(load_checkpoint(dir.file("smol.safetensors")));
      ADD_FAILURE() << "exported " << says;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
  // llama.cpp's phi3 reads queries at heads x head size = hidden size.
  {
    LlamaConfig wide = phi3_4k;
    wide.head_dim = 10;
    save_checkpoint(dir.file("wide.safetensors"), wide.to_json(), Llama(wide, 1).params());
    try {
      models::gguf_from_checkpoint(load_checkpoint(dir.file("wide.safetensors")));
      ADD_FAILURE() << "exported a phi3 whose heads are wider than hidden / heads";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("phi3 takes heads x head size = hidden size"), std::string::npos) << e.what();
    }
  }
  // A name that is not UTF-8 (config JSON could not hold it) is left out.
  {
    GgufFile f = read_gguf(dir.file("m0.gguf"));
    GgufWriter named;
    for (const auto& [k, v] : f.metadata) named.set(k, v);
    named.set("general.name", std::string("bad\xC3(name"));
    for (const GgufTensor& t : f.tensors) named.add_tensor(t.name, t.tensor);
    named.write(dir.file("named.gguf"));
    EXPECT_EQ(models::llama_config_from_checkpoint(models::checkpoint_from_gguf(dir.file("named.gguf"))).preset, "");
  }
  // A qwen3 file without key_length (its heads 10 wide, not hidden / heads = 4):
  // the head size is its q norm's.
  {
    GgufFile f = read_gguf(dir.file("m3.gguf"));
    GgufWriter bare;
    for (const auto& [k, v] : f.metadata) {
      if (!k.ends_with("key_length") && !k.ends_with("value_length") && !k.ends_with("dimension_count")) bare.set(k, v);
    }
    for (const GgufTensor& t : f.tensors) bare.add_tensor(t.name, t.tensor);
    bare.write(dir.file("bare.gguf"));
    EXPECT_EQ(models::llama_config_from_checkpoint(models::checkpoint_from_gguf(dir.file("bare.gguf"))).head_size(), 10);
  }
  // Another architecture, a missing tensor: errors naming the file.
  GgufWriter w;
  w.set("general.architecture", "gpt2");
  w.write(dir.file("gpt2.gguf"));
  EXPECT_THROW(models::checkpoint_from_gguf(dir.file("gpt2.gguf")), IoError);
  try {
    GgufFile f = read_gguf(dir.file("m0.gguf"));
    GgufWriter cut;
    for (const auto& [k, v] : f.metadata) cut.set(k, v);
    for (const GgufTensor& t : f.tensors)
      if (t.name != "blk.1.ffn_up.weight") cut.add_tensor(t.name, t.tensor);
    cut.write(dir.file("cut.gguf"));
    models::checkpoint_from_gguf(dir.file("cut.gguf"));
    ADD_FAILURE() << "no error for a missing tensor";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("cut.gguf") + ": no tensor 'blk.1.ffn_up.weight'"), std::string::npos)
        << e.what();
  }
}

// The tokenizer goes into the GGUF (tokenizer.ggml.*) and comes out of it,
// read without the weights; a Hugging Face folder's tokenizer.json is the
// folder's tokenizer.
TEST(Llama, TokenizerTravelsWithTheWeights) {
  nabla::testing_support::TempDir dir;
  std::string text;
  for (int i = 0; i < 30; ++i) text += "the cat sat on the mat, 42 times.\n";
  auto tok = BpeTokenizer::train(text, 300, PreTokenizer::qwen2);
  tok->save_json(dir.file("tokenizer.json"));
  LlamaConfig c = small_config();
  c.attention_bias = false;  // llama.cpp's llama has none
  c.vocab_size = 320;        // more rows than tokens: padding tokens in the GGUF
  Llama m(c, 3);
  save_checkpoint(dir.file("m.safetensors"), c.to_json(), m.params());
  const Checkpoint ckpt = load_checkpoint(dir.file("m.safetensors"));
  models::gguf_from_checkpoint(ckpt, {.tokenizer = dir.file("tokenizer.json")}).write(dir.file("m.gguf"));
  EXPECT_EQ(models::checkpoint_tokenizer(dir.file("m.gguf"), "byte"), dir.file("m.gguf"));
  EXPECT_EQ(models::checkpoint_tokenizer(dir.file("m.safetensors"), "byte"), "byte");
  EXPECT_TRUE(read_gguf_metadata(dir.file("m.gguf")).tensors.empty());
  auto back = make_tokenizer(dir.file("m.gguf"));
  EXPECT_EQ(back->vocab_size(), 320);
  for (const std::string s : {"the cat sat", "42 mats<|endoftext|>x", "東京 🙂"}) EXPECT_EQ(back->encode(s), tok->encode(s));
  // Without one given, the byte tokenizer; a vocabulary larger than the
  // embedding is refused.
  models::gguf_from_checkpoint(ckpt).write(dir.file("bytes.gguf"));
  EXPECT_EQ(make_tokenizer(dir.file("bytes.gguf"))->encode("ab"), (std::vector<int32_t>{'a', 'b'}));
  LlamaConfig narrow = c;
  narrow.vocab_size = tok->vocab_size() - 1;
  Llama n(narrow, 3);
  save_checkpoint(dir.file("narrow.safetensors"), narrow.to_json(), n.params());
  EXPECT_THROW(models::gguf_from_checkpoint(load_checkpoint(dir.file("narrow.safetensors")),
                                            {.tokenizer = dir.file("tokenizer.json")}),
               IoError);
  // A folder with a tokenizer.json.
  std::filesystem::create_directories(dir.file("folder"));
  std::filesystem::copy_file(dir.file("tokenizer.json"), dir.file("folder/tokenizer.json"));
  EXPECT_EQ(models::checkpoint_tokenizer(dir.file("folder"), "byte"), dir.file("folder/tokenizer.json"));
}
