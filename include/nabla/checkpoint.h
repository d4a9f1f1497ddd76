// Checkpoints are safetensors files. Model weights use the names of the
// model's reference implementation (timm, Hugging Face), so the files load
// there; the metadata holds the model config as JSON under "nabla.config"
// and, for training checkpoints, the optimizer moments as tensors plus the
// training position under "nabla.train".
//
// A Hugging Face model folder reads as a checkpoint too: config.json is its
// config, its weights come from model.safetensors or from the shards that
// model.safetensors.index.json lists.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nabla/error.h"
#include "nabla/io.h"
#include "nabla/nn.h"
#include "nabla/optim.h"

namespace nabla {

// Where a training run stands: enough, with the weights and optimizer
// moments, to continue it bit-identically.
struct TrainPosition {
  int64_t step = 0;   // optimizer steps taken
  int64_t epoch = 0;  // current epoch
  int64_t batch = 0;  // batches of `epoch` already used
  uint64_t seed = 0;  // run seed (data order, augmentation, dropout)
  std::string to_json() const;
  static TrainPosition from_json(const std::string& json, const std::string& file);
};

void save_checkpoint(const std::string& path, const std::string& config_json, const nn::Params& params,
                     const optim::AdamW* optimizer = nullptr, const TrainPosition* position = nullptr);

struct Checkpoint {
  std::string path;
  std::string config_json;
  // "vit", "gpt2", "llama", ...: the config's "architecture", or for a
  // Hugging Face folder the one its model_type maps to ("" when neither).
  std::string architecture;
  Safetensors file;  // a folder's shards merged
  // Tensors of `file` kept in a storage type (u8 rows; read with keep_stored
  // or keep_half).
  std::vector<std::pair<std::string, nn::StoredFormat>> formats;
  bool has_position = false;
  TrainPosition position;
};
// A nabla checkpoint file, or a Hugging Face model folder of a model_type
// the Llama family reads (tensors F32, F16 or BF16, loaded as f32; a folder's
// F16 or BF16 matrices whose names keep_half accepts stay so, listed in
// `formats`; a multimodal Gemma 3's text model under the text model's
// names, its vision tower unread). IoError naming the file when it is
// neither, or is damaged.
Checkpoint load_checkpoint(const std::string& path, const std::function<bool(const std::string&)>& keep_half = {});

// Writes a Hugging Face model folder: `config_json` (an object) as
// config.json and `params` as model.safetensors, each written atomically;
// the folder is created when missing. Tensors are stored as they are (f32).
void save_hf_folder(const std::string& dir, const std::string& config_json, const nn::Params& params);

// The checkpoint's tensors as the source of a model's parameters
// (Params::take_from): no copy is made.
nn::WeightSource weight_source(const Checkpoint& ckpt);

// Copies the checkpoint's tensors into `params` by name; every parameter
// must be present with its shape and dtype (IoError naming the first
// mismatch, with no parameter changed).
void load_params(const Checkpoint& ckpt, nn::Params& params);

// Restores the optimizer moments a training checkpoint holds (IoError naming
// the file when one is missing or mis-shaped, with no moment changed).
void load_optimizer_state(const Checkpoint& ckpt, optim::AdamW& optimizer);

// IoError naming the file when it holds fewer values in all than a model of
// `parameters` elements needs. Checked before building the model a config
// describes, so a damaged config cannot make it allocate without bound.
void check_holds_parameters(const Checkpoint& ckpt, int64_t parameters);

// A model's config read from its checkpoint (Config::from_json, then
// check_holds_parameters): any error becomes an IoError naming the file.
template <class Config>
Config config_from_checkpoint(const Checkpoint& ckpt) {
  Config c;
  try {
    c = Config::from_json(ckpt.config_json);
  } catch (const Error& e) {
    throw IoError(ckpt.path + ": " + e.what());
  }
  check_holds_parameters(ckpt, c.parameter_count());
  return c;
}

}  // namespace nabla
