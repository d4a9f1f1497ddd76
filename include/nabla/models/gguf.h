// nabla checkpoints as GGUF files and llama.cpp's Llama-family GGUF files as
// checkpoints (ggml's format; see docs/formats.md).
//
//   ViT   general.architecture "vit": timm tensor names, nabla's own vit.* keys.
//   GPT-2 general.architecture "gpt2", laid out as llama.cpp's gpt2 loader
//         expects (llama.cpp src/models/gpt2.cpp, gguf-py constants.py,
//         convert_hf_to_gguf.py GPT2Model): llama.cpp tensor names, the
//         Conv1D weights transposed to Linear layout, gpt2.* keys, and the
//         tokenizer as tokenizer.ggml.* (model "gpt2", pre-tokenizer "gpt-2").
//   Llama general.architecture "llama" (or "qwen2" for model_type qwen2), as
//         llama.cpp's loaders expect: llama.cpp tensor names, q/k rows
//         interleaved per head for llama's rope (convert_hf_to_gguf.py's
//         permute), Llama 3's rope scaling as rope_freqs.weight, the
//         tokenizer as for GPT-2.
#pragma once

#include <string>
#include <vector>

#include "nabla/checkpoint.h"
#include "nabla/gguf.h"
#include "nabla/models/llama.h"
#include "nabla/models/lora.h"
#include "nabla/tokenizer.h"

namespace nabla::models {

struct GgufExportOptions {
  // GPT-2 checkpoints with the "gpt2" tokenizer: the folder holding
  // encoder.json and vocab.bpe; "" = find_gpt2_vocab().
  std::string vocab_dir;
  // How Llama's weight matrices (embedding, projections, head) are stored:
  // F32, F16, BF16, Q8_0, Q4_0, Q4_K or Q6_K; a matrix whose rows are not a
  // whole number of the type's blocks stays F32, as do norms and biases.
  GgmlType matrix_type = GgmlType::f32;
  // The tokenizer written as tokenizer.ggml.*, as make_tokenizer names it
  // (a tokenizer.json, a GGUF model, "byte", "gpt2"); "" = the checkpoint's
  // (checkpoint_tokenizer).
  std::string tokenizer;
};

// The metadata and tensors of `ckpt` as a GGUF writer, ready to write().
// Errors name the checkpoint file: UsageError for an architecture without a
// GGUF mapping or a GPT-2 that llama.cpp would compute differently (a GELU
// other than the tanh approximation); IoError for a missing or inconsistent
// GPT-2 vocabulary.
GgufWriter gguf_from_checkpoint(const Checkpoint& ckpt, const GgufExportOptions& options = {});

// A PEFT LoRA adapter of a Llama-family model as llama.cpp's adapter GGUF
// (convert_lora_to_gguf.py's layout): general.type "adapter", adapter.type
// "lora", adapter.lora.alpha (scaled by sqrt(r) for rsLoRA, since llama.cpp
// scales by alpha / r), and per adapted weight "<GGUF name>.lora_a" (A [r,
// in]) and ".lora_b" (B [out, r], its q/k rows interleaved as the base's
// are for llama). The architecture keys are the base's. UsageError naming
// the adapter for a module llama.cpp has no tensor for, and for DoRA.
GgufWriter gguf_lora_adapter(const LlamaConfig& base, const PeftAdapter& adapter);

// A llama.cpp GGUF of architecture "llama" or "qwen2" as a Llama checkpoint
// (architecture "llama", Hugging Face names): the config from its llama.* /
// qwen2.* keys, llama's q/k rows back in rotate-half order, rope_freqs.weight
// as Llama 3's rope_scaling, every tensor dequantized to f32. IoError naming
// the file for another architecture, missing keys or tensors, or scaling it
// cannot express. With keep_stored, the weight matrices (projections,
// embedding, head) stored as F16, BF16 or a block format stay so (u8,
// listed in `formats`): a quantized base under adapters, in about its file's
// size. Norms and biases are f32 either way.
Checkpoint checkpoint_from_gguf(const std::string& path, bool keep_stored = false);

// load_checkpoint, or checkpoint_from_gguf for a file that starts with
// GGUF's magic: what the `nabla` commands read. keep_stored: the weight
// matrices stay in their storage type, a GGUF's (checkpoint_from_gguf) or a
// Hugging Face folder's F16 / BF16.
Checkpoint load_any_checkpoint(const std::string& path, bool keep_stored = false);

// The tokenizer that comes with the weights at `path`, as make_tokenizer
// names it: a GGUF file's own (when it has tokenizer.ggml.*), a Hugging Face
// folder's tokenizer.json (when there is one); otherwise `configured`, the
// tokenizer the checkpoint's config names, a relative file name read beside
// the checkpoint (`nabla train` writes its tokenizer there).
std::string checkpoint_tokenizer(const std::string& path, const std::string& configured);

// The Jinja chat template that comes with the weights at `path`, or "": a
// GGUF's tokenizer.chat_template; a Hugging Face folder's
// chat_template.jinja (transformers' file since 4.47), else its
// tokenizer_config.json's "chat_template" (a string, or a list of named
// templates of which "default" is the one).
std::string checkpoint_chat_template(const std::string& path);

// `tok`, read from `source` (a make_tokenizer name), as the tokenizer.json
// `target`: a tokenizer.json file copied byte for byte (its decoder and
// settings kept), GPT-2's files or a GGUF model's vocabulary written out.
void write_tokenizer_json(const std::string& source, const BpeTokenizer& tok, const std::string& target);

// A Llama as a Hugging Face folder that stands alone (transformers and
// llama.cpp's converter read it; it needs nothing beside it): config.json
// and model.safetensors, the tokenizer (a make_tokenizer name; `vocab`:
// GPT-2's files) as tokenizer.json where it is BPE (a "byte" model gets none:
// Hugging Face has no such tokenizer.json), and chat_template.jinja when
// `chat_template` is not empty. Returns the names of the files written.
// UsageError for a tokenizer that is neither byte nor BPE.
std::vector<std::string> save_llama_folder(const std::string& dir, const LlamaConfig& config, const nn::Params& params,
                                           const std::string& tokenizer, const std::string& chat_template,
                                           const std::string& vocab = "");

}  // namespace nabla::models
