#include "nabla/checkpoint.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "nabla/config.h"
#include "nabla/error.h"
#include "nabla/gguf.h"

namespace nabla {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string architecture_of(const std::string& config_json) {
  json j = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  auto it = j.is_object() ? j.find("architecture") : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// The tensors a model.safetensors.index.json lists, read shard by shard:
// the index is the authority on which tensor lives where.
Safetensors load_shards(const std::string& dir, const std::string& index_path,
                        const std::function<bool(const std::string&)>& keep_half, const TensorRename& rename) {
  json index = json::parse(read_file(index_path), nullptr, /*allow_exceptions=*/false);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw IoError(index_path + ": expected a JSON object with a \"weight_map\" of tensor name -> shard file");
  }
  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    const std::string shard = it.value().is_string() ? it.value().get<std::string>() : "";
    // A plain file name: an index must not reach outside its folder.
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos) {
      throw IoError(index_path + ": weight_map[\"" + it.key() + "\"] is " + it.value().dump() +
                    ", expected a file name in the folder");
    }
    names_by_shard[shard].push_back(it.key());
  }
  if (names_by_shard.empty()) throw IoError(index_path + ": the weight_map lists no tensors");
  Safetensors merged;
  std::map<std::string, std::string> loaded_as;  // loaded name -> its name in the index
  for (const auto& [shard, names] : names_by_shard) {
    std::vector<std::pair<std::string, std::string>> read;  // (index name, loaded name)
    for (const std::string& name : names) {
      const std::string as = rename ? rename(name) : name;
      if (as.empty()) continue;
      if (auto [it, fresh] = loaded_as.emplace(as, name); !fresh) {
        throw IoError(index_path + ": tensors '" + it->second + "' and '" + name + "' both load as '" + as + "'");
      }
      read.emplace_back(name, as);
    }
    if (read.empty()) continue;  // a shard of tensors left unread is not opened
    const std::string path = dir + "/" + shard;
    Safetensors s = load_safetensors(path, keep_half, rename);
    if (merged.metadata.empty()) merged.metadata = s.metadata;
    for (const auto& [name, as] : read) {
      const Tensor* t = s.find(as);
      if (!t) throw IoError(path + ": no tensor '" + name + "', which " + index_path + " places there");
      merged.tensors.emplace_back(as, *t);
      if (auto h = s.half.find(as); h != s.half.end()) merged.half[as] = h->second;
    }
  }
  return merged;
}

// config.json's model_type -> the nabla architecture that reads it.
std::string hf_architecture(const std::string& config_path, const std::string& config_json) {
  // gemma3: a multimodal Gemma 3, whose text model is read.
  static const char* const llama_types[] = {"llama",  "mistral", "qwen2",       "qwen3", "smollm3",
                                            "gemma2", "gemma3_text", "gemma3", "phi3"};
  static const std::string read = "nabla reads \"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"smollm3\", "
                                  "\"gemma2\", \"gemma3_text\", \"gemma3\" and \"phi3\" models";
  json j = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw IoError(config_path + ": not a JSON object");
  auto type = j.find("model_type");
  if (type == j.end() || !type->is_string()) throw IoError(config_path + ": no string \"model_type\" (" + read + ")");
  const std::string t = type->get<std::string>();
  for (const char* llama : llama_types) {
    if (t == llama) return "llama";
  }
  throw IoError(config_path + ": model_type \"" + t + "\" is not supported (" + read + ")");
}

// A multimodal Gemma 3 (Gemma3ForConditionalGeneration) holds its text model
// under model.language_model.* (language_model.model.* before transformers
// 4.52) and the head under lm_head.* (language_model.lm_head.*): those load
// under the text model's names (model.*, lm_head.*); the vision tower and
// its projector are not read.
std::string gemma3_text_model_name(const std::string& name) {
  for (const auto& [from, to] : {std::pair{"model.language_model.", "model."}, {"language_model.model.", "model."},
                                 {"language_model.lm_head.", "lm_head."}, {"lm_head.", "lm_head."}}) {
    if (name.starts_with(from)) return to + name.substr(std::string_view(from).size());
  }
  return "";
}

Checkpoint load_hf_folder(const std::string& dir, const std::function<bool(const std::string&)>& keep_half) {
  Checkpoint c;
  c.path = dir;
  const std::string config_path = dir + "/config.json";
  std::error_code ec;
  if (!fs::is_regular_file(config_path, ec)) {
    throw IoError(dir + ": not a Hugging Face model folder: it has no config.json");
  }
  c.config_json = read_file(config_path);
  c.architecture = hf_architecture(config_path, c.config_json);
  const TensorRename rename =
      json::parse(c.config_json).value("model_type", "") == "gemma3" ? TensorRename(gemma3_text_model_name) : nullptr;
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  // Hugging Face's loader looks for the single file first, so does this.
  if (fs::exists(single, ec)) {
    c.file = load_safetensors(single, keep_half, rename);
  } else if (fs::exists(index, ec)) {
    c.file = load_shards(dir, index, keep_half, rename);
  } else {
    throw IoError(dir + ": a Hugging Face model folder needs model.safetensors or model.safetensors.index.json");
  }
  for (const auto& [name, dtype] : c.file.half) {
    c.formats.emplace_back(name, nn::StoredFormat{dtype == "F16" ? GgmlType::f16 : GgmlType::bf16,
                                                  c.file.at(name).dim(1) / 2});
  }
  return c;
}

