// `nabla train gpt2`: trains GPT-2 from scratch on real text (Debian's
// fortunes by default) through nabla's autodiff. The batches are random
// windows chosen from (seed, step) alone, so a run resumes bit-identically.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "nabla/models/gpt2.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/text_data.h"
#include "nabla/trainer.h"
#include "vit_common.h"

namespace nabla::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int32_t step_seed(uint64_t seed, int64_t step) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + uint64_t(step) + 1;
  z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
  return static_cast<int32_t>(z >> 33);
}

// Mean loss over a fixed set of validation windows (the same every time).
class Gpt2Validator {
 public:
  Gpt2Validator(const models::Gpt2& model, std::span<const int32_t> tokens, int64_t batch, int64_t context,
                int64_t batches, uint64_t seed, int threads)
      : batcher_(tokens, batch, context, seed), batches_(batches) {
    tokens_ = Tensor::zeros(DType::i32, {batch, context + 1});
    loss_ = model.next_token_loss(tokens_, /*train=*/false);
    executor_ = std::make_unique<Executor>(Graph({loss_}), ExecOptions{.threads = threads});
  }
  double run() {
    double total = 0;
    for (int64_t i = 0; i < batches_; ++i) {
      batcher_.batch(i, tokens_.data_as<int32_t>());
      executor_->run();
      total += executor_->read<float>(loss_)[0];
    }
    return total / double(batches_);
  }

 private:
  TextBatcher batcher_;
  int64_t batches_;
  Tensor tokens_, loss_;
  std::unique_ptr<Executor> executor_;
};

}  // namespace

