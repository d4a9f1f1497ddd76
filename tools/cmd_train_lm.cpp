// `nabla train gpt2` and `nabla train llama`: a next-token language model
// from scratch on real text (Debian's fortunes by default) through nabla's
// autodiff. The batches are random windows chosen from (seed, step) alone,
// so a run resumes bit-identically.
#include <fmt/format.h>

#include <type_traits>

#include <cstdio>
#include <filesystem>

#include "cmd_tokenize.h"
#include "commands.h"
#include "nabla/gguf.h"
#include "nabla/io.h"
#include "nabla/models/gguf.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/text_data.h"
#include "nabla/tokenizer.h"
#include "nabla/trainer.h"
#include "train_loop.h"

namespace nabla::cli {

namespace {

// Random windows of the training text chosen by (seed, step), split among
// the step's replicas (all ranks' of a distributed run: this process fills
// its own); the mean loss over a fixed set of validation windows (the same
// every time). (The model's dropout seed, when it has dropout, is drawn per
// step and replica.)
class TextTask : public TrainingTask {
 public:
  template <class Model>
  TextTask(TrainStep& step, const Model& model, const Tensor& dropout_seed, const Tensor& tokens,
           std::span<const int32_t> train, std::span<const int32_t> val, int64_t batch, int64_t context,
           int64_t eval_batches, uint64_t seed, int threads)
      : step_(step), batcher_(train, batch, context, seed), val_batcher_(val, batch, context, seed + 1),
        eval_batches_(eval_batches), batch_tokens_(size_t(batch * (context + 1))) {
    for (int r = 0; r < step.replicas(); ++r) {
      replicas_.push_back({step.in_replica(r, tokens),
                           dropout_seed.defined() ? step.in_replica(r, dropout_seed) : Tensor()});
    }
    val_tokens_ = Tensor::zeros(DType::i32, {batch, context + 1});
    val_loss_ = model.next_token_loss(val_tokens_, /*train=*/false);
    validator_ = std::make_unique<Executor>(Graph({val_loss_}), ExecOptions{.threads = threads});
  }

  int64_t batches_per_epoch() const override { return 0; }

  void load_batch(const TrainPosition& pos, int) override {
    batcher_.batch(pos.step, batch_tokens_.data());
    for (size_t r = 0; r < replicas_.size(); ++r) {
      Replica& rep = replicas_[r];
      const int64_t n = rep.tokens.numel(), g = step_.global_replica(int(r));
      std::copy_n(batch_tokens_.data() + g * n, n, rep.tokens.data_as<int32_t>());
      if (rep.dropout_seed.defined()) {
        rep.dropout_seed.data_as<int32_t>()[0] = replica_seed(step_seed(pos.seed, pos.step), g);
      }
    }
  }

  Evaluation evaluate() override {
    double total = 0;
    for (int64_t i = 0; i < eval_batches_; ++i) {
      val_batcher_.batch(i, val_tokens_.data_as<int32_t>());
      validator_->run();
      total += validator_->read<float>(val_loss_)[0];
    }
    const int64_t tokens = val_tokens_.dim(0) * (val_tokens_.dim(1) - 1);  // predicted: all but each row's first
    return {.loss = total / double(eval_batches_), .count = eval_batches_ * tokens};
  }

