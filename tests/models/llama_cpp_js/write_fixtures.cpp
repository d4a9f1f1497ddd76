// What the ctest llama_cpp_runs_nabla_gguf hands to llama.cpp (check.sh).
//   nabla_llama_fixtures write DIR: small Llama-family checkpoints with
//     random weights at scales where every path matters (DIR/<model>.safetensors)
//     and prompts of token ids for each (DIR/prompts.json); and
//     DIR/tokenizers/host.safetensors, a small model with a vocabulary of
//     1024 that carries the tokenizers check.sh trains into GGUF files.
//   nabla_llama_fixtures expect DIR: for every DIR/<model>.<type>.gguf (as
//     `nabla export gguf --type` wrote it), read back by nabla (checkpoint_from_gguf,
//     quantized tensors dequantized), nabla's 10 most likely next tokens with
//     their log-probabilities at every position of the model's prompts
//     (DIR/expected.json, keyed by the file's stem). Models with a LoRA
//     adapter (DIR/<model>.lora/, PEFT's folder, written by `write`) also
//     get "<model>.f32+lora": the same from the F32 file with the adapter on,
//     which llama.cpp computes with `nabla export lora-gguf`'s file
//     (DIR/<model>.lora.adapter); and DIR/<model>.merged.gguf (`nabla
//     export gguf --adapter`) must compute as the adapted model does.
// Models: "llama_gqa3" (GQA 3, head size 16 != hidden / heads, untied, Llama 3
// rope_scaling), "llama_tied" (GQA 1, tied), "qwen2" (q/k/v biases, GQA 2),
// "qwen3" (q/k head norms, head size 32 != hidden / heads, GQA 2, tied);
// "gemma3" (six layers as llama.cpp fixes them, five sliding with a window of
// 16 and one full with linear rope scaling, GQA 4, tied); "smollm3" (five
// layers, the fourth without rotary positions as llama.cpp fixes it, linear
// rope scaling, GQA 2, tied); "gemma2" (four layers, the even ones sliding
// with a window of 16, scores capped at 0.5 and logits at 8, so that both
// caps bite, GQA 2, tied);
// hidden 256 and intermediate 512, so that the block formats quantize most
// matrices (rows of 256).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "nabla/checkpoint.h"
#include "nabla/io.h"
#include "nabla/models/gguf.h"
#include "nabla/models/llama.h"
#include "nabla/models/lora.h"
#include "nabla/nabla.hpp"

using namespace nabla;
using json = nlohmann::json;

namespace {

models::LlamaConfig base() {
  models::LlamaConfig c;
  c.vocab_size = 256;  // the byte tokenizer
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  c.tokenizer = "byte";
  return c;
}

// Projections N(0, 1/in), biases N(0, 0.1), norm gains 1 + N(0, 0.2) (Gemma
// stores gain - 1), the embedding's rows N(0, 4/D) as the blocks see them
// (Gemma scales them by sqrt(D)): logits spread over several nats, so the
// top tokens are well apart.
void randomize(models::Llama& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  const double D = double(m.config().hidden_size), gemma = m.config().gemma() ? 1 : 0;
  for (auto [name, t] : m.params().list()) {
    float* v = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double r = normal(rng);
      v[i] = float(name == "model.embed_tokens.weight" ? 2 * r / std::sqrt(D) / (gemma ? std::sqrt(D) : 1)
                   : name.find("norm") != std::string::npos ? 1 - gemma + 0.2 * r
                   : name.ends_with(".bias")                ? 0.1 * r
                                                            : r / std::sqrt(double(t.dim(1))));
    }
  }
}

