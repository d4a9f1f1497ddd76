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
#include "nabla/models/lora.h"
#include "nabla/tokenizer.h"
#include "nabla/trainer.h"
#include "train_loop.h"

namespace nabla::cli {

namespace {

namespace fs = std::filesystem;

const char* kStateFile = "training_state.safetensors";

// --lora-targets' short names for Hugging Face's modules.
std::vector<std::string> lora_targets(const std::vector<std::string>& given) {
  if (given.empty()) return models::llama_lora_modules();
  std::vector<std::string> out;
  for (const std::string& t : given) {
    const std::string name = t.ends_with("_proj") ? t : t + "_proj";
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

// The Jinja chat template that comes with the base (GGUF's
// tokenizer.chat_template, a folder's tokenizer_config.json), or "".
std::string base_chat_template(const std::string& base) {
  std::error_code ec;
  if (fs::is_directory(base, ec)) {
    const fs::path config = fs::path(base) / "tokenizer_config.json";
    if (!fs::exists(config, ec)) return "";
    const nlohmann::json j = nlohmann::json::parse(read_file(config.string()), nullptr, false);
    if (!j.is_object()) throw IoError(config.string() + ": not a JSON object");
    const auto t = j.find("chat_template");
    return t != j.end() && t->is_string() ? t->get<std::string>() : "";
  }
  if (!is_gguf_file(base)) return "";
  const GgufFile f = read_gguf_metadata(base);
  const GgufValue* v = f.find_value("tokenizer.chat_template");
  return v && v->type() == GgufType::string ? v->get<std::string>() : "";
}

ChatTemplate chat_template(const FinetuneArgs& a) {
  if (a.chat_template != "auto") return parse_chat_template(a.chat_template);
  return recognize_chat_template(base_chat_template(a.base)).value_or(ChatTemplate::chatml);
}

// The step's inputs: one micro-batch of B rows of T tokens with their
// documents' segment ids, and the weight of its mean loss in the step (its
// share of the step's counted tokens). The model needs no positions: a
// packed document's rotary attention is the same from any offset.
struct BatchLeaves {
  Tensor ids, labels, segments, weight;
  std::vector<int32_t> positions;
  BatchLeaves(int64_t B, int64_t T)
      : ids(Tensor::zeros(DType::i32, {B, T}).set_name("input_ids")),
        labels(Tensor::zeros(DType::i32, {B, T}).set_name("labels")),
        segments(Tensor::zeros(DType::i32, {B, T}).set_name("segments")),
        weight(Tensor::full(DType::f32, {}, 1.0).set_name("loss_weight")),
        positions(size_t(B * T)) {}
  void load(const FinetuneBatcher& b, int64_t index) {
    b.batch(index, ids.data_as<int32_t>(), labels.data_as<int32_t>(), positions.data(), segments.data_as<int32_t>());
  }
};

// Examples in batches by (seed, epoch); a step of M micro-batches takes M
// consecutive batches, each weighted by its counted tokens over the step's
// (transformers' num_items_in_batch), so the step's gradient is that of the
// mean over all the step's counted tokens whatever the padding.
class FinetuneTask : public TrainingTask {
 public:
  FinetuneTask(const models::Llama& model, FinetuneBatcher train, FinetuneBatcher val, BatchLeaves& leaves,
               int micro_batches, int threads)
      : model_(model), train_(std::move(train)), val_(std::move(val)), leaves_(leaves), micro_(micro_batches),
        val_leaves_(leaves.ids.dim(0), leaves.ids.dim(1)) {
    train_.start_epoch(0);
    val_.start_in_order();
    val_loss_ = model.loss(val_leaves_.ids, val_leaves_.labels, false, val_leaves_.segments);
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
    float& weight = leaves_.weight.data_as<float>()[0];
    if (index >= train_.batches_per_epoch() || step_tokens == 0) {
      // A step past the epoch's last batch: nothing counted, nothing learnt.
      std::fill_n(leaves_.labels.data_as<int32_t>(), leaves_.labels.numel(), -100);
      weight = 0;
    } else {
      leaves_.load(train_, index);
      weight = float(double(train_.counted_tokens(index)) * micro_ / double(step_tokens));
    }
    Tensor seed = model_.lora_dropout_seed();
    if (seed.defined()) seed.data_as<int32_t>()[0] = step_seed(pos.seed, pos.step * micro_ + m);
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
  const models::Llama& model_;
  FinetuneBatcher train_, val_;
  BatchLeaves& leaves_;
  int64_t micro_;
  BatchLeaves val_leaves_;
  Tensor val_loss_;
  std::unique_ptr<Executor> validator_;
};

// The finetune run's own record, saved with its training state: what a
// resume must agree with.
std::string run_config(const FinetuneArgs& a, const nn::LoraConfig& lora) {
  nlohmann::json j = {{"architecture", "finetune"}, {"base", fs::absolute(a.base).string()}, {"full", a.full}};
  if (!a.full) {
    j["lora"] = {{"r", lora.r}, {"alpha", lora.alpha}, {"dropout", lora.dropout}, {"rslora", lora.rslora},
                 {"targets", lora.targets}};
  }
  return j.dump();
}

}  // namespace

int run_finetune(const FinetuneArgs& a) {
  const std::string command = "finetune";
  // The base: every weight read, then frozen under the adapters.
  models::LlamaConfig cfg;
  std::unique_ptr<models::Llama> model;
  {
    const Checkpoint base = models::load_any_checkpoint(a.full && !a.resume.empty() ? a.resume : a.base);
    if (base.architecture != "llama") {
      throw UsageError(fmt::format("{}: {} is a{} model; fine-tuning takes the Llama family", command, base.path,
                                   base.architecture.empty() ? "n unknown" : " " + base.architecture));
    }
    cfg = models::llama_config_from_checkpoint(base);
    model = std::make_unique<models::Llama>(cfg, a.seed);
    load_params(base, model->params());
  }

  // LoRA's settings: the command line's, or the resumed adapter's.
  nn::LoraConfig lora{.r = a.lora_r, .alpha = a.lora_alpha, .dropout = a.lora_dropout, .rslora = a.rslora,
                      .targets = lora_targets(a.lora_targets)};
  std::optional<models::PeftAdapter> adapter;
  if (!a.full && !a.resume.empty()) {
    adapter = models::load_peft_adapter(a.resume);
    lora = adapter->config;
  }
  if (!a.full) {
    model->add_lora(lora, a.seed);
    if (adapter) models::load_adapter_weights(*adapter, *model);
  }
  nn::Params& trained = a.full ? model->params() : model->adapter();

  // A resume with nabla's training state continues the run exactly; an
  // adapter folder without it starts a new run from its weights.
  std::optional<Checkpoint> state;
  if (!a.resume.empty() && fs::exists(fs::path(a.resume) / kStateFile)) {
    state = load_checkpoint((fs::path(a.resume) / kStateFile).string());
    if (!state->has_position) throw IoError(state->path + ": has no training position (\"nabla.train\")");
  }
  const uint64_t seed = state ? state->position.seed : a.seed;

  // The data, tokenized by the base's tokenizer.
  std::unique_ptr<Tokenizer> tok =
      make_tokenizer(a.tokenizer.empty() ? models::checkpoint_tokenizer(a.base, cfg.tokenizer) : a.tokenizer, "");
  if (tok->vocab_size() > cfg.vocab_size) {
    throw UsageError(fmt::format("{}: the {} tokenizer has {} tokens, the model {}", command, tok->name(),
                                 tok->vocab_size(), cfg.vocab_size));
  }
  const ChatTemplate tmpl = chat_template(a);
  const FinetuneDataOptions dopt{.chat_template = tmpl};
  FinetuneSplit split;
  if (a.val_data.empty()) {
    split = split_validation(read_finetune_jsonl(a.data, *tok, dopt), a.val_fraction, seed);
  } else {
    split.train = read_finetune_jsonl(a.data, *tok, dopt);
    split.val = read_finetune_jsonl(a.val_data, *tok, dopt);
  }
  const int64_t B = a.batch, T = a.context > 0 ? a.context : std::min<int64_t>(cfg.max_position_embeddings, 512);
  if (T > cfg.max_position_embeddings) {
    throw UsageError(fmt::format("{}: --context {} exceeds the model's {} positions", command, T,
                                 cfg.max_position_embeddings));
  }
  const auto mode = a.pad ? FinetuneBatcher::Mode::pad : FinetuneBatcher::Mode::pack;
  const int32_t pad_id = tok->eot_id() >= 0 ? tok->eot_id() : 0;
  const int64_t n_train = int64_t(split.train.size()), n_val = int64_t(split.val.size());
  FinetuneBatcher train_batches(std::move(split.train), B, T, mode, seed, pad_id);
  FinetuneBatcher val_batches(std::move(split.val), B, T, mode, seed, pad_id);

  // The step: the micro-batch's loss weighted for its share of the step.
  BatchLeaves leaves(B, T);
  const Tensor loss = model->loss(leaves.ids, leaves.labels, /*train=*/true, leaves.segments) * leaves.weight;
  optim::AdamWConfig adamw;  // transformers' defaults: betas (0.9, 0.999), eps 1e-8
  adamw.weight_decay = a.weight_decay;
  TrainStep step(loss, trained, {}, adamw, exec_options(a), a.grad_accum);
  FinetuneTask task(*model, std::move(train_batches), std::move(val_batches), leaves, a.grad_accum, a.threads);

  const std::string config_json = run_config(a, lora);
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
  const std::string base_name = a.base;
  options.save = [&](const optim::AdamW& optimizer, const TrainPosition& pos) {
    if (a.full) {
      save_hf_folder(a.save, cfg.to_json(), model->params());
    } else {
      models::save_peft_adapter(a.save, lora, model->adapter(), base_name);
    }
    // The moments and position alone: the weights are the folder's own.
    save_checkpoint((fs::path(a.save) / kStateFile).string(), config_json, nn::Params(), &optimizer, &pos);
  };
  TrainingLoop loop(step, task, trained, a, std::move(options), state ? &*state : nullptr);

  fmt::print("base: {} ({:.2f}M parameters{}), {} layers, width {}\n", a.base, model->params().count() / 1e6,
             a.full ? "" : ", frozen", cfg.num_hidden_layers, cfg.hidden_size);
  if (a.full) {
    fmt::print("full fine-tuning: every parameter trains\n");
  } else {
    std::string targets;
    for (const std::string& t : lora.targets) targets += (targets.empty() ? "" : ",") + t;
    fmt::print("LoRA r {}, alpha {} (scale {:.4g}{}), dropout {}, on {}: {:.3f}M parameters train\n", lora.r,
               lora.alpha, lora.scale(), lora.rslora ? ", rsLoRA" : "", lora.dropout, targets,
               model->adapter().count() / 1e6);
  }
  fmt::print("data: {} training and {} validation examples, {} template, {} tokenizer; {} to {} tokens{}\n",
             n_train, n_val, chat_template_name(tmpl), tok->name(), a.pad ? "padded" : "packed", T,
             task.truncated() == 0 ? ""
             : fmt::format(" ({} examples truncated{})", task.truncated(),
                           task.truncated_uncounted() > 0
                               ? fmt::format(", {} of them losing every counted token", task.truncated_uncounted())
                               : ""));
  fmt::print("{}\n", loop.describe());
  if (!state && !adapter) {
    // B starts at zero: this is the base's own loss on the counted tokens.
    const Evaluation before = task.evaluate();
    fmt::print("validation loss before fine-tuning: {:.4f} ({} counted tokens)\n", before.loss, before.count);
  }
  std::fflush(stdout);
  loop.run();
  return kExitOk;
}

}  // namespace nabla::cli
