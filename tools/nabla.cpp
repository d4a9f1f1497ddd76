// The `nabla` command-line tool: parses arguments with CLI11 and runs one
// subcommand (commands.h). Bad command lines exit with status 2 and a
// one-line message, and so do errors in data, files or options.
#include <map>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <string>

#include "cmd_tokenize.h"
#include "commands.h"
#include "core/op.h"
#include "core/op_check.h"
#include "nabla/distributed.h"
#include "nabla/error.h"
#include "nabla/finetune_data.h"
#include "nabla/gguf.h"

namespace {

// --chat-template's choices: auto, then every template nabla renders.
std::vector<std::string> chat_template_choices() {
  std::vector<std::string> names = nabla::chat_template_names();
  names.insert(names.begin(), "auto");
  return names;
}

using namespace nabla::cli;

// The job this process is a rank of, when a launcher (mpirun) started
// several; null for one process.
std::unique_ptr<nabla::dist::Communicator> join_job() {
  std::unique_ptr<nabla::dist::Communicator> job = nabla::dist::join_launched_job();
  if (job && job->size() == 1) return nullptr;
  return job;
}

// Accepts registered op names only; the error lists them all.
CLI::Validator registered_op() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        if (nabla::find_op(name)) return "";
        std::string valid;
        for (const nabla::OpDef* op : nabla::all_ops())
          valid += (valid.empty() ? "" : ", ") + std::string(op->name);
        return "unknown op '" + name + "'; registered ops: " + valid;
      },
      "OP");
}

// A backend this build has and that can run here ("cuda" without a GPU:
// why not).
CLI::Validator backend_name() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        std::string valid;
        for (const std::string& b : nabla::backend_names()) {
          if (name != b) {
            valid += (valid.empty() ? "" : ", ") + b;
            continue;
          }
          // "backend: cuda: no CUDA device (...)", after CLI11's "--backend: ".
          std::string why = nabla::backend_unavailable(name);
          if (why.starts_with("backend: ")) why.erase(0, 9);
          return why;
        }
        // A build without nvcc says so.
        if (name == "cuda") return nabla::backend_unavailable(name).substr(9);
        return "unknown backend '" + name + "'; backends: " + valid;
      },
      "BACKEND");
}

CLI::Validator layout_name() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        std::string valid;
        for (nabla::Layout l : nabla::kAllLayouts) {
          if (name == nabla::layout_name(l)) return "";
          valid += (valid.empty() ? "" : ", ") + std::string(nabla::layout_name(l));
        }
        return "unknown layout '" + name + "'; layouts: " + valid;
      },
      "LAYOUT");
}

// Checked before CLI::Range, so "abc" is reported as not a number rather than
// as out of range.
CLI::Validator integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        int value = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec == std::errc() && end == text.data() + text.size()) return "";
        return "'" + text + "' is not an integer";
      },
      "");
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        double value = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(value))
          return "'" + text + "' is not a number";
        return value > 0 ? "" : "'" + text + "' is not positive";
      },
      "> 0");
}

// A probability in (0, 1] (top-p) or, with `one_excluded`, in [0, 1) (min-p).
CLI::Validator probability(bool one_excluded) {
  return CLI::Validator(
      [one_excluded](std::string& text) -> std::string {
        char* end = nullptr;
        double value = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(value)) return "'" + text + "' is not a number";
        const bool ok = one_excluded ? value >= 0 && value < 1 : value > 0 && value <= 1;
        return ok ? "" : "'" + text + "' is not in " + (one_excluded ? "[0, 1)" : "(0, 1]");
      },
      one_excluded ? "in [0, 1)" : "in (0, 1]");
}

CLI::Option* add_int(CLI::App* app, const std::string& name, int& value, const std::string& help,
                     int lo, int hi) {
  return app->add_option(name, value, help)
      ->check(integer())
      ->check(CLI::Range(lo, hi).description(fmt::format("{}..{}", lo, hi)))
      ->capture_default_str();
}

