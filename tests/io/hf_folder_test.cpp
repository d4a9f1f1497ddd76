// Hugging Face model folders: a Llama written as config.json and
// model.safetensors reads back as the same model; sharded folders read
// through their index; damaged folders name the file and what was expected.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/io.h"
#include "nabla/models/finetune.h"
#include "nabla/models/llama.h"
#include "nabla/models/lora.h"

#include "temp_dir.h"

using namespace nabla;
using json = nlohmann::json;
using nabla::testing_support::TempDir;

namespace {

models::LlamaConfig small_llama() {
  models::LlamaConfig c;
  c.model_type = "qwen2";
  c.attention_bias = true;
  c.vocab_size = 19;
  c.hidden_size = 12;
  c.intermediate_size = 20;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.head_dim = 6;
  c.max_position_embeddings = 16;
  c.rope_theta = 1e6;
  return c;
}

void expect_same_params(const nn::Params& a, const nn::Params& b) {
  ASSERT_EQ(a.list().size(), b.list().size());
  for (size_t i = 0; i < a.list().size(); ++i) {
    const auto& [name, t] = a.list()[i];
    EXPECT_EQ(name, b.list()[i].first);
    EXPECT_EQ(t.to_vector<float>(), b.list()[i].second.to_vector<float>()) << name;
  }
}

void expect_io_error(const std::function<void()>& f, const std::string& names, const std::string& says) {
  try {
    f();
    ADD_FAILURE() << "expected an IoError naming " << names << " and saying " << says;
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(names), std::string::npos) << m;
    EXPECT_NE(m.find(says), std::string::npos) << m;
  }
}

}  // namespace

