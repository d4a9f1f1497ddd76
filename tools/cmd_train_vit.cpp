// `nabla train vit`: trains a vanilla ViT (LayerNorm, GELU MLP, conv patch
// embedding) from scratch through nabla's autodiff on an image dataset, by
// default the real Fashion-MNIST that Debian's dataset-fashion-mnist installs.
//
// The forward, loss, backward and optimizer are planned once; each step
// writes a new batch into the input leaves and runs the same plan.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>

#include "commands.h"
#include "nabla/models/vit.h"
#include "nabla/checkpoint.h"
#include "nabla/data.h"
#include "nabla/error.h"
#include "nabla/trainer.h"
#include "vit_common.h"

namespace nabla::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Per-step dropout seed: a pure function of (run seed, step), so a resumed run
// draws the same masks.
int32_t step_seed(uint64_t seed, int64_t step) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + uint64_t(step) + 1;
  z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
  return static_cast<int32_t>(z >> 33);
}

}  // namespace

int run_train_vit(const TrainVitArgs& a) {
  // ---- Model and data.
  models::VitConfig cfg;
  TrainPosition pos;
  pos.seed = a.seed;
  std::optional<Checkpoint> resume;
  if (!a.resume.empty()) {
    resume = load_checkpoint(a.resume);
    if (!resume->has_position) {
      throw IoError(a.resume + ": has no training position (\"nabla.train\"); it is a weights-only checkpoint");
    }
    cfg = models::vit_config_from_checkpoint(*resume);
    pos = resume->position;
  } else {
    cfg = models::vit_preset(a.preset);
    if (a.drop_rate >= 0) cfg.drop_rate = a.drop_rate;
    if (a.patch_size) cfg.patch_size = a.patch_size;
    if (a.embed_dim) cfg.embed_dim = a.embed_dim;
    if (a.depth) cfg.depth = a.depth;
    if (a.heads) cfg.num_heads = a.heads;
    if (a.mlp_ratio > 0) cfg.mlp_ratio = a.mlp_ratio;
    if (!a.pool.empty()) cfg.global_pool = a.pool;
    cfg.validate();
  }
  VitData data = load_vit_data(a.dataset, a.data, cfg);
  if (a.train_subset > 0 && a.train_subset < data.train.n) shrink(data.train, a.train_subset);
  if (a.test_subset > 0 && a.test_subset < data.test.n) shrink(data.test, a.test_subset);
  if (a.resize) {
    resize(data.train, cfg.in_chans, cfg.img_size);
    resize(data.test, cfg.in_chans, cfg.img_size);
    // Grey images replicated to every channel: one normalisation for all.
    data.normalize = Normalize{std::vector<float>(size_t(cfg.in_chans), data.normalize.mean.at(0)),
                               std::vector<float>(size_t(cfg.in_chans), data.normalize.std.at(0))};
    data.description += fmt::format(", resized to {}x{}x{}", cfg.in_chans, cfg.img_size, cfg.img_size);
  }
  check_fits(data, a.dataset, cfg);

  models::Vit model(cfg, pos.seed);
  if (resume) load_params(*resume, model.params());

  const int64_t B = a.batch, C = cfg.in_chans, S = cfg.img_size;
  const int crop_pad = a.crop_pad >= 0 ? a.crop_pad : (a.dataset == "cifar10" ? 2 : 0);
  BatchLoader loader(data.train, B, /*shuffle=*/true, /*drop_last=*/true, Augment{crop_pad, a.hflip, a.erase_prob},
                     data.normalize, pos.seed);
  const int64_t per_epoch = loader.batches_per_epoch();
  if (per_epoch == 0) {
    throw UsageError(fmt::format("train vit: batch {} is larger than the {} training images", B, data.train.n));
  }
  // The schedule spans every epoch; --max-steps only stops early, so a run cut
  // short and resumed follows the same learning rates as one that was not.
  const int64_t schedule_steps = per_epoch * a.epochs;
  int64_t total_steps = a.max_steps > 0 ? std::min<int64_t>(a.max_steps, schedule_steps) : schedule_steps;

  // ---- The compiled training step, for one replica's share of the batch.
  const int R = a.replicas > 0 ? a.replicas : default_replicas(a.threads, B, model.params().count());
  if (B % R != 0) throw UsageError(fmt::format("train vit: --replicas {} does not divide the batch of {}", R, B));
  Tensor images = Tensor::zeros(DType::f32, {B / R, C, S, S}).set_name("images");
  Tensor labels = Tensor::zeros(DType::i32, {B / R}).set_name("labels");
  Tensor logits = model.forward(images, /*train=*/true);
  // Label smoothing as timm: cross-entropy against (1 - e) one-hot + e / K.
  const double e = a.label_smoothing;
  Tensor loss = e > 0 ? cross_entropy_soft(logits, one_hot(labels, cfg.num_classes) * (1 - e) + e / cfg.num_classes)
                      : cross_entropy(logits, labels);
  optim::AdamWConfig adamw;
  adamw.weight_decay = a.weight_decay;
  ExecOptions exec;
  exec.threads = a.threads;
  exec.check_finite = a.check_finite;
  exec.bf16_matmul = a.bf16_matmul;
  TrainStep step(loss, model.params(), {logits}, adamw, exec, 1, false, R);
  // The loader fills a whole batch; each replica takes its share.
  std::vector<float> batch_images(static_cast<size_t>(B * C * S * S));
  std::vector<int32_t> batch_labels(static_cast<size_t>(B));
  struct ReplicaLeaves {
    Tensor images, labels, logits, dropout_seed;
  };
  std::vector<ReplicaLeaves> replica;
  for (int r = 0; r < R; ++r) {
    replica.push_back({step.in_replica(r, images), step.in_replica(r, labels), step.in_replica(r, logits),
                       cfg.drop_rate > 0 ? step.in_replica(r, model.dropout_seed) : Tensor()});
  }
  if (resume) load_optimizer_state(*resume, step.optimizer());
  VitEvaluator evaluator(model, data.test, data.normalize, a.eval_batch, a.threads);

  fmt::print("ViT '{}' ({:.2f}M parameters): {}x{}x{} images, patch {}, dim {}, depth {}, heads {}, mlp {}, {}\n",
             cfg.preset, model.params().count() / 1e6, C, S, S, cfg.patch_size, cfg.embed_dim, cfg.depth,
             cfg.num_heads, cfg.mlp_hidden(), cfg.gelu);
  fmt::print("data: {} ({} train, {} test images, {} classes)\n", data.description, data.train.n, data.test.n,
             data.train.classes);
  fmt::print("training: {} epochs x {} steps of batch {}, AdamW lr {} (warmup {} steps, cosine), wd {}, "
             "augmentation: crop pad {}, hflip {}, random erasing {}, label smoothing {}; matmul {}, {} threads, "
             "{} replica(s); arena {:.1f} MiB planned ({:.1f} MiB without reuse){}\n",
             a.epochs, per_epoch, B, a.lr, a.warmup, a.weight_decay, crop_pad, a.hflip ? "on" : "off", a.erase_prob, e,
             a.bf16_matmul ? "bf16" : "f32", step.threads(), R, step.executor().memory().arena_bytes / 1048576.0,
             step.executor().memory().unplanned_bytes / 1048576.0, R > 1 ? " each" : "");
  if (resume) fmt::print("resumed from {} at step {} (epoch {}, batch {})\n", a.resume, pos.step, pos.epoch + 1, pos.batch);
  std::fflush(stdout);

  TrainLogFiles logs(a.save, a.log, resume.has_value());
  Progress progress(a.log_every);
  auto start = Clock::now();
  int64_t steps_this_run = 0;
  double window_loss = 0;
  int64_t window_correct = 0, window_seen = 0, window_steps = 0;
  auto window_start = Clock::now();
  double last_eval_acc = -1;

  for (int64_t epoch = pos.epoch; epoch < a.epochs && pos.step < total_steps; ++epoch) {
    loader.start_epoch(epoch);
    if (epoch == pos.epoch && pos.batch > 0) loader.skip(pos.batch);
    pos.epoch = epoch;
    while (pos.step < total_steps && loader.next(batch_images.data(), batch_labels.data())) {
      for (int r = 0; r < R; ++r) {
        const int64_t n = B / R, pixels = n * C * S * S;
        std::copy_n(batch_images.data() + r * pixels, pixels, replica[r].images.data_as<float>());
        std::copy_n(batch_labels.data() + r * n, n, replica[r].labels.data_as<int32_t>());
        // Replicas draw different masks; replica 0 the seed a single one would.
        if (Tensor& seed = replica[r].dropout_seed; seed.defined()) {
          seed.data_as<int32_t>()[0] = int32_t(uint32_t(step_seed(pos.seed, pos.step)) + uint32_t(r) * 0x9e3779b9u);
        }
      }
      step.run();
      double lr = optim::warmup_cosine(pos.step, a.warmup, schedule_steps, a.lr, a.lr * 0.01);
      step.update(lr, a.clip);
      ++pos.step;
      ++steps_this_run;
      pos.batch = loader.batch_index();

      float l = step.loss();
      if (!std::isfinite(l)) {
        throw Error(fmt::format("train vit: the loss became {} at step {}; try a lower --lr", l, pos.step));
      }
      window_loss += l;
      for (int r = 0; r < R; ++r) {
        window_correct +=
            count_correct(step.executor(r).read<float>(replica[r].logits), replica[r].labels, cfg.num_classes);
      }
      window_seen += B;
      ++window_steps;
      double elapsed = seconds_since(start);
      double rate = double(steps_this_run * B) / elapsed;
      double eta = double(total_steps - pos.step) * B / rate;
      if (a.max_minutes > 0 && elapsed > 60 * a.max_minutes) total_steps = pos.step;  // out of time: wrap up
      bool report = window_steps >= a.log_every || pos.step == total_steps;
      progress.update(fmt::format("epoch {}/{} step {}/{} loss {:.4f} acc {:.1f}% {:.0f} img/s lr {:.2e} ETA {}",
                                  epoch + 1, a.epochs, pos.step, total_steps, window_loss / window_steps,
                                  100.0 * window_correct / window_seen, rate, lr, format_duration(eta)),
                      report);
      if (report) {
        TrainRow row;
        row.step = pos.step;
        row.epoch = epoch + double(loader.batch_index()) / per_epoch;
        row.train_loss = window_loss / window_steps;
        row.train_acc = double(window_correct) / window_seen;
        row.throughput = double(window_seen) / seconds_since(window_start);
        row.lr = lr;
        row.elapsed_s = elapsed;
        logs.row(row);
        window_loss = 0;
        window_correct = window_seen = window_steps = 0;
        window_start = Clock::now();
      }
      // Mid-epoch checkpoints; the epoch's last step saves below, after evaluating.
      if (a.save_every > 0 && !a.save.empty() && pos.step % a.save_every == 0 && pos.step < total_steps &&
          loader.batch_index() < per_epoch) {
        save_checkpoint(a.save, cfg.to_json(), model.params(), &step.optimizer(), &pos);
      }
    }
    bool epoch_done = loader.batch_index() >= per_epoch;
    if (epoch_done || pos.step == total_steps) {
      progress.finish();
      EvalResult ev = evaluator.run();
      last_eval_acc = ev.accuracy;
      fmt::print("epoch {}/{}: test loss {:.4f}, test accuracy {:.2f}% ({} images), {} elapsed\n", epoch + 1,
                 a.epochs, ev.loss, 100 * ev.accuracy, ev.count, format_duration(seconds_since(start)));
      std::fflush(stdout);  // progress goes to stderr: keep the two in order in logs
      TrainRow row;
      row.step = pos.step;
      row.epoch = epoch + double(loader.batch_index()) / per_epoch;
      row.val_loss = ev.loss;
      row.val_acc = ev.accuracy;
      row.elapsed_s = seconds_since(start);
      logs.row(row);
      if (epoch_done) {
        pos.epoch = epoch + 1;
        pos.batch = 0;
      }
      if (!a.save.empty()) {
        save_checkpoint(a.save, cfg.to_json(), model.params(), &step.optimizer(), &pos);
        logs.plot();
      }
    }
  }
  progress.finish();
  double total = seconds_since(start);
  fmt::print("done: {} steps in {} ({:.0f} images/s); final test accuracy {:.2f}%\n", steps_this_run,
             format_duration(total), steps_this_run * B / std::max(total, 1e-9), 100 * last_eval_acc);
  if (!a.save.empty()) fmt::print("checkpoint: {}\n", a.save);
  std::string profile = step.executor().profile();
  if (!profile.empty()) fmt::print("kernel time per op (training step):\n{}", profile);
  return kExitOk;
}

}  // namespace nabla::cli
