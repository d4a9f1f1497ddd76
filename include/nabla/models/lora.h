// LoRA adapters as other tools read them: PEFT's adapter folder
// (adapter_config.json and adapter_model.safetensors, the format
// transformers, PEFT and vLLM load). See docs/formats.md.
#pragma once

#include <string>

#include "nabla/io.h"
#include "nabla/models/llama.h"
#include "nabla/nn.h"

namespace nabla::models {

struct PeftAdapter {
  std::string path;        // the folder
  nn::LoraConfig config;   // r, lora_alpha, lora_dropout, use_rslora, target_modules
  std::string base_model;  // base_model_name_or_path ("" when null)
  // PEFT's tensor names for a causal LM (base_model.model.model.layers.*),
  // f32; a multimodal Gemma 3's (base_model.model.model.language_model.layers.*,
  // or language_model.model.layers.* before transformers 4.52) read as those.
  Safetensors weights;
};

// Writes `dir`/adapter_config.json (peft_type LORA, task_type CAUSAL_LM,
// bias "none") and `dir`/adapter_model.safetensors (the adapter's
// parameters under their PEFT names), each atomically; the folder is
// created when missing. `multimodal`: the base is a multimodal Gemma 3
// (LlamaConfig::multimodal), so the names are its language model's.
void save_peft_adapter(const std::string& dir, const nn::LoraConfig& config, const nn::Params& adapter,
                       const std::string& base_model, bool multimodal = false);

// Reads a PEFT LoRA folder. IoError naming the file for a missing or
// damaged file, and for what nabla would not compute as PEFT does: another
// peft_type, biases, per-module rank or alpha patterns, modules_to_save,
// layers_to_transform, fan_in_fan_out, a regular expression for
// target_modules.
PeftAdapter load_peft_adapter(const std::string& dir);

// The adapter's weights into model.adapter() (the model built with
// add_lora(adapter.config)): every tensor present with its shape, and none
// the model lacks (IoError naming the first mismatch; nothing changed then).
void load_adapter_weights(const PeftAdapter& adapter, Llama& model);

// The PEFT folder `dir` read and put on `model` (add_lora with its
// settings, then its weights): what every command taking --adapter does.
PeftAdapter attach_peft_adapter(Llama& model, const std::string& dir);

}  // namespace nabla::models