int run_train_gpt2(const TrainGpt2Args& a) {
  models::Gpt2Config cfg;
  TrainPosition pos;
  pos.seed = a.seed;
  std::optional<Checkpoint> resume;
  if (!a.resume.empty()) {
    resume = load_checkpoint(a.resume);
    if (!resume->has_position) throw IoError(a.resume + ": has no training position (\"nabla.train\")");
    cfg = models::gpt2_config_from_checkpoint(*resume);
    pos = resume->position;
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

  models::Gpt2 model(cfg, pos.seed);
  if (resume) load_params(*resume, model.params());
  TextBatcher batcher(text.train, B, T, pos.seed);

  Tensor tokens = Tensor::zeros(DType::i32, {B, T + 1}).set_name("tokens");
  Tensor loss = model.next_token_loss(tokens, /*train=*/true);
  optim::AdamWConfig adamw;
  adamw.beta2 = 0.95;  // GPT-2 / nanoGPT
  adamw.weight_decay = a.weight_decay;
  const bool low_memory =
      a.low_memory || a.whole_gradients ? a.low_memory : default_low_memory(model.params().count());
  TrainStep step(loss, model.params(), {}, adamw,
                 ExecOptions{.threads = a.threads, .check_finite = a.check_finite, .bf16_matmul = a.bf16_matmul}, 1,
                 low_memory);
  if (resume) load_optimizer_state(*resume, step.optimizer());
  Gpt2Validator validator(model, text.val, B, T, a.eval_batches, pos.seed + 1, a.threads);

  fmt::print("GPT-2 '{}' ({:.2f}M parameters): {} layers, {} heads, width {}, context {}, {} tokenizer ({} tokens)\n",
             cfg.preset, model.params().count() / 1e6, cfg.n_layer, cfg.n_head, cfg.n_embd, T, tok->name(),
             tok->vocab_size());
  fmt::print("text: {} documents from {} file(s), {} training and {} validation tokens{}\n", text.documents,
             text.files.size(), text.train.size(), text.val.size(), text.from_cache ? " (cached)" : "");
  fmt::print("training: {} steps of {} x {} tokens, AdamW lr {} (warmup {}, cosine), wd {}, matmul {}, {} threads; "
             "arena {:.1f} MiB planned ({:.1f} MiB without reuse)\n",
             a.steps, B, T, a.lr, a.warmup, a.weight_decay, a.bf16_matmul ? "bf16" : "f32", step.executor().threads(),
             step.executor().memory().arena_bytes / 1048576.0, step.executor().memory().unplanned_bytes / 1048576.0);
  // By default it is said only where it factors something (a large model
  // at few tokens per step).
  if (low_memory && (a.low_memory || step.factored_gradients() > 0)) {
    fmt::print("low memory: {} weight gradients kept as their factors\n", step.factored_gradients());
  }
  if (resume) fmt::print("resumed from {} at step {}\n", a.resume, pos.step);
  std::fflush(stdout);

  TrainLogFiles logs(a.save, a.log, resume.has_value(), "tokens_per_s");
  Progress progress(a.log_every);
  auto start = Clock::now();
  int64_t steps_this_run = 0, window_steps = 0;
  double window_loss = 0, last_val = NAN;
  auto window_start = Clock::now();
  auto evaluate_and_save = [&]() {
    progress.finish();
    last_val = validator.run();
    fmt::print("step {}: validation loss {:.4f}, {} elapsed\n", pos.step, last_val,
               format_duration(seconds_since(start)));
    std::fflush(stdout);
    TrainRow row;
    row.step = pos.step;
    row.val_loss = last_val;
    row.elapsed_s = seconds_since(start);
    logs.row(row);
    if (!a.save.empty()) {
      save_checkpoint(a.save, cfg.to_json(), model.params(), &step.optimizer(), &pos);
      logs.plot();
    }
  };
  // --max-steps stops early; the schedule still spans --steps, so a resumed run continues it.
  const int64_t last = a.max_steps > 0 ? std::min(a.max_steps, a.steps) : a.steps;
  // --max-minutes counts training time only (batches, steps, updates), not
  // validation, so budgets compare across frameworks and eval settings.
  double train_seconds = 0;
  bool out_of_time = false;
  while (pos.step < last && !out_of_time) {
    auto step_start = Clock::now();
    batcher.batch(pos.step, tokens.data_as<int32_t>());
    model.dropout_seed.data_as<int32_t>()[0] = step_seed(pos.seed, pos.step);
    step.run();
    double lr = optim::warmup_cosine(pos.step, a.warmup, a.steps, a.lr, a.lr * 0.1);
    step.update(lr, a.clip);
    ++pos.step;
    ++steps_this_run;
    train_seconds += seconds_since(step_start);
    out_of_time = a.max_minutes > 0 && train_seconds >= 60 * a.max_minutes;
    float l = step.loss();
    if (!std::isfinite(l)) {
      throw Error(fmt::format("train gpt2: the loss became {} at step {}; try a lower --lr", l, pos.step));
    }
    window_loss += l;
    ++window_steps;
    double elapsed = seconds_since(start);
    double rate = double(steps_this_run * B * T) / std::max(train_seconds, 1e-9);  // training only
    bool report = window_steps >= a.log_every || pos.step == last || out_of_time;
    progress.update(fmt::format("step {}/{} loss {:.4f} {:.0f} tok/s lr {:.2e} ETA {}", pos.step, a.steps,
                                window_loss / window_steps, rate, lr,
                                format_duration(double(last - pos.step) * B * T / rate)),
                    report);
    if (report) {
      TrainRow row;
      row.step = pos.step;
      row.train_loss = window_loss / window_steps;
      row.throughput = double(window_steps * B * T) / seconds_since(window_start);
      row.lr = lr;
      row.elapsed_s = elapsed;
      logs.row(row);
      window_loss = 0;
      window_steps = 0;
      window_start = Clock::now();
    }
    if (pos.step % a.eval_every == 0 || pos.step == last || out_of_time) evaluate_and_save();
  }
  // --steps 0 (or a resume at its end): the model as it stands, evaluated and saved.
  if (steps_this_run == 0) evaluate_and_save();
  progress.finish();
  fmt::print("done: {} steps in {} of training ({:.0f} tokens/s); final validation loss {:.4f}\n", steps_this_run,
             format_duration(train_seconds), steps_this_run * B * T / std::max(train_seconds, 1e-9), last_val);
  if (!a.save.empty()) fmt::print("checkpoint: {}\n", a.save);
  std::string profile = step.executor().profile();
  if (!profile.empty()) fmt::print("kernel time per op (training step):\n{}", profile);
  return kExitOk;
}

}  // namespace nabla::cli
