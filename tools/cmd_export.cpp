// `nabla export gguf`: a checkpoint's weights as a GGUF file (ggml's
// format). The mapping of each architecture (tensor names, transposes,
// metadata keys, GPT-2's tokenizer) lives in models/gguf_export.h.
// `nabla export hf`: a Llama checkpoint as a Hugging Face model folder.
// Both read nabla checkpoints, Hugging Face folders and llama.cpp GGUF files,
// and with --adapter write the model with a PEFT LoRA adapter merged in.
// `nabla export lora-gguf`: a PEFT adapter as llama.cpp's adapter GGUF.
#include <fmt/format.h>

#include "cmd_tokenize.h"
#include "commands.h"
#include "nabla/models/gguf.h"
#include "nabla/models/llama.h"
#include "nabla/models/lora.h"
#include "nabla/checkpoint.h"
#include "nabla/io.h"
#include "nabla/tokenizer.h"

namespace nabla::cli {

namespace {

// A Llama checkpoint with `adapter_dir`'s adapter folded into its weights,
// held in memory under the original's path (whose tokenizer it keeps).
Checkpoint merged(const Checkpoint& ckpt, const std::string& adapter_dir) {
  if (ckpt.architecture != "llama") {
    throw UsageError("export: --adapter takes a Llama-family model; " + ckpt.path + " is \"" + ckpt.architecture +
                     "\"");
  }
  const models::LlamaConfig cfg = models::llama_config_from_checkpoint(ckpt);
  models::Llama model(cfg, 0);
  load_params(ckpt, model.params());
  models::attach_peft_adapter(model, adapter_dir);
  model.merge_lora();
  Checkpoint out;
  out.path = ckpt.path;
  out.config_json = cfg.to_json();
  out.architecture = "llama";
  out.file.tensors = model.params().list();
  return out;
}

}  // namespace

int run_export_gguf(const ExportArgs& a) {
  Checkpoint ckpt = models::load_any_checkpoint(a.checkpoint);
  if (!a.adapter.empty()) ckpt = merged(ckpt, a.adapter);
  GgufWriter w = models::gguf_from_checkpoint(
      ckpt, {.vocab_dir = a.vocab, .matrix_type = a.type, .tokenizer = a.tokenizer});
  w.write(a.out);
  fmt::print("wrote {} ({} architecture)\n", a.out, ckpt.architecture);
  return kExitOk;
}

int run_export_hf(const ExportArgs& a) {
  Checkpoint ckpt = models::load_any_checkpoint(a.checkpoint);
  if (!a.adapter.empty()) ckpt = merged(ckpt, a.adapter);
  if (ckpt.architecture != "llama") {
    throw UsageError(a.checkpoint + ": Hugging Face folders are written for llama checkpoints, this one is \"" +
                     ckpt.architecture + "\"");
  }
  // Built from its config, so that only the model's parameters (not the
  // optimizer moments a training checkpoint holds) are written, checked.
  models::LlamaConfig cfg = models::llama_config_from_checkpoint(ckpt);
  models::Llama model(cfg, 0);
  load_params(ckpt, model.params());
  const std::string tokenizer =
      a.tokenizer.empty() ? models::checkpoint_tokenizer(a.checkpoint, cfg.tokenizer) : a.tokenizer;
  const std::vector<std::string> written = models::save_llama_folder(
      a.out, cfg, model.params(), tokenizer, models::checkpoint_chat_template(a.checkpoint), a.vocab);
  fmt::print("wrote {}/{} ({} parameters)\n", a.out, fmt::join(written, ", "), model.params().count());
  return kExitOk;
}

int run_export_lora_gguf(const ExportArgs& a) {
  const Checkpoint base = models::load_any_checkpoint(a.checkpoint);
  if (base.architecture != "llama") {
    throw UsageError("export lora-gguf: the base must be a Llama-family model; " + base.path + " is \"" +
                     base.architecture + "\"");
  }
  const models::LlamaConfig cfg = models::llama_config_from_checkpoint(base);
  // The adapter must fit this base: the model with it built and loaded.
  models::Llama model(cfg, 0);
  const models::PeftAdapter adapter = models::attach_peft_adapter(model, a.adapter);
  models::gguf_lora_adapter(cfg, adapter).write(a.out);
  fmt::print("wrote {} (LoRA r {}, alpha {}, {} tensors, for {})\n", a.out, adapter.config.r, adapter.config.alpha,
             adapter.weights.tensors.size(), a.checkpoint);
  return kExitOk;
}

}  // namespace nabla::cli
