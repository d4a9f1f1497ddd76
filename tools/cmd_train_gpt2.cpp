// `nabla train gpt2`: trains GPT-2 from scratch on real text (Debian's
// fortunes by default) through nabla's autodiff. The batches are random
// windows chosen from (seed, step) alone, so a run resumes bit-identically.
#include <fmt/format.h>

#include <cstdio>

#include "commands.h"
#include "nabla/models/gpt2.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/text_data.h"
#include "nabla/trainer.h"
#include "train_loop.h"

namespace nabla::cli {

namespace {

// Random windows of the training text chosen by (seed, step); the mean loss
// over a fixed set of validation windows (the same every time).
class Gpt2Task : public TrainingTask {
 public:
  Gpt2Task(const models::Gpt2& model, const Tensor& tokens, std::span<const int32_t> train,
           std::span<const int32_t> val, int64_t batch, int64_t context, int64_t eval_batches, uint64_t seed,
           int threads)
      : dropout_seed_(model.dropout_seed), tokens_(tokens), batcher_(train, batch, context, seed), val_batcher_(val, batch, context, seed + 1),
        eval_batches_(eval_batches) {
    val_tokens_ = Tensor::zeros(DType::i32, {batch, context + 1});
    val_loss_ = model.next_token_loss(val_tokens_, /*train=*/false);
    validator_ = std::make_unique<Executor>(Graph({val_loss_}), ExecOptions{.threads = threads});
  }

  int64_t batches_per_epoch() const override { return 0; }

  void load_batch(const TrainPosition& pos) override {
    batcher_.batch(pos.step, tokens_.data_as<int32_t>());
    dropout_seed_.data_as<int32_t>()[0] = step_seed(pos.seed, pos.step);
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
  Tensor dropout_seed_, tokens_;
  TextBatcher batcher_, val_batcher_;
  int64_t eval_batches_;
  Tensor val_tokens_, val_loss_;
  std::unique_ptr<Executor> validator_;
};

}  // namespace

int run_train_gpt2(const TrainGpt2Args& a) {
  models::Gpt2Config cfg;
  const std::optional<Checkpoint> resume = load_resume_checkpoint(a);
  const uint64_t seed = resume ? resume->position.seed : a.seed;
  if (resume) {
    cfg = models::gpt2_config_from_checkpoint(*resume);
  } else {
    cfg = models::gpt2_preset(a.preset);
    if (!a.tokenizer.empty()) cfg.tokenizer = a.tokenizer;
    if (cfg.tokenizer == "gpt2") cfg.vocab_size = std::max<int64_t>(cfg.vocab_size, 50257);
    if (a.dropout >= 0) cfg.dropout = a.dropout;
    if (a.n_layer > 0) cfg.n_layer = a.n_layer;
    if (a.n_head > 0) cfg.n_head = a.n_head;
    if (a.n_embd > 0) cfg.n_embd = a.n_embd;
    if (a.n_positions > 0) cfg.n_positions = a.n_positions;
    cfg.validate();
  }
  const int64_t B = a.batch, T = a.context > 0 ? a.context : std::min<int64_t>(cfg.n_positions, 256);
  if (T > cfg.n_positions) {
    throw UsageError(fmt::format("train gpt2: --context {} exceeds the model's {} positions", T, cfg.n_positions));
  }
  std::unique_ptr<Tokenizer> tok = make_tokenizer(cfg.tokenizer, a.vocab);
  if (tok->vocab_size() > cfg.vocab_size) {
    throw UsageError(fmt::format("train gpt2: the {} tokenizer has {} tokens, the model {}", tok->name(),
                                 tok->vocab_size(), cfg.vocab_size));
  }
  TextDataOptions topt;
  topt.path = a.text;
  TextDataset text = load_text_dataset(*tok, topt);
  if (int64_t(text.train.size()) <= T + 1 || int64_t(text.val.size()) <= T + 1) {
    throw UsageError(fmt::format("train gpt2: the text has {} training and {} validation tokens, too few for "
                                 "windows of {}",
                                 text.train.size(), text.val.size(), T + 1));
  }

  models::Gpt2 model(cfg, seed);
  if (resume) load_params(*resume, model.params());

  Tensor tokens = Tensor::zeros(DType::i32, {B, T + 1}).set_name("tokens");
  Tensor loss = model.next_token_loss(tokens, /*train=*/true);
  optim::AdamWConfig adamw;
  adamw.beta2 = 0.95;  // GPT-2 / nanoGPT
  adamw.weight_decay = a.weight_decay;
  const bool low_memory =
      a.low_memory || a.whole_gradients ? a.low_memory : default_low_memory(model.params().count());
  TrainStep step(loss, model.params(), {}, adamw, exec_options(a), 1, low_memory);
  Gpt2Task task(model, tokens, text.train, text.val, B, T, a.eval_batches, seed, a.threads);
  TrainingLoop loop(step, task, model.params(), a,
                    {.command = "train gpt2",
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

  fmt::print("GPT-2 '{}' ({:.2f}M parameters): {} layers, {} heads, width {}, context {}, {} tokenizer ({} tokens)\n",
             cfg.preset, model.params().count() / 1e6, cfg.n_layer, cfg.n_head, cfg.n_embd, T, tok->name(),
             tok->vocab_size());
  fmt::print("text: {} documents from {} file(s), {} training and {} validation tokens{}\n", text.documents,
             text.files.size(), text.train.size(), text.val.size(), text.from_cache ? " (cached)" : "");
  fmt::print("{}\n", loop.describe());
  // By default it is said only where it factors something (a large model
  // at few tokens per step).
  if (low_memory && (a.low_memory || step.factored_gradients() > 0)) {
    fmt::print("low memory: {} weight gradients kept as their factors\n", step.factored_gradients());
  }
  std::fflush(stdout);
  loop.run();
  return kExitOk;
}

}  // namespace nabla::cli
