// PEFT's LoRA adapter folders. adapter_config.json's keys are PEFT's
// LoraConfig fields; the weights are "base_model.model.<module>.lora_A.weight"
// [r, in] and ".lora_B.weight" [out, r] (PEFT's names with the adapter's own
// name, "default", left out, as save_pretrained writes them).
#include "nabla/models/lora.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "nabla/checkpoint.h"
#include "nabla/error.h"

namespace nabla::models {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kConfigFile = "adapter_config.json";
const char* kWeightsFile = "adapter_model.safetensors";

// PEFT's prefix of a causal LM's layers, and of a multimodal Gemma 3's
// language model (transformers >= 4.52, then before).
const std::string kCausalLm = "base_model.model.model.";
const std::string kLanguageModel = "base_model.model.model.language_model.";
const std::string kOldLanguageModel = "base_model.model.language_model.model.";

}  // namespace

void save_peft_adapter(const std::string& dir, const nn::LoraConfig& config, const nn::Params& adapter,
                       const std::string& base_model, bool multimodal) {
  config.validate();
  json j = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"r", config.r},
            {"lora_alpha", config.alpha},
            {"lora_dropout", config.dropout},
            {"target_modules", config.targets},
            {"use_rslora", config.rslora},
            {"use_dora", config.dora},
            {"bias", "none"},
            {"fan_in_fan_out", false},
            {"init_lora_weights", true},
            {"inference_mode", true},
            {"modules_to_save", nullptr},
            {"layers_to_transform", nullptr},
            {"rank_pattern", json::object()},
            {"alpha_pattern", json::object()},
            {"base_model_name_or_path", base_model.empty() ? json(nullptr) : json(base_model)}};
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(dir + ": cannot create the folder: " + ec.message());
  std::vector<std::pair<std::string, Tensor>> tensors = adapter.list();
  for (auto& [name, t] : tensors) {
    if (multimodal && name.starts_with(kCausalLm)) name = kLanguageModel + name.substr(kCausalLm.size());
  }
  save_safetensors(dir + "/" + kWeightsFile, tensors, {{"format", "pt"}});
  write_file_atomic(dir + "/" + kConfigFile, j.dump(2) + "\n");
}

PeftAdapter load_peft_adapter(const std::string& dir) {
  const std::string config_path = dir + "/" + kConfigFile;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw IoError(dir + ": not a folder (expected a PEFT adapter folder)");
  const json j = json::parse(read_file(config_path), nullptr, /*allow_exceptions=*/false);
  auto fail = [&](const std::string& what) { throw IoError(config_path + ": " + what); };
  if (!j.is_object()) fail("not a JSON object");
  // Fields that would make PEFT compute something nabla does not.
  auto absent_or = [&](const char* key, auto&& ok) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() || ok(*it);
  };
  const std::string type = j.value("peft_type", "");
  if (type != "LORA") fail("peft_type is \"" + type + "\", expected \"LORA\"");
  if (!absent_or("bias", [](const json& v) { return v == "none"; })) fail("bias must be \"none\"");
  if (!absent_or("fan_in_fan_out", [](const json& v) { return v == false; })) fail("fan_in_fan_out is not supported");
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (!absent_or(key, [](const json& v) { return v.is_object() && v.empty(); })) {
      fail(std::string(key) + " is not supported (one r and alpha for every module)");
    }
  }
  for (const char* key : {"modules_to_save", "layers_to_transform", "layers_pattern"}) {
    if (!absent_or(key, [](const json& v) { return v.is_array() && v.empty(); })) {
      fail(std::string(key) + " is not supported");
    }
  }
  PeftAdapter a;
  a.path = dir;
  auto number = [&](const char* key, bool required) -> double {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) fail(std::string("no \"") + key + "\"");
      return 0;
    }
    if (!it->is_number()) fail(std::string("\"") + key + "\" must be a number");
    return it->get<double>();
  };
  const double r = number("r", true);
  if (r != double(int64_t(r)) || r < 1 || r > 65536) fail("r must be a whole number in [1, 65536]");
  a.config.r = int64_t(r);
  a.config.alpha = j.contains("lora_alpha") ? number("lora_alpha", true) : 8;  // PEFT's default
  a.config.dropout = number("lora_dropout", false);
  const json rs = j.value("use_rslora", json(false));
  if (!rs.is_boolean()) fail("\"use_rslora\" must be true or false");
  a.config.rslora = rs.get<bool>();
  const json dora = j.value("use_dora", json(false));
  if (!dora.is_boolean() && !dora.is_null()) fail("\"use_dora\" must be true or false");
  a.config.dora = dora.is_boolean() && dora.get<bool>();
  const json targets = j.value("target_modules", json());
  if (!targets.is_array()) {
    fail("target_modules must be a list of module names (a regular expression is not supported)");
  }
  for (const json& t : targets) {
    if (!t.is_string()) fail("target_modules must be a list of module names");
    a.config.targets.push_back(t.get<std::string>());
  }
  const json base = j.value("base_model_name_or_path", json());
  if (base.is_string()) a.base_model = base.get<std::string>();
  try {
    a.config.validate();
  } catch (const UsageError& e) {
    fail(e.what());
  }
  a.weights = load_safetensors(dir + "/" + kWeightsFile, {}, [](const std::string& name) {
    for (const std::string* multimodal : {&kLanguageModel, &kOldLanguageModel}) {
      if (name.starts_with(*multimodal)) return kCausalLm + name.substr(multimodal->size());
    }
    return name;
  });
  return a;
}

void load_adapter_weights(const PeftAdapter& adapter, Llama& model) {
  const std::string file = adapter.path + "/" + kWeightsFile;
  const nn::Params& params = model.adapter();
  for (const auto& [name, _] : adapter.weights.tensors) {
    bool known = false;
    for (const auto& [n, t] : params.list()) known = known || n == name;
    if (!known) throw IoError(file + ": tensor '" + name + "' belongs to no adapter of the model");
  }
  Checkpoint c;
  c.path = file;
  c.file = adapter.weights;
  load_params(c, model.adapter());
}

PeftAdapter attach_peft_adapter(Llama& model, const std::string& dir) {
  PeftAdapter adapter = load_peft_adapter(dir);
  model.add_lora(adapter.config, 0);
  load_adapter_weights(adapter, model);
  return adapter;
}

}  // namespace nabla::models