json top_tokens(const models::Llama& m, const std::vector<int32_t>& ids) {
  const int64_t T = int64_t(ids.size()), V = m.config().vocab_size;
  const std::vector<float> logits =
      eval(m.forward(Tensor::from_vector<int32_t>({1, T}, ids))).to_vector<float>();
  json positions = json::array();
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * V;
    double top = row[0], sum = 0;
    for (int64_t v = 0; v < V; ++v) top = std::max(top, double(row[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - top);
    std::vector<std::pair<double, int64_t>> lp;
    for (int64_t v = 0; v < V; ++v) lp.emplace_back(double(row[v]) - top - std::log(sum), v);
    std::partial_sort(lp.begin(), lp.begin() + 10, lp.end(), [](auto& a, auto& b) { return a.first > b.first; });
    json best = json::array();
    for (int k = 0; k < 10; ++k) best.push_back({lp[size_t(k)].second, lp[size_t(k)].first});
    positions.push_back(best);
  }
  return positions;
}

void write(const std::string& dir) {
  std::vector<std::pair<std::string, models::LlamaConfig>> configs;
  models::LlamaConfig gqa3 = base();
  gqa3.num_attention_heads = 6;
  gqa3.num_key_value_heads = 2;
  gqa3.head_dim = 16;
  gqa3.rope_scaling = {.type = "llama3", .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                       .original_max_position_embeddings = 16};
  configs.emplace_back("llama_gqa3", gqa3);
  models::LlamaConfig tied = base();
  tied.tie_word_embeddings = true;
  tied.rope_theta = 500;
  configs.emplace_back("llama_tied", tied);
  models::LlamaConfig qwen2 = base();
  qwen2.model_type = "qwen2";
  qwen2.attention_bias = true;
  qwen2.num_key_value_heads = 2;
  qwen2.rope_theta = 1e6;
  configs.emplace_back("qwen2", qwen2);
  models::LlamaConfig qwen3 = base();
  qwen3.model_type = "qwen3";
  qwen3.num_key_value_heads = 2;
  qwen3.head_dim = 32;
  qwen3.rope_theta = 1e6;
  qwen3.rms_norm_eps = 1e-6;
  qwen3.tie_word_embeddings = true;
  configs.emplace_back("qwen3", qwen3);
  models::LlamaConfig gemma3 = base();
  gemma3.model_type = "gemma3_text";
  gemma3.num_hidden_layers = 6;
  gemma3.num_key_value_heads = 1;
  gemma3.rope_theta = 1e6;
  gemma3.rms_norm_eps = 1e-6;
  gemma3.tie_word_embeddings = true;
  gemma3.sliding_window = 16;
  for (int64_t l = 0; l < 6; ++l) gemma3.layer_types.push_back(l == 5 ? "full_attention" : "sliding_attention");
  gemma3.rope_scaling = {.type = "linear", .factor = 4};
  configs.emplace_back("gemma3", gemma3);
  models::LlamaConfig smollm3 = base();
  smollm3.model_type = "smollm3";
  smollm3.num_hidden_layers = 5;
  smollm3.num_key_value_heads = 2;
  smollm3.no_rope_layers = {1, 1, 1, 0, 1};
  smollm3.rope_theta = 1e5;
  smollm3.rope_scaling = {.type = "linear", .factor = 2};
  smollm3.tie_word_embeddings = true;
  configs.emplace_back("smollm3", smollm3);
  models::LlamaConfig gemma2 = base();
  gemma2.model_type = "gemma2";
  gemma2.num_hidden_layers = 4;
  gemma2.num_key_value_heads = 2;
  gemma2.rms_norm_eps = 1e-6;
  gemma2.tie_word_embeddings = true;
  gemma2.sliding_window = 16;
  gemma2.layer_types = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  gemma2.attn_logit_softcapping = 0.5;
  gemma2.final_logit_softcapping = 8;
  configs.emplace_back("gemma2", gemma2);
  // Phi-4-mini's shape: fused projections, grouped heads, three quarters of
  // each head rotated, longrope's factors and attention factor. llama.cpp
  // picks the factors by its context (64, which it pads to 256): short
  // within the original 256, as nabla's rows of at most 40 tokens; long past
  // the original 128 of phi4_mini_long, for which expect() gives nabla the
  // long factors (not named "phi3": llama.cpp gives a model whose
  // general.name holds "phi3" or "phi-3" Phi-3's token attributes, looking
  // up "</s>", which the byte vocabulary lacks).
  models::LlamaConfig phi3 = base();
  phi3.model_type = "phi3";
  phi3.num_attention_heads = 8;
  phi3.num_key_value_heads = 2;
  phi3.partial_rotary_factor = 0.75;
  phi3.tie_word_embeddings = true;
  phi3.max_position_embeddings = 1024;
  phi3.rope_scaling = {.type = "longrope", .factor = 4, .original_max_position_embeddings = 256};
  for (int i = 0; i < 12; ++i) {
    phi3.rope_scaling.short_factor.push_back(1 + 0.5 * i);
    phi3.rope_scaling.long_factor.push_back(2 + 3.0 * i);
  }
  configs.emplace_back("phi4_mini", phi3);
  phi3.max_position_embeddings = 512;
  phi3.rope_scaling.original_max_position_embeddings = 128;
  configs.emplace_back("phi4_mini_long", phi3);

  std::mt19937_64 rng(7);
  json prompts = json::object();
  uint64_t seed = 1;
  for (auto& [name, c] : configs) {
    c.preset = "fixture-" + name;
    models::Llama m(c, seed);
    randomize(m, seed++);
    save_checkpoint(dir + "/" + name + ".safetensors", c.to_json(), m.params());
    if (name != "llama_tied") {
      // Every target, B non-zero; rsLoRA on one (llama.cpp knows only alpha / r).
      nn::LoraConfig lora{.r = 8, .alpha = 16, .rslora = name == "llama_gqa3"};
      m.add_lora(lora, seed);
      std::mt19937_64 g(seed + 100);
      std::normal_distribution<double> normal;
      for (auto [n, t] : m.adapter().list()) {
        float* v = t.data_as<float>();
        for (int64_t i = 0; i < t.numel(); ++i) v[i] = float(normal(g) / std::sqrt(double(t.dim(1))) * 0.5);
      }
      models::save_peft_adapter(dir + "/" + name + ".lora", m.lora(), m.adapter(), name);
    }
    json list = json::array();
    for (int64_t len : {1, 7, 40}) {
      std::vector<int32_t> ids(static_cast<size_t>(len));
      for (int32_t& id : ids) id = int32_t(rng() % uint64_t(c.vocab_size));
      list.push_back(ids);
    }
    prompts[name] = list;
  }
  write_file_atomic(dir + "/prompts.json", prompts.dump());

  // A model to carry tokenizers of up to 1024 tokens into llama.cpp (its
  // own folder: no log-probabilities are compared for it).
  models::LlamaConfig host = base();
  host.preset = "fixture-tokenizer-host";
  host.vocab_size = 1024;
  host.hidden_size = 64;
  host.intermediate_size = 128;
  host.num_hidden_layers = 1;
  host.num_attention_heads = host.num_key_value_heads = 2;
  std::filesystem::create_directories(dir + "/tokenizers");
  save_checkpoint(dir + "/tokenizers/host.safetensors", host.to_json(), models::Llama(host, 1).params());
}

void expect(const std::string& dir) {
  const json prompts = json::parse(read_file(dir + "/prompts.json"));
  json expected = json::object();
  auto expectations = [&](const models::Llama& m, const std::string& model) {
    json list = json::array();
    for (const auto& ids : prompts.at(model)) {
      list.push_back({{"tokens", ids}, {"top", top_tokens(m, ids.get<std::vector<int32_t>>())}});
    }
    return list;
  };
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".gguf") continue;
    const std::string stem = entry.path().stem().string();  // <model>.<type>
    const std::string model = stem.substr(0, stem.find('.'));
    Checkpoint ckpt = models::checkpoint_from_gguf(entry.path().string());
    models::LlamaConfig c = models::llama_config_from_checkpoint(ckpt);
    if (model.ends_with("_long")) c.rope_scaling.short_factor = c.rope_scaling.long_factor;  // llama.cpp's choice
    models::Llama m(c, 0);
    load_params(ckpt, m.params());
    expected[stem] = expectations(m, model);
    const std::string lora = dir + "/" + model + ".lora";
    if (stem != model + ".f32" || !std::filesystem::exists(lora)) continue;
    models::attach_peft_adapter(m, lora);
    expected[model + ".f32+lora"] = expectations(m, model);
  }
  // The adapters must move the log-probabilities (else llama.cpp ignoring
  // them would pass), and the merged files must compute as the adapted models.
  for (const auto& [key, list] : expected.items()) {
    const size_t plus = key.find("+lora");
    if (plus == std::string::npos) continue;
    const std::string model = key.substr(0, key.find('.'));
    double moved = 0, merged = 0;
    const json& base = expected.at(key.substr(0, plus));
    const json& folded = expected.at(model + ".merged");
    for (size_t p = 0; p < list.size(); ++p) {
      for (size_t t = 0; t < list[p]["top"].size(); ++t) {
        const json &a = list[p]["top"][t], &b = base[p]["top"][t], &f = folded[p]["top"][t];
        moved = std::max(moved, std::abs(a[0][1].get<double>() - b[0][1].get<double>()));
        if (a[0][0] != f[0][0]) merged = HUGE_VAL;
        merged = std::max(merged, std::abs(a[0][1].get<double>() - f[0][1].get<double>()));
      }
    }
    std::printf("%s: the adapter moves the top log-probability by up to %.3f; the merged file computes within %.1e\n",
                key.c_str(), moved, merged);
    if (!(moved > 0.05)) throw std::runtime_error(key + ": the adapter hardly changes the model");
    if (!(merged < 1e-4)) throw std::runtime_error(key + ": the merged model computes otherwise than the adapted one");
  }
  write_file_atomic(dir + "/expected.json", expected.dump());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "write" && mode != "expect") {
    std::fprintf(stderr, "usage: %s write|expect DIR\n", argv[0]);
    return 2;
  }
  try {
    mode == "write" ? write(argv[2]) : expect(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nabla_llama_fixtures: %s\n", e.what());
    return 1;
  }
  return 0;
}