// The flags every `nabla train` command shares (TrainingLoop's).
// folders: the checkpoint is a folder (finetune's adapter or model folder).
void add_training_options(CLI::App* cmd, TrainLoopArgs& a, const std::string& seed_help, bool folders = false) {
  cmd->add_option("--lr", a.lr, "Peak learning rate (AdamW)")->check(positive_number())->capture_default_str();
  cmd->add_option("--weight-decay", a.weight_decay, "AdamW weight decay")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
  cmd->add_option("--warmup", a.warmup, "Warmup steps")
      ->check(CLI::Range(int64_t(0), int64_t(100'000'000)))
      ->capture_default_str();
  cmd->add_option("--clip", a.clip, "Gradient clipping by global norm (0: off)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  add_int(cmd, "--threads", a.threads, "Threads (0: all cores)", 0, 256);
  cmd->add_option("--seed", a.seed, seed_help)->capture_default_str();
  cmd->add_option("--max-steps", a.max_steps,
                  "Stop after this many steps (0: the whole schedule, which keeps its length, for --resume)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  cmd->add_option("--max-minutes", a.max_minutes,
                  "Stop after this many minutes of training (evaluation not counted), then evaluate and save")
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_option("--eval-every", a.eval_every,
                  "Steps between evaluations, each followed by a checkpoint (0: at epoch ends and the end only)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40))
      ->capture_default_str();
  add_int(cmd, "--log-every", a.log_every, "Steps per progress line in logs (and per CSV row)", 1, 1'000'000);
  if (folders) {
    cmd->add_option("--save", a.save,
                    "Output folder: the adapter as PEFT writes it (the model as Hugging Face does with --full) and "
                    "the training state; the CSV log and SVG plot go beside it");
    cmd->add_option("--resume", a.resume,
                    "A folder --save wrote (continues that run), or any PEFT adapter folder (trains on from its "
                    "weights)")
        ->check(CLI::ExistingDirectory);
  } else {
    cmd->add_option("--save", a.save, "Checkpoint path (safetensors); the CSV log and SVG plot go beside it");
    cmd->add_option("--resume", a.resume, "Continue a run from its training checkpoint")->check(CLI::ExistingFile);
  }
  cmd->add_option("--log", a.log, "CSV log path");
  cmd->add_option("--save-every", a.save_every, "Also save the checkpoint every N steps (0: only when evaluating)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  cmd->add_flag("--shard-optimizer", a.shard_optimizer,
                "Under mpirun: each process holds and updates its part of the AdamW moments (ZeRO-1; same results, "
                "1/N of their memory)");
  cmd->add_flag("--check-finite", a.check_finite,
                "Stop at the first op that produces NaN or Inf, naming it (also NABLA_CHECK_FINITE=1)");
  cmd->add_flag("--bf16-matmul", a.bf16_matmul,
                "Round matmul operands to bfloat16, accumulating in f32 (faster where the CPU has avx512_bf16)");
  cmd->add_option("--backend", a.backend, "Backend that runs the training step (forward, backward, update)")
      ->check(backend_name())
      ->capture_default_str();
}

// byte, gpt2, or the path of a tokenizer.json or a GGUF model.
CLI::Validator tokenizer_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s == "byte" || s == "gpt2") return "";
        if (s.ends_with(".json") || s.ends_with(".gguf")) return CLI::ExistingFile(s);
        if (nabla::is_gguf_file(s)) return "";
        return "expected byte, gpt2, a tokenizer.json or a GGUF model file, got '" + s + "'";
      },
      "byte|gpt2|FILE.json|FILE.gguf");
}