TEST(HfFolder, RoundTripsALlama) {
  TempDir dir;
  const std::string folder = dir.file("model");  // created by the writer
  models::Llama a(small_llama(), 1);
  save_hf_folder(folder, a.config().to_json(), a.params());

  const json config = json::parse(read_file(folder + "/config.json"));
  EXPECT_EQ(config["model_type"], "qwen2");
  EXPECT_EQ(config["architectures"], json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(config["hidden_act"], "silu");
  EXPECT_EQ(config["num_key_value_heads"], 1);
  EXPECT_EQ(load_safetensors(folder + "/model.safetensors").metadata.at("format"), "pt");

  Checkpoint ckpt = load_checkpoint(folder);
  EXPECT_EQ(ckpt.architecture, "llama");
  EXPECT_FALSE(ckpt.has_position);
  models::Llama b(models::llama_config_from_checkpoint(ckpt), 2);
  EXPECT_EQ(b.config().to_json(), a.config().to_json());
  load_params(ckpt, b.params());
  expect_same_params(a.params(), b.params());
}

// Shards as Hugging Face writes them: the index maps each tensor to its
// file; tensors the model does not use (an old rotary inv_freq) are ignored.
TEST(HfFolder, ReadsShardsThroughTheirIndex) {
  TempDir dir;
  models::Llama a(small_llama(), 3);
  const auto params = a.params().list();
  std::vector<std::pair<std::string, Tensor>> first(params.begin(), params.begin() + 5),
      second(params.begin() + 5, params.end());
  second.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", Tensor::zeros(DType::f32, {3}));
  json map = json::object();
  for (const auto& [name, t] : first) map[name] = "model-00001-of-00002.safetensors";
  for (const auto& [name, t] : second) map[name] = "model-00002-of-00002.safetensors";
  save_safetensors(dir.file("model-00001-of-00002.safetensors"), first);
  save_safetensors(dir.file("model-00002-of-00002.safetensors"), second);
  write_file_atomic(dir.file("model.safetensors.index.json"),
                    json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump());
  write_file_atomic(dir.file("config.json"), a.config().to_json());

  Checkpoint ckpt = load_checkpoint(dir.path());
  models::Llama b(models::llama_config_from_checkpoint(ckpt), 4);
  load_params(ckpt, b.params());
  expect_same_params(a.params(), b.params());
}

// A multimodal Gemma 3 (Gemma3ForConditionalGeneration, as Gemma 3 4B/12B/27B
// are published): its text model's config is text_config, whose absent keys
// take Gemma3TextConfig's defaults, and its weights are model.language_model.*
// (transformers >= 4.52) or language_model.model.* (before), beside a vision
// tower that is not read (a shard of it alone is not even opened). PEFT
// adapters of a LoRA fine-tune are named as PEFT names the multimodal
// model's, and read back from either naming.
TEST(HfFolder, ReadsAMultimodalGemma3sTextModel) {
  const json text_config = {{"model_type", "gemma3_text"}, {"vocab_size", 23},        {"hidden_size", 16},
                            {"intermediate_size", 24},     {"num_hidden_layers", 2},  {"num_attention_heads", 2},
                            {"num_key_value_heads", 1},    {"head_dim", 8},           {"sliding_window", 4},
                            {"max_position_embeddings", 32}};
  const json outer = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                      {"model_type", "gemma3"},
                      {"text_config", text_config},
                      {"vision_config", {{"model_type", "siglip_vision_model"}, {"hidden_size", 8}}},
                      {"mm_tokens_per_image", 256}};
  const models::LlamaConfig c = models::LlamaConfig::from_json(outer.dump());
  EXPECT_TRUE(c.multimodal);
  EXPECT_EQ(c.model_type, "gemma3_text");
  // Gemma3TextConfig's defaults where text_config is silent.
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_local_base_freq, 1e4);
  EXPECT_EQ(c.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.layer_window(0), 4);
  // What is saved of it is the text model.
  EXPECT_EQ(json::parse(c.to_json())["architectures"], json::array({"Gemma3ForCausalLM"}));
  EXPECT_FALSE(models::LlamaConfig::from_json(c.to_json()).multimodal);

  models::Llama a(c, 3);
  TempDir dir;
  // transformers >= 4.52: one file, the vision tower under model.vision_tower.
  const std::string current = dir.file("current");
  std::filesystem::create_directories(current);
  std::vector<std::pair<std::string, Tensor>> tensors{
      {"model.vision_tower.vision_model.embeddings.patch_embedding.weight", Tensor::zeros(DType::f32, {8, 3, 2, 2})},
      {"model.multi_modal_projector.mm_input_projection_weight", Tensor::zeros(DType::f32, {8, 16})}};
  for (const auto& [name, t] : a.params().list()) {
    tensors.emplace_back("model.language_model." + name.substr(std::string("model.").size()), t);
  }
  save_safetensors(current + "/model.safetensors", tensors, {{"format", "pt"}});
  write_file_atomic(current + "/config.json", outer.dump());
  // Before: shards, the vision tower's alone (absent here: it is not opened).
  const std::string old = dir.file("old");
  std::filesystem::create_directories(old);
  json map = {{"vision_tower.vision_model.post_layernorm.weight", "model-00002-of-00002.safetensors"}};
  std::vector<std::pair<std::string, Tensor>> language;
  for (const auto& [name, t] : a.params().list()) {
    language.emplace_back("language_model." + name, t);
    map["language_model." + name] = "model-00001-of-00002.safetensors";
  }
  save_safetensors(old + "/model-00001-of-00002.safetensors", language);
  write_file_atomic(old + "/model.safetensors.index.json", json{{"weight_map", map}}.dump());
  write_file_atomic(old + "/config.json", outer.dump());
  for (const std::string& folder : {current, old}) {
    const Checkpoint ckpt = load_checkpoint(folder);
    EXPECT_EQ(ckpt.architecture, "llama");
    EXPECT_EQ(ckpt.file.tensors.size(), a.params().list().size()) << folder;
    const models::Llama b(ckpt);
    EXPECT_TRUE(b.config().multimodal);
    expect_same_params(a.params(), b.params());
  }

  // LoRA on it: the adapter under the multimodal model's PEFT names.
  models::FinetuneConfig settings;
  settings.lora = {.r = 2, .alpha = 4, .targets = {"q_proj", "down_proj"}};
  settings.batch = 1;
  settings.context = 8;
  const models::FinetuneSession session(current, settings);
  session.save(dir.file("adapter"));
  const Safetensors saved = load_safetensors(dir.file("adapter") + "/adapter_model.safetensors");
  ASSERT_EQ(saved.tensors.size(), 8u);
  for (const auto& [name, t] : saved.tensors) {
    EXPECT_TRUE(name.starts_with("base_model.model.model.language_model.layers.")) << name;
  }
  const models::PeftAdapter back = models::load_peft_adapter(dir.file("adapter"));
  for (const auto& [name, t] : back.weights.tensors) {
    EXPECT_TRUE(name.starts_with("base_model.model.model.layers.")) << name;
  }
  // transformers < 4.52's PEFT names read alike.
  std::vector<std::pair<std::string, Tensor>> renamed;
  for (const auto& [name, t] : saved.tensors) {
    const std::string layer = name.substr(std::string("base_model.model.model.language_model.").size());
    renamed.emplace_back("base_model.model.language_model.model." + layer, t);
  }
  save_safetensors(dir.file("adapter") + "/adapter_model.safetensors", renamed);
  models::Llama adapted(c, 3);
  models::attach_peft_adapter(adapted, dir.file("adapter"));
  EXPECT_EQ(adapted.adapter().list().size(), 8u);

  // Damaged: no text_config; two tensors that would load as one.
  json bare = outer;
  bare.erase("text_config");
  expect_io_error([&] { models::LlamaConfig::from_json(bare.dump()); }, "gemma3", "needs a \"text_config\" object");
  tensors.emplace_back("language_model.model.norm.weight", a.params().get("model.norm.weight"));
  save_safetensors(current + "/model.safetensors", tensors);
  expect_io_error([&] { load_checkpoint(current); }, "'language_model.model.norm.weight'", "both load as 'model.norm.weight'");
}