ConfigFields position_fields(TrainPosition& p, const std::string& what) {
  ConfigFields f(what);
  f.required("step", p.step, 0).required("epoch", p.epoch, 0).required("batch", p.batch, 0).required("seed", p.seed);
  return f;
}

}  // namespace

std::string TrainPosition::to_json() const {
  TrainPosition p = *this;
  return position_fields(p, "nabla.train").to_json();
}

TrainPosition TrainPosition::from_json(const std::string& text, const std::string& file) {
  TrainPosition p;
  position_fields(p, file + ": bad nabla.train metadata").from_json(text);
  return p;
}

void save_checkpoint(const std::string& path, const std::string& config_json, const nn::Params& params,
                     const optim::AdamW* optimizer, const TrainPosition* position) {
  std::vector<std::pair<std::string, Tensor>> tensors = params.list();
  // "format": "pt" is what Hugging Face's loaders look for.
  std::map<std::string, std::string> meta{{"format", "pt"}, {"nabla.config", config_json}};
  if (optimizer) {
    for (auto& kv : optimizer->state()) tensors.push_back(kv);
    meta["nabla.optimizer"] = "adamw:" + std::to_string(optimizer->steps());
  }
  if (position) meta["nabla.train"] = position->to_json();
  save_safetensors(path, tensors, meta);
}

Checkpoint load_checkpoint(const std::string& path, const std::function<bool(const std::string&)>& keep_half) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return load_hf_folder(path, keep_half);
  Checkpoint c;
  c.path = path;
  c.file = load_safetensors(path);
  auto it = c.file.metadata.find("nabla.config");
  if (it == c.file.metadata.end()) {
    throw IoError(path + ": not a nabla checkpoint: no \"nabla.config\" in the safetensors metadata "
                  "(for a Hugging Face model, give its folder)");
  }
  c.config_json = it->second;
  c.architecture = architecture_of(c.config_json);
  auto pos = c.file.metadata.find("nabla.train");
  if (pos != c.file.metadata.end()) {
    c.has_position = true;
    c.position = TrainPosition::from_json(pos->second, path);
  }
  return c;
}

void save_hf_folder(const std::string& dir, const std::string& config_json, const nn::Params& params) {
  json config = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) throw UsageError(dir + ": the config.json to write is not a JSON object");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(dir + ": cannot create the folder: " + ec.message());
  save_safetensors(dir + "/model.safetensors", params.list(), {{"format", "pt"}});
  write_file_atomic(dir + "/config.json", config.dump(2) + "\n");
}

nn::WeightSource weight_source(const Checkpoint& ckpt) { return {ckpt.path, ckpt.file.tensors, ckpt.formats}; }

void load_params(const Checkpoint& ckpt, nn::Params& params) {
  // Every parameter is checked before any is written: a mismatch leaves the
  // model as it was, not half loaded.
  const std::vector<std::pair<std::string, Tensor>> list = params.list();
  std::vector<const Tensor*> found;
  found.reserve(list.size());
  for (const auto& [name, p] : list) {
    const Tensor* t = ckpt.file.find(name);
    if (!t) throw IoError(ckpt.path + ": missing parameter '" + name + "'");
    if (t->shape() != p.shape()) {
      throw IoError(ckpt.path + ": parameter '" + name + "' is " + to_string(t->shape()) + ", the model expects " +
                    to_string(p.shape()));
    }
    if (t->dtype() != p.dtype()) {
      throw IoError(ckpt.path + ": parameter '" + name + "' is " + dtype_name(t->dtype()) + ", expected " +
                    dtype_name(p.dtype()));
    }
    found.push_back(t);
  }
  for (size_t i = 0; i < list.size(); ++i) {
    Tensor dst = list[i].second;
    dst.copy_from(found[i]->data(), size_t(found[i]->numel()) * dtype_size(found[i]->dtype()));
  }
}

void load_optimizer_state(const Checkpoint& ckpt, optim::AdamW& optimizer) {
  try {
    optimizer.load_state(ckpt.file.tensors, ckpt.position.step);
  } catch (const IoError& e) {
    throw IoError(ckpt.path + ": " + e.what());
  }
}

void check_holds_parameters(const Checkpoint& ckpt, int64_t parameters) {
  int64_t values = 0;
  for (const auto& [name, t] : ckpt.file.tensors) values += t.numel();
  for (const auto& [name, f] : ckpt.formats) {
    const Tensor* t = ckpt.file.find(name);
    if (t && t->rank() == 2) values += t->dim(0) * f.cols - t->numel();  // elements, not bytes
  }
  if (parameters > values) {
    throw IoError(ckpt.path + ": its config describes a model of " + std::to_string(parameters) +
                  " parameters, but the file holds only " + std::to_string(values) + " values");
  }
}

}  // namespace nabla
