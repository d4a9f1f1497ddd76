// The `nabla` tool's subcommands. nabla.cpp parses the command line into these
// argument structs; each cmd_*.cpp runs one subcommand and returns its exit status.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nabla/gguf.h"
#include "nabla/optim.h"
#include "train_loop.h"

namespace nabla::cli {

// Exit statuses shared by all subcommands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // the command ran and found a problem
inline constexpr int kExitUsage = 2;   // bad command line

struct OpsArgs {
  bool markdown = false;  // print docs/ops.md instead of a terminal table
};
int run_ops(const OpsArgs& opt);

struct GradcheckArgs {
  std::vector<std::string> ops;      // empty: every registered op
  std::vector<int> threads;          // empty: 1, 2 and 4
  std::vector<std::string> layouts;  // empty: every layout
  std::string backend = "cpu";
  bool verbose = false;
};
int run_gradcheck(const GradcheckArgs& opt);

// The shared flags (learning rate, schedule, checkpoints, logs) are
// TrainLoopArgs' (train_loop.h); each command sets its own defaults.
struct TrainMlpArgs : TrainLoopArgs {
  TrainMlpArgs() {
    lr = 1e-2;
    weight_decay = 0;
    warmup = 0;
    threads = 1;
    log_every = 50;
  }
  int64_t steps = 2000;  // the schedule's length
  int batch = 128;
  int hidden = 64;
};
int run_train_mlp(const TrainMlpArgs& opt);

struct TrainVitArgs : TrainLoopArgs {
  TrainVitArgs() {
    lr = 2e-3;
    weight_decay = 0.05;
    warmup = 500;
    log_every = 50;
  }
  std::string preset = "fmnist";
  std::string dataset = "fashion-mnist";
  std::string data;  // "" = the dataset's default location
  int epochs = 36;
  int batch = 128;
  double drop_rate = -1;  // < 0: the preset's
  // Overrides of the preset's shape (0: keep).
  int patch_size = 0, embed_dim = 0, depth = 0, heads = 0;
  double mlp_ratio = 0;
  std::string pool;
  int crop_pad = -1;  // < 0: the dataset's (0 for Fashion-MNIST, 2 for CIFAR-10)
  bool resize = false;  // resize images to the model's size (vit-tiny on Fashion-MNIST)
  bool hflip = true;
  double erase_prob = 0.25;     // random erasing (timm / DeiT's default)
  double label_smoothing = 0.1;  // timm / DeiT's default
  int64_t train_subset = 0;  // 0: every training image
  int64_t test_subset = 0;
  int eval_batch = 500;
  int replicas = 0;  // data-parallel replicas (0: default_replicas)
  bool gradient_checkpointing = false;
};
int run_train_vit(const TrainVitArgs& opt);

// `nabla train gpt2` and `nabla train llama`: next-token language models on
// text, one command with the model's architecture chosen.
struct TrainLmArgs : TrainLoopArgs {
  explicit TrainLmArgs(std::string arch) : architecture(std::move(arch)) {
    lr = 1e-3;
    weight_decay = 0.1;
    warmup = 100;
    eval_every = 250;
    log_every = 25;
    preset = architecture == "llama" ? "llama-tiny-byte" : "gpt2-small-byte";
  }
  std::string architecture;  // gpt2 or llama
  std::string preset;
  std::string text;       // file or folder; "" = Debian's fortunes
  std::string tokenizer;  // "" = the preset's
  std::string vocab;      // GPT-2 vocabulary folder (encoder.json, vocab.bpe)
  int64_t steps = 2000;   // the schedule's length
  int batch = 8;
  int context = 0;  // 0: min(positions, 256)
  double dropout = -1;  // GPT-2's; < 0: the preset's
  // Overrides of the preset's shape (0: keep): n_layer / num_hidden_layers,
  // n_head / num_attention_heads, num_key_value_heads (Llama), n_embd /
  // hidden_size, n_positions / max_position_embeddings.
  int n_layer = 0, n_head = 0, kv_heads = 0, n_embd = 0, n_positions = 0;
  int eval_batches = 16;
  bool low_memory = false;       // keep small-factored weight gradients factored (TrainStep's low_memory)
  bool whole_gradients = false;  // --no-low-memory; neither: default_low_memory
  bool gradient_checkpointing = false;
  int replicas = 1;  // data-parallel replicas in the process, each a share of the batch on a thread of its own
};
int run_train_lm(const TrainLmArgs& opt);

// `nabla finetune`: LoRA (or full) fine-tuning of a Llama-family model on
// a JSONL dataset. --save and --resume are folders (PEFT's, or Hugging
// Face's with --full), each with nabla's training state beside the weights.
struct FinetuneArgs : TrainLoopArgs {
  FinetuneArgs() {
    lr = 2e-4;
    weight_decay = 0;
    warmup = 0;
    eval_every = 0;
    log_every = 10;
  }
  std::string base;      // HF folder, GGUF file or nabla checkpoint
  std::string data;      // JSONL
  std::string val_data;  // JSONL; "" = val_fraction of data
  double val_fraction = 0.05;
  std::string chat_template = "auto";  // a ChatTemplate's name; auto: the base's own, else chatml
  std::string tokenizer;               // "" = the base's (checkpoint_tokenizer)
  bool pad = false;                    // one example a row (default: packed)
  int epochs = 1;
  int batch = 4;
  int grad_accum = 1;
  int context = 0;  // 0: min(max_position_embeddings, 512)
  int lora_r = 8;
  double lora_alpha = 16;
  double lora_dropout = 0.05;
  std::vector<std::string> lora_targets;  // q, k, v, o, gate, up, down or their full names; empty: all seven
  bool rslora = false;
  bool dora = false;  // PEFT's use_dora
  bool full = false;
  bool gradient_checkpointing = false;
  int replicas = 1;  // data-parallel replicas in the process, each a share of the batch's rows
};
int run_finetune(const FinetuneArgs& opt);

struct SampleArgs {
  std::string checkpoint, prompt, vocab;
  std::string chat, system;             // a user message (and a system one) in the model's chat template
  std::string chat_template = "auto";  // a ChatTemplate's name; auto: the checkpoint's own, else chatml
  std::string tokenizer;  // "" = checkpoint_tokenizer
  std::string adapter;    // PEFT LoRA folder applied to a Llama ("" = none)
  bool timings = false;   // prompt and generation rates to stderr
  bool ignore_eos = false;  // run to `tokens`, past end_of_generation_ids
  int tokens = 200;
  double temperature = 0.8;
  int top_k = 40;
  double top_p = 1.0, min_p = 0.0;  // models::SamplingOptions'
  // Which of --temperature, --top-k, --top-p, --min-p the command line gave:
  // the others come from a folder's generation_config.json when it has one.
  std::vector<std::string> sampling_given;
  uint64_t seed = 1;
  int threads = 1;
  std::string backend = "cpu";  // which backend runs the decoding steps
};
int run_sample(const SampleArgs& opt);

struct EvalArgs {
  std::string checkpoint;
  std::string dataset = "fashion-mnist";
  std::string data;
  int batch = 500;
  int threads = 0;
};
int run_eval(const EvalArgs& opt);

struct GradArgs {
  std::string weights, batch, out;
  std::string adapter;  // PEFT LoRA folder: the adapter's gradients instead of the model's
  int threads = 0;
  std::string backend = "cpu";
  // After the gradient: this many AdamW steps on the same batch at a constant
  // lr, writing the loss before each as `losses` (0: none).
  int adamw_steps = 0;
  double lr = 1e-4;
  double clip = 0;           // gradient clipping by global norm (0: off)
  optim::AdamWConfig adamw;  // betas, eps and weight decay: the optimizer's defaults
};
int run_grad(const GradArgs& opt);

struct ExportArgs {
  std::string checkpoint, out;
  std::string vocab;  // GPT-2 vocabulary folder for gpt2-tokenizer checkpoints ("" = found)
  GgmlType type = GgmlType::f32;  // GGUF: Llama's weight matrices
  std::string tokenizer;          // "" = checkpoint_tokenizer
  std::string adapter;            // a PEFT LoRA folder merged into the weights ("" = none)
};
int run_export_gguf(const ExportArgs& opt);
int run_export_hf(const ExportArgs& opt);
// `nabla export lora-gguf ADAPTER --base MODEL -o F`: llama.cpp's adapter GGUF.
int run_export_lora_gguf(const ExportArgs& opt);

}  // namespace nabla::cli
