// `nabla finetune`: a pretrained Llama-family model (Hugging Face folder,
// GGUF or nabla checkpoint) fine-tuned on a JSONL dataset, with LoRA
// adapters on a frozen base (PEFT's formulation and names) or all of its
// parameters (--full). Batches are examples packed into rows with attention
// kept inside each example, or one example a row (--pad); the loss counts
// the completion / assistant tokens alone, as transformers computes it.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/finetune_data.h"
#include "nabla/gguf.h"
#include "nabla/models/gguf.h"
#include "nabla/models/llama.h"
#include "nabla/models/finetune.h"
#include "nabla/models/lora.h"
#include "nabla/tokenizer.h"
#include "nabla/trainer.h"
#include "train_loop.h"

namespace nabla::cli {

namespace {

namespace fs = std::filesystem;

// --lora-targets' short names for Hugging Face's modules (none: every
// projection of the base's model type).
std::vector<std::string> lora_targets(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& t : given) {
    const std::string name = t.ends_with("_proj") ? t : t + "_proj";
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

// A batch's tensors: the step's leaves (the session's) or the validation
// graph's, filled from a batcher. The model needs no positions: a packed
// document's rotary attention is the same from any offset.
struct BatchLeaves {
  Tensor ids, labels, segments;
  std::vector<int32_t> positions;
  BatchLeaves(Tensor i, Tensor l, Tensor s)
      : ids(std::move(i)), labels(std::move(l)), segments(std::move(s)), positions(size_t(ids.numel())) {}
  BatchLeaves(int64_t B, int64_t T)
      : BatchLeaves(Tensor::zeros(DType::i32, {B, T}), Tensor::zeros(DType::i32, {B, T}),
                    Tensor::zeros(DType::i32, {B, T})) {}
  void load(const FinetuneBatcher& b, int64_t index) {
    b.batch(index, ids.data_as<int32_t>(), labels.data_as<int32_t>(), positions.data(), segments.data_as<int32_t>());
  }
};

// Examples in batches by (seed, epoch); a step of M micro-batches takes M
// consecutive batches, each weighted by its counted tokens over the step's
// (transformers' num_items_in_batch), so the step's gradient is that of the
// mean over all the step's counted tokens whatever the padding. Each batch's
// rows are split among the replicas (every process's), each weighted by its
// own rows' counted tokens.
class FinetuneTask : public TrainingTask {
 public:
  FinetuneTask(models::FinetuneSession& session, FinetuneBatcher train, FinetuneBatcher val, int threads)
      : session_(session), model_(session.model()), train_(std::move(train)), val_(std::move(val)),
        batch_leaves_(session.settings().batch, session.settings().context), micro_(session.settings().micro_batches),
        val_leaves_(session.settings().batch, session.settings().context) {
    for (int r = 0; r < session.step().replicas(); ++r) replicas_.push_back(session.replica(r));
    train_.start_epoch(0);
    val_.start_in_order();
    val_loss_ = model_.loss(val_leaves_.ids, val_leaves_.labels, false, val_leaves_.segments);
    validator_ = std::make_unique<Executor>(Graph({val_loss_}), ExecOptions{.threads = threads});
  }

  int64_t truncated() const { return train_.truncated() + val_.truncated(); }
  int64_t truncated_uncounted() const { return train_.truncated_uncounted() + val_.truncated_uncounted(); }
  int64_t batches_per_epoch() const override { return (train_.batches_per_epoch() + micro_ - 1) / micro_; }
  void start_epoch(int64_t epoch, int64_t) override { train_.start_epoch(epoch); }

  void load_batch(const TrainPosition& pos, int m) override {
    const int64_t first = pos.batch * micro_, index = first + m;
    int64_t step_tokens = 0;
    for (int64_t i = first; i < std::min(first + micro_, train_.batches_per_epoch()); ++i) {
      step_tokens += train_.counted_tokens(i);
    }
    const TrainStep& step = session_.step();
    const int64_t parts = step.global_replicas();
    for (size_t r = 0; r < replicas_.size(); ++r) {
      models::FinetuneSession::Inputs& in = replicas_[r];
      float& weight = in.loss_weight.data_as<float>()[0];
      const int64_t g = step.global_replica(int(r)), rows = in.labels.dim(0), n = in.labels.numel();
      if (index >= train_.batches_per_epoch() || step_tokens == 0) {
        // A step past the epoch's last batch: nothing counted, nothing learnt.
        std::fill_n(in.labels.data_as<int32_t>(), n, -100);
        weight = 0;
      } else {
        if (r == 0) batch_leaves_.load(train_, index);
        std::copy_n(batch_leaves_.ids.data_as<int32_t>() + g * n, n, in.input_ids.data_as<int32_t>());
        std::copy_n(batch_leaves_.labels.data_as<int32_t>() + g * n, n, in.labels.data_as<int32_t>());
        std::copy_n(batch_leaves_.segments.data_as<int32_t>() + g * n, n, in.segments.data_as<int32_t>());
        const int64_t counted = train_.counted_tokens(index, g * rows, (g + 1) * rows);
        weight = float(double(counted) * double(micro_ * parts) / double(step_tokens));
      }
      if (in.dropout_seed.defined()) {
        in.dropout_seed.data_as<int32_t>()[0] = replica_seed(step_seed(pos.seed, pos.step * micro_ + m), g);
      }
    }
  }

  // The mean over every counted validation token.
  Evaluation evaluate() override {
    double total = 0;
    int64_t tokens = 0;
    for (int64_t i = 0; i < val_.batches_per_epoch(); ++i) {
      val_leaves_.load(val_, i);
      validator_->run();
      const int64_t n = val_.counted_tokens(i);
      total += double(validator_->read<float>(val_loss_)[0]) * double(n);
      tokens += n;
    }
    return {.loss = tokens > 0 ? total / double(tokens) : 0, .count = tokens};
  }

 private:
  models::FinetuneSession& session_;
  const models::Llama& model_;
  FinetuneBatcher train_, val_;
  BatchLeaves batch_leaves_;  // the whole batch, before it is split among the replicas
  std::vector<models::FinetuneSession::Inputs> replicas_;
  int64_t micro_;
  BatchLeaves val_leaves_;
  Tensor val_loss_;
  std::unique_ptr<Executor> validator_;
};

// The run's record in its training state's config: the base, and the mode
// and adapter settings it trained with.
std::string run_config(const FinetuneArgs& a, const nn::LoraConfig& lora, const FinetuneDataOptions& data) {
  nlohmann::json j = {{"architecture", "finetune"}, {"base", fs::absolute(a.base).string()}, {"full", a.full}};
  if (!data.today.empty()) j["chat_date"] = data.today;
  if (!a.full) {
    j["lora"] = {{"r", lora.r},           {"alpha", lora.alpha}, {"dropout", lora.dropout},
                 {"rslora", lora.rslora}, {"dora", lora.dora},   {"targets", lora.targets}};
  }
  return j.dump();
}

// "weight matrices kept as Q8_0: 137.2 MiB" for a base whose weights stayed in
// their storage types (QLoRA); "" when every weight is f32.
std::string stored_weights(const nn::Params& params) {
  std::vector<std::string> types;
  double bytes = 0;
  for (const auto& [name, t] : params.list()) {
    const nn::StoredFormat* f = params.format(name);
    if (!f) continue;
    bytes += double(t.numel());
    if (std::find(types.begin(), types.end(), ggml_type_name(f->type)) == types.end()) {
      types.push_back(ggml_type_name(f->type));
    }
  }
  if (types.empty()) return "";
  std::string names;
  for (const std::string& t : types) names += (names.empty() ? "" : ", ") + t;
  return fmt::format("weight matrices kept as {}: {:.1f} MiB", names, bytes / 1048576.0);
}

}  // namespace

int run_finetune(const FinetuneArgs& a) {
  const std::string command = "finetune";
  // A resume with nabla's training state continues the run exactly; an
  // adapter folder without it starts a new run from its weights.
  std::optional<Checkpoint> state;
  if (!a.resume.empty() && models::FinetuneSession::has_state(a.resume)) {
    state = models::FinetuneSession::load_state(a.resume);
  }
  const uint64_t seed = state ? state->position.seed : a.seed;
  // SmolLM3's and Llama 3.2's templates date their system block; a resumed
  // run renders its examples with the date it began with, so that they stay
  // the same.
  FinetuneDataOptions dopt = chat_template_options(a.chat_template, models::checkpoint_chat_template(a.base), a.base);
  const ChatTemplate tmpl = dopt.chat_template;
  if (chat_template_is_dated(tmpl)) {
    const auto run = state ? nlohmann::json::parse(state->config_json, nullptr, false) : nlohmann::json();
    dopt.today = run.is_object() ? run.value("chat_date", "") : "";
    if (dopt.today.empty()) dopt.today = chat_date_today();
  }

  // The base, read whole, then frozen under the adapters (a full run
  // resumes from its own saved model).
  models::FinetuneConfig fc;
  fc.lora = a.full ? nn::LoraConfig{.r = 0}
                   : nn::LoraConfig{.r = a.lora_r, .alpha = a.lora_alpha, .dropout = a.lora_dropout,
                                    .rslora = a.rslora, .dora = a.dora, .targets = lora_targets(a.lora_targets)};
  fc.batch = a.batch;
  fc.context = a.context;
  fc.micro_batches = a.grad_accum;
  fc.adamw.weight_decay = a.weight_decay;  // transformers' defaults otherwise: betas (0.9, 0.999), eps 1e-8
  fc.exec = exec_options(a);
  fc.seed = seed;
  fc.gradient_checkpointing = a.gradient_checkpointing;
  fc.replicas = a.replicas;
  fc.comm = a.comm;
  fc.shard_optimizer = a.shard_optimizer;
  if (a.comm) {
    std::string data;
    for (const std::string& path : {a.data, a.val_data}) data += path.empty() ? "" : read_file(path);
    dist::check_same(*a.comm, "the fine-tuning data",
                     fmt::format("{} bytes, hash {}{}", data.size(), dist::fingerprint(data.data(), data.size()),
                                 dopt.today.empty() ? "" : ", dated " + dopt.today));
  }
  models::FinetuneSession session(a.full && !a.resume.empty() ? a.resume : a.base, fc,
                                  a.full ? "" : a.resume);
  const models::LlamaConfig& cfg = session.config();
  const nn::LoraConfig& lora = session.settings().lora;
  const models::Llama& model = session.model();

  // The data, tokenized by the base's tokenizer.
  std::unique_ptr<Tokenizer> tok =
      make_tokenizer(a.tokenizer.empty() ? models::checkpoint_tokenizer(a.base, cfg.tokenizer) : a.tokenizer, "");
  if (tok->vocab_size() > cfg.vocab_size) {
    throw UsageError(fmt::format("{}: the {} tokenizer has {} tokens, the model {}", command, tok->name(),
                                 tok->vocab_size(), cfg.vocab_size));
  }
  FinetuneSplit split;
  if (a.val_data.empty()) {
    split = split_validation(read_finetune_jsonl(a.data, *tok, dopt), a.val_fraction, seed);
  } else {
    split.train = read_finetune_jsonl(a.data, *tok, dopt);
    split.val = read_finetune_jsonl(a.val_data, *tok, dopt);
  }
  if (split.val.empty()) {
    throw UsageError(fmt::format("{}: no validation examples from {} training examples (give --val-data, or more "
                                 "examples)", command, split.train.size()));
  }
  const int64_t B = session.settings().batch, T = session.settings().context;
  const auto mode = a.pad ? FinetuneBatcher::Mode::pad : FinetuneBatcher::Mode::pack;
  const int32_t pad_id = tok->eot_id() >= 0 ? tok->eot_id() : 0;
  const int64_t n_train = int64_t(split.train.size()), n_val = int64_t(split.val.size());
  FinetuneBatcher train_batches(std::move(split.train), B, T, mode, seed, pad_id);
  FinetuneBatcher val_batches(std::move(split.val), B, T, mode, seed, pad_id);
  if (train_batches.counted_tokens_total() == 0) {  // a zero loss to train on: a context too short for the prompts
    throw UsageError(fmt::format("{}: no training example keeps a token to learn within a context of {} tokens ({} of "
                                 "{} truncated); give a longer --context",
                                 command, T, train_batches.truncated(), n_train));
  }
  FinetuneTask task(session, std::move(train_batches), std::move(val_batches), a.threads);

  const std::string config_json = run_config(a, lora, dopt);
  TrainingLoopOptions options{.command = command,
                              .epochs = a.epochs,
                              .min_lr_fraction = 0.0,
                              .examples_per_step = B * a.grad_accum,
                              .items_per_step = B * T * a.grad_accum,
                              .items = "tokens",
                              .rate_unit = "tok/s",
                              .batch = fmt::format("{} x {} tokens{}", B, T,
                                                   a.grad_accum > 1 ? fmt::format(" x {} accumulated", a.grad_accum)
                                                                    : ""),
                              .eval_name = "validation",
                              .config_json = config_json,
                              .micro_batches = a.grad_accum};
  options.save = [&](const optim::AdamW& optimizer, const TrainPosition& pos) {
    session.save(a.save, config_json, &pos, &optimizer);
  };
  TrainingLoop loop(session.step(), task, session.trained(), a, std::move(options), state ? &*state : nullptr);

  fmt::print("base: {} ({:.2f}M parameters{}), {} layers, width {}\n", a.base, model.params().count() / 1e6,
             a.full ? "" : ", frozen", cfg.num_hidden_layers, cfg.hidden_size);
  if (const std::string stored = stored_weights(model.params()); !stored.empty()) fmt::print("{}\n", stored);
  if (a.gradient_checkpointing) fmt::print("gradient checkpointing: blocks and logits recomputed in the backward\n");
  if (a.full) {
    fmt::print("full fine-tuning: every parameter trains\n");
  } else {
    std::string targets;
    for (const std::string& t : lora.targets) targets += (targets.empty() ? "" : ",") + t;
    fmt::print("{} r {}, alpha {} (scale {:.4g}{}), dropout {}, on {}: {:.3f}M parameters train\n",
               lora.dora ? "DoRA" : "LoRA", lora.r, lora.alpha, lora.scale(), lora.rslora ? ", rsLoRA" : "",
               lora.dropout, targets, model.adapter().count() / 1e6);
  }
  fmt::print("data: {} training and {} validation examples, {} template, {} tokenizer; {} to {} tokens{}\n",
             n_train, n_val, chat_template_name(tmpl), tok->name(), a.pad ? "padded" : "packed", T,
             task.truncated() == 0 ? ""
             : fmt::format(" ({} examples truncated{})", task.truncated(),
                           task.truncated_uncounted() > 0
                               ? fmt::format(", {} of them losing every counted token", task.truncated_uncounted())
                               : ""));
  fmt::print("{}\n", loop.describe());
  if (!state && a.resume.empty() && (!a.comm || a.comm->rank() == 0)) {
    // B starts at zero (or nothing has trained yet): the base's own loss.
    const Evaluation before = task.evaluate();
    fmt::print("validation loss before fine-tuning: {:.4f} ({} counted tokens)\n", before.loss, before.count);
  }
  std::fflush(stdout);
  loop.run();
  return kExitOk;
}

}  // namespace nabla::cli