// `nabla train gpt2` and `nabla train llama`: the same command for either
// architecture (TrainLmArgs).
CLI::App* add_language_model_command(CLI::App* train_cmd, TrainLmArgs& a, const std::string& what,
                                     const std::vector<std::string>& presets) {
  const bool llama = a.architecture == "llama";
  CLI::App* cmd = train_cmd->add_subcommand(a.architecture, what + " from scratch on real text (Debian's fortunes by default)");
  std::string names;
  for (const std::string& p : presets) names += (names.empty() ? "" : ", ") + p;
  cmd->add_option("--preset", a.preset, "Model preset: " + names)->check(CLI::IsMember(presets))->capture_default_str();
  cmd->add_option("--text", a.text, "Text file or folder (default: the installed fortunes)");
  cmd->add_option("--tokenizer", a.tokenizer,
                  "byte, gpt2, a tokenizer.json or a GGUF model's (default: the preset's; the vocabulary grows to "
                  "fit it)")
      ->check(tokenizer_validator());
  cmd->add_option("--vocab", a.vocab, "Folder with GPT-2's encoder.json and vocab.bpe");
  cmd->add_option("--steps", a.steps, "Optimizer steps: the schedule's length (0: save the initial model)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  add_int(cmd, "--batch", a.batch, "Sequences per step", 1, 100'000);
  add_int(cmd, "--context", a.context, "Tokens per sequence (0: the preset's, at most 256)", 0, 1'000'000);
  if (!llama) {
    cmd->add_option("--dropout", a.dropout, "Dropout rate (default: the preset's)")->check(CLI::Range(0.0, 0.99));
  }
  cmd->add_flag("--gradient-checkpointing", a.gradient_checkpointing,
                "Recompute each block's activations and the logits in the backward: a fraction of the memory "
                "for about a third more time");
  add_int(cmd, "--layers", a.n_layer,
          llama ? "Override the preset's number of blocks (num_hidden_layers)" : "Override the preset's number of blocks (n_layer)",
          0, 1024);
  add_int(cmd, "--heads", a.n_head,
          llama ? "Override the preset's query heads (num_attention_heads)" : "Override the preset's attention heads (n_head)",
          0, 1024);
  if (llama) add_int(cmd, "--kv-heads", a.kv_heads, "Override the preset's key/value heads (num_key_value_heads)", 0, 1024);
  add_int(cmd, "--width", a.n_embd,
          llama ? "Override the preset's width (hidden_size; the MLP keeps its proportion)" : "Override the preset's width (n_embd)",
          0, 65536);
  add_int(cmd, "--positions", a.n_positions,
          llama ? "Override the preset's context length (max_position_embeddings)" : "Override the preset's context length (n_positions)",
          0, 1'000'000);
  add_int(cmd, "--eval-batches", a.eval_batches, "Validation batches", 1, 100'000);
  add_int(cmd, "--replicas", a.replicas,
          "Data-parallel replicas, each a share of the batch on a thread of its own (under mpirun: per process)", 1,
          4096);
  add_training_options(cmd, a, llama ? "Seed for weights and batches" : "Seed for weights, batches and dropout");
  auto* low_memory = cmd->add_flag(
      "--low-memory", a.low_memory,
      "Keep weight gradients as their smaller factors and multiply them out in the optimizer step (same results; "
      "less memory at small batches, a little more time; the default for models of more than 50M parameters)");
  cmd->add_flag("--no-low-memory", a.whole_gradients, "Hold every weight gradient whole")->excludes(low_memory);
  return cmd;
}


// The error's line (naming the rank in a job) and its status. A rank of a
// job leaves at once, without the collective goodbye (MPI_Finalize) the
// others, waiting in the step, would never answer: the launcher sees its
// status and ends the job.
int fail(const nabla::dist::Communicator* job, const std::string& message, int status) {
  if (!job) {
    fmt::print(stderr, "{}\n", message);
    return status;
  }
  fmt::print(stderr, "{} (rank {} of {})\n", message, job->rank(), job->size());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nabla: a define-then-run tensor library with complete autodiff", "nabla"};
  app.require_subcommand(0, 1);  // none: help and status 2 below

  OpsArgs ops;
  CLI::App* ops_cmd =
      app.add_subcommand("ops", "List every registered op and how its gradient is checked");
  ops_cmd->add_flag("--markdown", ops.markdown, "Print docs/ops.md");

  GradcheckArgs grad;
  CLI::App* grad_cmd =
      app.add_subcommand("gradcheck", "Check every op's gradient against finite differences");
  grad_cmd->add_option("--op", grad.ops, "Only this op (repeatable)")->check(registered_op());
  grad_cmd->add_option("--threads", grad.threads, "Thread counts (repeatable; default 1, 2, 4)")
      ->check(integer())
      ->check(CLI::Range(1, 256).description("1..256"));
  grad_cmd->add_option("--layout", grad.layouts, "Only this layout (repeatable)")
      ->check(layout_name());
  grad_cmd->add_option("--backend", grad.backend, "Run the checks on this backend and compare it with the CPU")
      ->check(backend_name());
  grad_cmd->add_flag("-v,--verbose", grad.verbose, "One line per check with its errors");

  TrainMlpArgs mlp;
  CLI::App* train_cmd = app.add_subcommand("train", "Train a demo model");
  train_cmd->require_subcommand(0, 1);
  CLI::App* mlp_cmd =
      train_cmd->add_subcommand("mlp", "A 2-layer MLP on three interleaved spirals");
  mlp_cmd->add_option("--steps", mlp.steps, "Optimizer steps: the schedule's length")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40))
      ->capture_default_str();
  add_int(mlp_cmd, "--batch", mlp.batch, "Minibatch size (at most the 2,000 training points)", 1, 2000);
  add_int(mlp_cmd, "--hidden", mlp.hidden, "Hidden units", 1, 100'000);
  add_training_options(mlp_cmd, mlp, "Seed for data, weights and batches");

  TrainVitArgs vit;
  CLI::App* vit_cmd = train_cmd->add_subcommand("vit", "A Vision Transformer on real images (Fashion-MNIST by default)");
  vit_cmd->add_option("--preset", vit.preset, "Model preset: fmnist, vit-tiny")
      ->check(CLI::IsMember({"fmnist", "vit-tiny"}))
      ->capture_default_str();
  vit_cmd->add_option("--dataset", vit.dataset, "fashion-mnist or cifar10")
      ->check(CLI::IsMember({"fashion-mnist", "cifar10"}))
      ->capture_default_str();
  vit_cmd->add_option("--data", vit.data, "Dataset directory (default: the installed Fashion-MNIST)");
  add_int(vit_cmd, "--epochs", vit.epochs, "Epochs", 1, 100'000);
  add_int(vit_cmd, "--batch", vit.batch, "Batch size", 1, 1'000'000);
  vit_cmd->add_option("--dropout", vit.drop_rate, "Dropout rate (default: the preset's)")->check(CLI::Range(0.0, 0.99));
  add_int(vit_cmd, "--crop-pad", vit.crop_pad,
          "Random-crop padding in pixels (0: no crop; default: 0 for Fashion-MNIST, whose centred items learn faster "
          "unshifted in short runs, 2 for CIFAR-10)",
          -1, 64);
  vit_cmd->add_option("--hflip", vit.hflip, "Random horizontal flips")->capture_default_str();
  vit_cmd->add_option("--random-erase", vit.erase_prob,
                      "Probability of random erasing (a rectangle of 2-33% of the image set to the mean)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  vit_cmd->add_option("--label-smoothing", vit.label_smoothing,
                      "Label smoothing: targets (1 - x) one-hot + x / classes")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  add_int(vit_cmd, "--patch-size", vit.patch_size, "Override the preset's patch size", 0, 1024);
  add_int(vit_cmd, "--embed-dim", vit.embed_dim, "Override the preset's width", 0, 65536);
  add_int(vit_cmd, "--depth", vit.depth, "Override the preset's number of blocks", 0, 1024);
  add_int(vit_cmd, "--heads", vit.heads, "Override the preset's attention heads", 0, 1024);
  vit_cmd->add_option("--mlp-ratio", vit.mlp_ratio, "Override the preset's MLP ratio")->check(CLI::Range(0.0, 64.0));
  vit_cmd->add_option("--pool", vit.pool, "Override the preset's pooling: token or avg")
      ->check(CLI::IsMember({"token", "avg"}));
  vit_cmd->add_flag("--resize", vit.resize, "Resize images to the model's size and channels (e.g. vit-tiny)");
  vit_cmd->add_flag("--gradient-checkpointing", vit.gradient_checkpointing,
                    "Recompute each block's activations in the backward: a fraction of the memory for about a "
                    "third more time");
  add_int(vit_cmd, "--replicas", vit.replicas,
          "Data-parallel replicas, each a share of the batch on a thread of its own (0: one per thread for "
          "models of up to 2M parameters, else 1)",
          0, 256);
  vit_cmd->add_option("--train-subset", vit.train_subset, "Use only the first N training images")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  vit_cmd->add_option("--test-subset", vit.test_subset, "Evaluate on the first N test images only")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  add_int(vit_cmd, "--eval-batch", vit.eval_batch, "Evaluation batch size", 1, 1'000'000);
  add_training_options(vit_cmd, vit, "Seed for weights, data order, augmentation, dropout");

  TrainLmArgs gpt("gpt2"), llama("llama");
  CLI::App* gpt_cmd = add_language_model_command(train_cmd, gpt, "GPT-2", {"gpt2-small-byte", "gpt2"});
  CLI::App* llama_cmd = add_language_model_command(train_cmd, llama, "A Llama-family model (GQA, RoPE, SwiGLU)",
                                                   {"llama-tiny-byte", "smollm2-135m"});

  FinetuneArgs ft;
  CLI::App* finetune_cmd = app.add_subcommand(
      "finetune", "Fine-tune a Llama-family model (HF folder, GGUF) on JSONL data with LoRA adapters, or fully");
  finetune_cmd->add_option("--base", ft.base, "The pretrained model: Hugging Face folder, GGUF file or nabla checkpoint")
      ->required()
      ->check(CLI::ExistingPath);
  finetune_cmd
      ->add_option("--data", ft.data,
                   "JSONL, one example a line: {\"text\"}, {\"prompt\", \"completion\"} or {\"messages\": [{\"role\", "
                   "\"content\"}]}")
      ->required()
      ->check(CLI::ExistingFile);
  finetune_cmd->add_option("--val-data", ft.val_data, "Validation JSONL (default: --val-fraction of --data)")
      ->check(CLI::ExistingFile);
  finetune_cmd->add_option("--val-fraction", ft.val_fraction, "Share of --data held out for validation (> 0)")
      ->check(CLI::Range(1e-9, 0.9))
      ->capture_default_str();
  finetune_cmd
      ->add_option("--chat-template", ft.chat_template,
                   "Template for {\"messages\"}, or auto: the base's own when nabla renders it, chatml when the "
                   "base has none")
      ->check(CLI::IsMember(chat_template_choices()))
      ->capture_default_str();
  finetune_cmd->add_option("--tokenizer", ft.tokenizer, "Tokenizer (default: the base's)")->check(tokenizer_validator());
  finetune_cmd->add_flag("--pad", ft.pad,
                         "One example a row, padded (default: examples packed into rows, attention kept inside each)");
  add_int(finetune_cmd, "--epochs", ft.epochs, "Passes over the training examples", 1, 1'000'000);
  add_int(finetune_cmd, "--batch", ft.batch, "Rows per micro-batch", 1, 100'000);
  add_int(finetune_cmd, "--grad-accum", ft.grad_accum, "Micro-batches summed into each optimizer step", 1, 100'000);
  add_int(finetune_cmd, "--context", ft.context, "Tokens per row (0: the model's positions, at most 512)", 0,
          1'000'000);
  add_int(finetune_cmd, "--lora-r", ft.lora_r, "LoRA rank", 1, 65536);
  finetune_cmd->add_option("--lora-alpha", ft.lora_alpha, "LoRA alpha (scale alpha / r)")
      ->check(positive_number())
      ->capture_default_str();
  finetune_cmd->add_option("--lora-dropout", ft.lora_dropout, "Dropout on the adapters' inputs")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  finetune_cmd
      ->add_option("--lora-targets", ft.lora_targets,
                   "Projections with adapters, comma-separated: q, k, v, o, gate, up, down (Phi-3: qkv, o, gate_up, "
                   "down; default: all of the model's)")
      ->delimiter(',')
      ->check(CLI::IsMember({"q", "k", "v", "o", "gate", "up", "down", "qkv", "gate_up", "q_proj", "k_proj", "v_proj",
                             "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj"}));
  finetune_cmd->add_flag("--rslora", ft.rslora, "Scale adapters by alpha / sqrt(r) (rsLoRA)");
  finetune_cmd->add_flag("--dora", ft.dora,
                         "Weight-decomposed adapters (DoRA, PEFT's use_dora): a trained magnitude per output row");
  add_int(finetune_cmd, "--replicas", ft.replicas,
          "Data-parallel replicas, each a share of the batch's rows on a thread of its own (under mpirun: per process)",
          1, 4096);
  finetune_cmd->add_flag("--gradient-checkpointing", ft.gradient_checkpointing,
                         "Recompute each block's activations and the logits in the backward: a fraction of the "
                         "memory for about a third more time");
  auto* full_flag = finetune_cmd->add_flag("--full", ft.full, "Train every parameter instead of adapters");
  for (const char* lora_only : {"--lora-r", "--lora-alpha", "--lora-dropout", "--lora-targets", "--rslora", "--dora"}) {
    finetune_cmd->get_option(lora_only)->excludes(full_flag);
  }
  add_training_options(finetune_cmd, ft, "Seed for the adapters, data order and dropout", /*folders=*/true);

  const CLI::Validator tokenizer_name = tokenizer_validator();
  SampleArgs sample;
  CLI::App* sample_cmd =
      app.add_subcommand("sample", "Generate text from a GPT-2 or Llama checkpoint (key/value cache)");
  sample_cmd
      ->add_option("--checkpoint", sample.checkpoint,
                   "GPT-2 or Llama checkpoint, Hugging Face folder or llama.cpp GGUF")
      ->required()
      ->check(CLI::ExistingPath);
  CLI::Option* prompt_opt = sample_cmd->add_option("--prompt", sample.prompt, "Text to continue");
  CLI::Option* chat_opt =
      sample_cmd->add_option("--chat", sample.chat,
                             "A user message to reply to, in the model's chat template")
          ->excludes(prompt_opt);
  sample_cmd->add_option("--system", sample.system, "A system message before --chat's")->needs(chat_opt);
  sample_cmd
      ->add_option("--chat-template", sample.chat_template,
                   "--chat's template, or auto: the checkpoint's own when nabla renders it, chatml when it has none")
      ->check(CLI::IsMember(chat_template_choices()))
      ->needs(chat_opt)
      ->capture_default_str();
  add_int(sample_cmd, "--tokens", sample.tokens, "Tokens to generate, at most", 1, 1'000'000);
  sample_cmd->add_flag("--ignore-eos", sample.ignore_eos,
                       "Generate --tokens tokens, not stopping at the end of text or of a turn");
  sample_cmd->add_option("--temperature", sample.temperature,
                         "Softmax temperature (0: greedy); the sampling options not given come from a Hugging Face "
                         "folder's generation_config.json when it has one")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  add_int(sample_cmd, "--top-k", sample.top_k, "Sample among the k likeliest tokens (0: all)", 0, 10'000'000);
  sample_cmd->add_option("--top-p", sample.top_p, "Sample among the likeliest tokens whose probability reaches P")
      ->check(probability(false))
      ->capture_default_str();
  sample_cmd->add_option("--min-p", sample.min_p, "Leave out tokens under P times the likeliest's probability")
      ->check(probability(true))
      ->capture_default_str();
  sample_cmd->add_option("--seed", sample.seed, "Sampling seed")->capture_default_str();
  sample_cmd->add_option("--vocab", sample.vocab, "Folder with GPT-2's encoder.json and vocab.bpe");
  sample_cmd->add_option("--tokenizer", sample.tokenizer,
                         "byte, gpt2, a tokenizer.json or a GGUF model (default: the GGUF's own, the folder's "
                         "tokenizer.json, else the checkpoint's config)")
      ->check(tokenizer_name);
  add_int(sample_cmd, "--threads", sample.threads, "Threads (0: all cores)", 0, 256);
  sample_cmd->add_option("--backend", sample.backend, "Backend that runs the decoding steps")
      ->check(backend_name())
      ->capture_default_str();
  sample_cmd->add_option("--adapter", sample.adapter, "A PEFT LoRA adapter folder on the (Llama-family) model")
      ->check(CLI::ExistingDirectory);
  sample_cmd->add_flag("--timings", sample.timings, "Print the prompt's and the generation's tokens per second to stderr");

  TokenizeArgs tokenize;
  CLI::App* tokenize_cmd =
      app.add_subcommand("tokenize", "Encode stdin as token ids, one line of ids per line of text (or decode ids)");
  tokenize_cmd->add_option("--tokenizer", tokenize.tokenizer,
                           "byte, gpt2, a Hugging Face tokenizer.json, or a GGUF model (its tokenizer.ggml.*)")
      ->check(tokenizer_name)
      ->capture_default_str();
  tokenize_cmd->add_option("--vocab", tokenize.vocab, "Folder holding GPT-2's encoder.json and vocab.bpe (default: found)")
      ->check(CLI::ExistingDirectory);
  CLI::Option* decode_flag = tokenize_cmd->add_flag("--decode", tokenize.decode, "Read lines of ids, print their text");
  CLI::Option* whole_flag =
      tokenize_cmd->add_flag("--whole", tokenize.whole, "Encode all of stdin as one text, newlines included")
          ->excludes(decode_flag);
  tokenize_cmd
      ->add_option("--dataset-out", tokenize.dataset_out,
                   "Instead of stdin: write the corpus's train/val token streams, as `nabla train gpt2` sees them, "
                   "to this safetensors file (for other frameworks)")
      ->excludes(decode_flag)
      ->excludes(whole_flag);
  tokenize_cmd->add_option("--text", tokenize.text, "Corpus for --dataset-out: file or folder (default: fortunes)");

  TokenizerArgs tokenizer_args;
  CLI::App* tokenizer_cmd = app.add_subcommand("tokenizer", "BPE tokenizers as tokenizer.json");
  tokenizer_cmd->require_subcommand(0, 1);
  CLI::App* tok_train_cmd = tokenizer_cmd->add_subcommand("train", "Learn a byte-level BPE from a text");
  tok_train_cmd->add_option("--text", tokenizer_args.text, "Text file or folder (default: the installed fortunes)");
  add_int(tok_train_cmd, "--vocab-size", tokenizer_args.vocab_size, "Tokens, <|endoftext|> included", 257, 1 << 24);
  tok_train_cmd->add_option("--pattern", tokenizer_args.pattern, "Pre-tokenizer: gpt2, llama3, qwen2, digits or o200k")
      ->check(CLI::IsMember({"gpt2", "llama3", "qwen2", "digits", "o200k"}))
      ->capture_default_str();
  tok_train_cmd->add_option("-o,--out", tokenizer_args.out, "tokenizer.json to write")->required();
  CLI::App* tok_convert_cmd = tokenizer_cmd->add_subcommand("convert", "Write a BPE tokenizer as tokenizer.json");
  tok_convert_cmd->add_option("--tokenizer", tokenizer_args.tokenizer, "gpt2, a tokenizer.json, or a GGUF model")
      ->required()
      ->check(tokenizer_name);
  tok_convert_cmd->add_option("--vocab", tokenizer_args.vocab, "Folder holding GPT-2's encoder.json and vocab.bpe")
      ->check(CLI::ExistingDirectory);
  tok_convert_cmd->add_option("-o,--out", tokenizer_args.out, "tokenizer.json to write")->required();

  EvalArgs eval;
  CLI::App* eval_cmd = app.add_subcommand("eval", "Test accuracy of a ViT checkpoint");
  eval_cmd->add_option("checkpoint", eval.checkpoint, "Checkpoint (safetensors)")->required()->check(CLI::ExistingFile);
  eval_cmd->add_option("--dataset", eval.dataset, "fashion-mnist or cifar10")
      ->check(CLI::IsMember({"fashion-mnist", "cifar10"}));
  eval_cmd->add_option("--data", eval.data, "Dataset directory");
  add_int(eval_cmd, "--batch", eval.batch, "Batch size", 1, 1'000'000);
  add_int(eval_cmd, "--threads", eval.threads, "Threads (0: all cores)", 0, 256);

  GradArgs gradargs;
  CLI::App* gradient_cmd =
      app.add_subcommand("grad", "Loss and every parameter's gradient for one batch, written as safetensors");
  gradient_cmd->add_option("--weights", gradargs.weights, "Model checkpoint, or a Hugging Face model folder")
      ->required()
      ->check(CLI::ExistingPath);
  gradient_cmd->add_option("--batch", gradargs.batch, "Batch file (safetensors: images and labels, or tokens)")
      ->required()
      ->check(CLI::ExistingFile);
  gradient_cmd->add_option("--out", gradargs.out, "Output safetensors (grad.<name> and loss)")->required();
  gradient_cmd
      ->add_option("--adapter", gradargs.adapter,
                   "A PEFT LoRA adapter folder on the (Llama-family) model: the adapter's gradients, under their "
                   "PEFT names")
      ->check(CLI::ExistingDirectory);
  add_int(gradient_cmd, "--threads", gradargs.threads, "Threads (0: all cores)", 0, 256);
  gradient_cmd->add_option("--backend", gradargs.backend, "Backend that runs the step")
      ->check(backend_name())
      ->capture_default_str();
  add_int(gradient_cmd, "--adamw-steps", gradargs.adamw_steps,
          "Then this many AdamW steps on the same batch, the loss before each written as 'losses'", 0, 1'000'000);
  gradient_cmd->add_option("--lr", gradargs.lr, "AdamW learning rate (constant)")
      ->check(positive_number())
      ->capture_default_str();
  gradient_cmd->add_option("--weight-decay", gradargs.adamw.weight_decay, "AdamW weight decay")
      ->check(CLI::Range(0.0, 10.0))
      ->capture_default_str();
  gradient_cmd->add_option("--beta1", gradargs.adamw.beta1, "AdamW beta1")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  gradient_cmd->add_option("--beta2", gradargs.adamw.beta2, "AdamW beta2")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  gradient_cmd->add_option("--eps", gradargs.adamw.eps, "AdamW epsilon")->check(positive_number())->capture_default_str();
  gradient_cmd->add_option("--clip", gradargs.clip, "Gradient clipping by global norm in the AdamW steps (0: off)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();

  ExportArgs exportargs;
  CLI::App* export_cmd = app.add_subcommand("export", "Write a checkpoint in another format");
  export_cmd->require_subcommand(0, 1);
  CLI::App* gguf_cmd = export_cmd->add_subcommand("gguf", "GGUF (ggml, llama.cpp) with the hyperparameters as metadata");
  gguf_cmd->add_option("checkpoint", exportargs.checkpoint, "Checkpoint (safetensors), or a Hugging Face model folder")
      ->required()
      ->check(CLI::ExistingPath);
  gguf_cmd->add_option("-o,--out", exportargs.out, "Output .gguf path")->required();
  const std::map<std::string, nabla::GgmlType> gguf_types{
      {"f32", nabla::GgmlType::f32},   {"f16", nabla::GgmlType::f16},   {"bf16", nabla::GgmlType::bf16},
      {"q8_0", nabla::GgmlType::q8_0}, {"q4_0", nabla::GgmlType::q4_0}, {"q4_k", nabla::GgmlType::q4_k},
      {"q6_k", nabla::GgmlType::q6_k}};
  gguf_cmd->add_option("--type", exportargs.type,
                       "Llama: how weight matrices are stored (f32, f16, bf16, q8_0, q4_0, q4_k, q6_k); norms stay f32")
      ->transform(CLI::CheckedTransformer(gguf_types, CLI::ignore_case));
  gguf_cmd->add_option("--vocab", exportargs.vocab,
                       "GPT-2 checkpoints with the gpt2 tokenizer: folder with encoder.json and vocab.bpe (default: found)")
      ->check(CLI::ExistingDirectory);
  gguf_cmd->add_option("--tokenizer", exportargs.tokenizer,
                       "Tokenizer written as tokenizer.ggml.*: byte, gpt2, a tokenizer.json or a GGUF model "
                       "(default: the checkpoint's own)")
      ->check(tokenizer_name);

  CLI::App* hf_cmd =
      export_cmd->add_subcommand("hf", "A Hugging Face model folder (config.json, model.safetensors): Llama checkpoints");
  hf_cmd->add_option("checkpoint", exportargs.checkpoint, "Checkpoint (safetensors)")
      ->required()
      ->check(CLI::ExistingPath);
  hf_cmd->add_option("-o,--out", exportargs.out, "Output folder (created; its config.json and model.safetensors replaced)")
      ->required();
  hf_cmd->add_option("--tokenizer", exportargs.tokenizer,
                     "Tokenizer written as tokenizer.json: a tokenizer.json or a GGUF model (default: the "
                     "checkpoint's own when it is byte-level BPE)")
      ->check(tokenizer_name);
  for (CLI::App* cmd : {gguf_cmd, hf_cmd}) {
    cmd->add_option("--adapter", exportargs.adapter,
                    "A PEFT LoRA adapter folder merged into the (Llama-family) weights")
        ->check(CLI::ExistingDirectory);
  }
  CLI::App* lora_gguf_cmd =
      export_cmd->add_subcommand("lora-gguf", "A PEFT LoRA adapter as llama.cpp's adapter GGUF (llama-cli --lora)");
  lora_gguf_cmd->add_option("adapter", exportargs.adapter, "PEFT adapter folder (adapter_config.json, "
                                                           "adapter_model.safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  lora_gguf_cmd->add_option("--base", exportargs.checkpoint, "The base model it adapts (GGUF, HF folder, checkpoint)")
      ->required()
      ->check(CLI::ExistingPath);
  lora_gguf_cmd->add_option("-o,--out", exportargs.out, "Output .gguf path")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "nabla: error: {} (see nabla --help)\n", e.what());
    return kExitUsage;
  }
  // A command that needs a subcommand and got none: its help, as a usage error.
  for (CLI::App* cmd : {&app, train_cmd, export_cmd, tokenizer_cmd}) {
    if (cmd->parsed() && cmd->get_subcommands().empty()) {
      fmt::print(stderr, "{}", cmd->help());
      return kExitUsage;
    }
  }

  std::unique_ptr<nabla::dist::Communicator> job;
  try {
    job = join_job();
    if (job) {
      if (!vit_cmd->parsed() && !gpt_cmd->parsed() && !llama_cmd->parsed() && !finetune_cmd->parsed()) {
        throw nabla::UsageError("under mpirun with " + std::to_string(job->size()) +
                                " processes, nabla runs train vit, gpt2, llama and finetune; this command runs in one");
      }
      vit.comm = gpt.comm = llama.comm = ft.comm = job.get();
      // Rank 0 speaks for the job; the others report errors only.
      if (job->rank() > 0 && !std::freopen("/dev/null", "w", stdout)) throw nabla::IoError("/dev/null: cannot open");
    }
    if (ops_cmd->parsed()) return run_ops(ops);
    if (grad_cmd->parsed()) return run_gradcheck(grad);
    if (mlp_cmd->parsed()) return run_train_mlp(mlp);
    if (vit_cmd->parsed()) return run_train_vit(vit);
    if (gpt_cmd->parsed()) return run_train_lm(gpt);
    if (llama_cmd->parsed()) return run_train_lm(llama);
    if (finetune_cmd->parsed()) return run_finetune(ft);
    if (eval_cmd->parsed()) return run_eval(eval);
    if (gradient_cmd->parsed()) return run_grad(gradargs);
    if (gguf_cmd->parsed()) return run_export_gguf(exportargs);
    if (hf_cmd->parsed()) return run_export_hf(exportargs);
    if (lora_gguf_cmd->parsed()) return run_export_lora_gguf(exportargs);
    if (sample_cmd->parsed()) {
      for (const char* o : {"--temperature", "--top-k", "--top-p", "--min-p"}) {
        if (sample_cmd->get_option(o)->count() > 0) sample.sampling_given.push_back(o);
      }
      return run_sample(sample);
    }
    if (tokenize_cmd->parsed()) return run_tokenize(tokenize);
    if (tok_train_cmd->parsed()) return run_tokenizer_train(tokenizer_args);
    if (tok_convert_cmd->parsed()) return run_tokenizer_convert(tokenizer_args);
  } catch (const nabla::Error& e) {
    // Bad data, files or options: a one-line message and the usage status.
    return fail(job.get(), fmt::format("nabla: error: {}", e.what()), kExitUsage);
  } catch (const std::exception& e) {
    return fail(job.get(), fmt::format("nabla: internal error: {}", e.what()), kExitFailed);
  }
  return kExitUsage;
}