TEST(HfFolder, DamagedFoldersNameTheFileAndWhatWasExpected) {
  TempDir dir;
  const std::string d = dir.path();
  models::Llama m(small_llama(), 5);
  const std::string config = m.config().to_json();

  expect_io_error([&] { load_checkpoint(d); }, d, "has no config.json");
  write_file_atomic(d + "/config.json", "{\"model_type\": ");
  expect_io_error([&] { load_checkpoint(d); }, d + "/config.json", "not a JSON object");
  write_file_atomic(d + "/config.json", R"({"model_type": "gpt_neox"})");
  expect_io_error([&] { load_checkpoint(d); }, d + "/config.json", "model_type \"gpt_neox\" is not supported");
  write_file_atomic(d + "/config.json", config);
  expect_io_error([&] { load_checkpoint(d); }, d, "needs model.safetensors or model.safetensors.index.json");

  const std::string index = d + "/model.safetensors.index.json";
  write_file_atomic(index, R"({"metadata": {}})");
  expect_io_error([&] { load_checkpoint(d); }, index, "\"weight_map\"");
  write_file_atomic(index, R"({"weight_map": {"model.norm.weight": "../model.safetensors"}})");
  expect_io_error([&] { load_checkpoint(d); }, index, "expected a file name in the folder");
  write_file_atomic(index, R"({"weight_map": {"model.norm.weight": "shard.safetensors"}})");
  expect_io_error([&] { load_checkpoint(d); }, d + "/shard.safetensors", "cannot open");
  save_safetensors(d + "/shard.safetensors", {{"other", Tensor::zeros(DType::f32, {2})}});
  expect_io_error([&] { load_checkpoint(d); }, d + "/shard.safetensors", "no tensor 'model.norm.weight'");

  // A folder whose tensors do not fit its config loads nothing.
  save_safetensors(d + "/model.safetensors", {{"model.norm.weight", Tensor::zeros(DType::f32, {2})}});
  Checkpoint small = load_checkpoint(d);
  expect_io_error([&] { models::llama_config_from_checkpoint(small); }, d, "holds only 2 values");

  // Variants the model does not compute are refused by the config reader.
  for (const auto& [key, value, says] :
       {std::tuple{"hidden_act", json("gelu"), "hidden_act \"gelu\" is not supported"},
        std::tuple{"mlp_bias", json(true), "mlp_bias is not supported"},
        std::tuple{"rope_scaling", json{{"rope_type", "yarn"}, {"factor", 4.0}}, "type \"yarn\" is not supported"}}) {
    json c = json::parse(config);
    c[key] = value;
    EXPECT_THROW(
        {
          try {
            models::LlamaConfig::from_json(c.dump());
          } catch (const IoError& e) {
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
            throw;
          }
        },
        IoError);
  }
  EXPECT_THROW(save_hf_folder(dir.file("out"), "[1]", m.params()), UsageError);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
}