 private:
  struct Replica {
    Tensor tokens, dropout_seed;
  };
  TrainStep& step_;
  std::vector<Replica> replicas_;
  TextBatcher batcher_, val_batcher_;
  int64_t eval_batches_;
  std::vector<int32_t> batch_tokens_;
  Tensor val_tokens_, val_loss_;
  std::unique_ptr<Executor> validator_;
};

// --tokenizer into a preset's config: gpt2, or a tokenizer.json or GGUF
// model (by its absolute path until keep_tokenizer_beside), widens the
// vocabulary to the tokenizer's where the preset's is smaller.
void set_tokenizer(const TrainLmArgs& a, std::string& tokenizer, int64_t& vocab_size) {
  if (a.tokenizer.empty()) return;
  tokenizer = a.tokenizer;
  if (tokenizer == "byte") return;
  if (tokenizer != "gpt2") tokenizer = std::filesystem::absolute(tokenizer).string();
  vocab_size = std::max<int64_t>(vocab_size, make_tokenizer(tokenizer, a.vocab)->vocab_size());
}

// A tokenizer read from a file goes beside the checkpoint, as
// SAVE_STEM.tokenizer.json, and the config names it by that file name, so
// the checkpoint and its tokenizer move together (checkpoint_tokenizer reads
// it there). A tokenizer.json is copied as it is; a GGUF model's vocabulary
// is written as tokenizer.json.
void keep_tokenizer_beside(const std::string& save, const Tokenizer& tok, std::string& tokenizer) {
  namespace fs = std::filesystem;
  if (save.empty() || tokenizer == "byte" || tokenizer == "gpt2") return;
  const fs::path target = fs::path(save).parent_path() / (fs::path(save).stem().string() + ".tokenizer.json");
  std::error_code ec;
  if (fs::equivalent(tokenizer, target, ec)) {
    tokenizer = target.filename().string();
    return;
  }
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tok);
  if (!bpe) throw UsageError("train: the tokenizer of " + tokenizer + " is not BPE");
  models::write_tokenizer_json(tokenizer, *bpe, target.string());
  tokenizer = target.filename().string();
}

// What the two architectures differ in: the config from a preset or a
// checkpoint with the command line's overrides, and how it is described.
models::Gpt2Config gpt2_config(const TrainLmArgs& a, const std::optional<Checkpoint>& resume) {
  if (resume) return models::gpt2_config_from_checkpoint(*resume);
  models::Gpt2Config cfg = models::gpt2_preset(a.preset);
  set_tokenizer(a, cfg.tokenizer, cfg.vocab_size);
  if (a.dropout >= 0) cfg.dropout = a.dropout;
  if (a.n_layer > 0) cfg.n_layer = a.n_layer;
  if (a.n_head > 0) cfg.n_head = a.n_head;
  if (a.n_embd > 0) cfg.n_embd = a.n_embd;
  if (a.n_positions > 0) cfg.n_positions = a.n_positions;
  cfg.validate();
  return cfg;
}

models::LlamaConfig llama_config(const TrainLmArgs& a, const std::optional<Checkpoint>& resume) {
  if (resume) return models::llama_config_from_checkpoint(*resume);
  models::LlamaConfig cfg = models::llama_preset(a.preset);
  set_tokenizer(a, cfg.tokenizer, cfg.vocab_size);
  if (a.n_layer > 0) cfg.num_hidden_layers = a.n_layer;
  if (a.n_head > 0) cfg.num_attention_heads = a.n_head;
  if (a.kv_heads > 0) cfg.num_key_value_heads = a.kv_heads;
  if (a.n_embd > 0) {
    // The MLP keeps the preset's proportion to the width.
    cfg.intermediate_size = std::max<int64_t>(1, a.n_embd * cfg.intermediate_size / cfg.hidden_size);
    cfg.hidden_size = a.n_embd;
  }
  if (a.n_positions > 0) cfg.max_position_embeddings = a.n_positions;
  cfg.validate();
  return cfg;
}

std::string describe(const models::Gpt2Config& c) {
  return fmt::format("GPT-2 '{}': {} layers, {} heads, width {}", c.preset, c.n_layer, c.n_head, c.n_embd);
}

std::string describe(const models::LlamaConfig& c) {
  return fmt::format("Llama '{}': {} layers, {} query and {} key/value heads of {}, width {}, MLP {}", c.preset,
                     c.num_hidden_layers, c.num_attention_heads, c.kv_heads(), c.head_size(), c.hidden_size,
                     c.intermediate_size);
}

int64_t positions(const models::Gpt2Config& c) { return c.n_positions; }
int64_t positions(const models::LlamaConfig& c) { return c.max_position_embeddings; }

Tensor dropout_seed_of(const models::Gpt2& m) { return m.dropout_seed; }
Tensor dropout_seed_of(const models::Llama&) { return Tensor(); }

template <class Model, class Config>
int train(const TrainLmArgs& a, Config cfg, const std::optional<Checkpoint>& resume, uint64_t seed) {
  const std::string command = "train " + a.architecture;
  const int64_t B = a.batch, T = a.context > 0 ? a.context : std::min<int64_t>(positions(cfg), 256);
  if (T > positions(cfg)) {
    throw UsageError(fmt::format("{}: --context {} exceeds the model's {} positions", command, T, positions(cfg)));
  }
  if (resume) cfg.tokenizer = models::checkpoint_tokenizer(a.resume, cfg.tokenizer);
  std::unique_ptr<Tokenizer> tok = make_tokenizer(cfg.tokenizer, a.vocab);
  keep_tokenizer_beside(a.save, *tok, cfg.tokenizer);
  if (tok->vocab_size() > cfg.vocab_size) {
    throw UsageError(fmt::format("{}: the {} tokenizer has {} tokens, the model {}", command, tok->name(),
                                 tok->vocab_size(), cfg.vocab_size));
  }
  TextDataOptions topt;
  topt.path = a.text;
  TextDataset text = load_text_dataset(*tok, topt);
  if (int64_t(text.train.size()) <= T + 1 || int64_t(text.val.size()) <= T + 1) {
    throw UsageError(fmt::format("{}: the text has {} training and {} validation tokens, too few for "
                                 "windows of {}",
                                 command, text.train.size(), text.val.size(), T + 1));
  }

  Model model(cfg, seed);
  if (resume) load_params(*resume, model.params());
  model.set_gradient_checkpointing(a.gradient_checkpointing);

  // Replicas: one unless asked (a language model here is rarely small
  // enough for replicas to beat threads); times the processes of a
  // distributed run, they split each batch.
  const int R = std::max(1, a.replicas), ranks = a.comm ? a.comm->size() : 1;
  if (B % (R * ranks) != 0) {
    throw UsageError(fmt::format("{}: {} processes x {} replicas do not divide the batch of {}", command, ranks, R, B));
  }
  if (a.comm) {
    dist::check_same(*a.comm, "the training text",
                     fmt::format("{} training tokens, hash {}", text.train.size(),
                                 dist::fingerprint(text.train.data(), text.train.size() * sizeof(int32_t))));
  }
  Tensor tokens = Tensor::zeros(DType::i32, {B / (R * ranks), T + 1}).set_name("tokens");
  Tensor loss = model.next_token_loss(tokens, /*train=*/true);
  optim::AdamWConfig adamw;
  adamw.beta2 = 0.95;  // GPT-2 / nanoGPT; Llama's pre-training too
  adamw.weight_decay = a.weight_decay;
  // Factored gradients cannot be summed over replicas or processes.
  const bool low_memory = a.low_memory || a.whole_gradients
                              ? a.low_memory
                              : R * ranks == 1 && default_low_memory(model.params().count());
  TrainStep step(loss, model.params(), {}, adamw, exec_options(a),
                 {.low_memory = low_memory, .replicas = R, .comm = a.comm, .shard_optimizer = a.shard_optimizer});
  TextTask task(step, model, dropout_seed_of(model), tokens, text.train, text.val, B, T, a.eval_batches, seed,
                a.threads);
  TrainingLoop loop(step, task, model.params(), a,
                    {.command = command,
                     .schedule_steps = a.steps,
                     .min_lr_fraction = 0.1,
                     .examples_per_step = B,
                     .items_per_step = B * T,
                     .items = "tokens",
                     .rate_unit = "tok/s",
                     .batch = fmt::format("{} x {} tokens", B, T),
                     .eval_name = "validation",
                     .config_json = cfg.to_json()},
                    resume ? &*resume : nullptr);

  fmt::print("{} ({:.2f}M parameters), context {}, {} tokenizer ({} tokens)\n", describe(cfg),
             model.params().count() / 1e6, T, tok->name(), tok->vocab_size());
  fmt::print("text: {} documents from {} file(s), {} training and {} validation tokens{}\n", text.documents,
             text.files.size(), text.train.size(), text.val.size(), text.from_cache ? " (cached)" : "");
  fmt::print("{}\n", loop.describe());
  // By default it is said only where it factors something (a large model
  // at few tokens per step).
  if (low_memory && (a.low_memory || step.factored_gradients() > 0)) {
    fmt::print("low memory: {} weight gradients kept as their factors\n", step.factored_gradients());
  }
  if (a.gradient_checkpointing) fmt::print("gradient checkpointing: blocks and logits recomputed in the backward\n");
  std::fflush(stdout);
  loop.run();
  return kExitOk;
}

}  // namespace

int run_train_lm(const TrainLmArgs& a) {
  const std::optional<Checkpoint> resume = load_resume_checkpoint(a);
  const uint64_t seed = resume ? resume->position.seed : a.seed;
  if (a.architecture == "llama") return train<models::Llama>(a, llama_config(a, resume), resume, seed);
  return train<models::Gpt2>(a, gpt2_config(a, resume), resume, seed);
}

}  // namespace nabla::cli
