// `nabla train vit`: trains a vanilla ViT (LayerNorm, GELU MLP, conv patch
// embedding) from scratch through nabla's autodiff on an image dataset, by
// default the real Fashion-MNIST that Debian's dataset-fashion-mnist installs.
//
// The forward, loss, backward and optimizer are planned once; each step
// writes a new batch into the input leaves and runs the same plan
// (TrainingLoop, train_loop.h).
#include <fmt/format.h>


#include "commands.h"
#include "nabla/models/vit.h"
#include "nabla/checkpoint.h"
#include "nabla/data.h"
#include "nabla/error.h"
#include "nabla/trainer.h"
#include "train_loop.h"
#include "vit_common.h"

namespace nabla::cli {

namespace {

// The images of each batch, split among the step's replicas (all ranks'
// of a distributed run: this process loads its own rows alone); accuracy
// from their logits; evaluation on the test set.
class VitTask : public TrainingTask {
 public:
  VitTask(TrainStep& step, const models::Vit& model, BatchLoader& loader, VitEvaluator& evaluator, const Tensor& images,
          const Tensor& labels, const Tensor& logits)
      : step_(step), loader_(loader), evaluator_(evaluator), classes_(model.config().num_classes) {
    for (int r = 0; r < step.replicas(); ++r) {
      replicas_.push_back({step.in_replica(r, images), step.in_replica(r, labels), step.in_replica(r, logits),
                           model.config().drop_rate > 0 ? step.in_replica(r, model.dropout_seed) : Tensor()});
    }
    // This process's rows of every batch: its replicas', in order.
    const int64_t rows = images.dim(0);
    if (step.global_replicas() > step.replicas()) loader.set_rows(step.global_replica(0) * rows, step.replicas() * rows);
    const int64_t B = loader.rows_per_batch();
    batch_images_.resize(size_t(B * images.numel() / rows));
    batch_labels_.resize(size_t(B));
  }

  int64_t batches_per_epoch() const override { return loader_.batches_per_epoch(); }

  void start_epoch(int64_t epoch, int64_t skip) override {
    loader_.start_epoch(epoch);
    if (skip > 0) loader_.skip(skip);
  }

  void load_batch(const TrainPosition& pos, int) override {
    if (!loader_.next(batch_images_.data(), batch_labels_.data())) {
      throw Error("train vit: the loader ran out of batches within an epoch");
    }
    const int64_t R = int64_t(replicas_.size());
    for (int64_t r = 0; r < R; ++r) {
      Replica& rep = replicas_[size_t(r)];
      const int64_t n = rep.labels.numel(), pixels = rep.images.numel(), g = step_.global_replica(int(r));
      std::copy_n(batch_images_.data() + r * pixels, pixels, rep.images.data_as<float>());
      std::copy_n(batch_labels_.data() + r * n, n, rep.labels.data_as<int32_t>());
      if (rep.dropout_seed.defined()) {
        rep.dropout_seed.data_as<int32_t>()[0] = replica_seed(step_seed(pos.seed, pos.step), g);
      }
    }
  }

  int64_t correct_predictions() override {
    int64_t correct = 0;
    for (size_t r = 0; r < replicas_.size(); ++r) {
      correct += count_correct(step_.executor(int(r)).read<float>(replicas_[r].logits), replicas_[r].labels, classes_);
    }
    return correct;
  }

  Evaluation evaluate() override {
    EvalResult ev = evaluator_.run();
    return {ev.loss, ev.accuracy, ev.count};
  }

 private:
  struct Replica {
    Tensor images, labels, logits, dropout_seed;
  };
  TrainStep& step_;
  BatchLoader& loader_;
  VitEvaluator& evaluator_;
  int64_t classes_;
  std::vector<Replica> replicas_;
  std::vector<float> batch_images_;
  std::vector<int32_t> batch_labels_;
};

}  // namespace

int run_train_vit(const TrainVitArgs& a) {
  // ---- Model and data.
  models::VitConfig cfg;
  const std::optional<Checkpoint> resume = load_resume_checkpoint(a);
  const uint64_t seed = resume ? resume->position.seed : a.seed;
  if (resume) {
    cfg = models::vit_config_from_checkpoint(*resume);
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

  models::Vit model(cfg, seed);
  if (resume) load_params(*resume, model.params());
  model.set_gradient_checkpointing(a.gradient_checkpointing);

  const int64_t B = a.batch, C = cfg.in_chans, S = cfg.img_size;
  const int crop_pad = a.crop_pad >= 0 ? a.crop_pad : (a.dataset == "cifar10" ? 2 : 0);
  BatchLoader loader(data.train, B, /*shuffle=*/true, /*drop_last=*/true, Augment{crop_pad, a.hflip, a.erase_prob},
                     data.normalize, seed);
  if (loader.batches_per_epoch() == 0) {
    throw UsageError(fmt::format("train vit: batch {} is larger than the {} training images", B, data.train.n));
  }

  // ---- The compiled training step, for one replica's share of the batch.
  // Replicas are the CPU's threads side by side; another backend runs one.
  const int R = a.replicas > 0          ? a.replicas
                : a.backend == "cpu" ? default_replicas(a.threads, B, model.params().count())
                                     : 1;
  const int ranks = a.comm ? a.comm->size() : 1;
  if (B % (R * ranks) != 0) {
    throw UsageError(ranks > 1 ? fmt::format("train vit: {} processes x {} replicas do not divide the batch of {}", ranks,
                                             R, B)
                               : fmt::format("train vit: --replicas {} does not divide the batch of {}", R, B));
  }
  if (a.comm) {
    dist::check_same(*a.comm, "the training data",
                     fmt::format("{} {} training images, hash {}", a.dataset, data.train.n,
                                 dist::fingerprint(data.train.labels.data(), data.train.labels.size() * sizeof(int32_t),
                                                   dist::fingerprint(data.train.pixels.data(), data.train.pixels.size()))));
  }
  Tensor images = Tensor::zeros(DType::f32, {B / (R * ranks), C, S, S}).set_name("images");
  Tensor labels = Tensor::zeros(DType::i32, {B / (R * ranks)}).set_name("labels");
  Tensor logits = model.forward(images, /*train=*/true);
  // Label smoothing as timm: cross-entropy against (1 - e) one-hot + e / K.
  const double e = a.label_smoothing;
  Tensor loss = e > 0 ? cross_entropy_soft(logits, one_hot(labels, cfg.num_classes) * (1 - e) + e / cfg.num_classes)
                      : cross_entropy(logits, labels);
  optim::AdamWConfig adamw;
  adamw.weight_decay = a.weight_decay;
  TrainStep step(loss, model.params(), {logits}, adamw, exec_options(a),
                 {.replicas = R, .comm = a.comm, .shard_optimizer = a.shard_optimizer});
  VitEvaluator evaluator(model, data.test, data.normalize, a.eval_batch, a.threads);
  VitTask task(step, model, loader, evaluator, images, labels, logits);
  TrainingLoop loop(step, task, model.params(), a,
                    {.command = "train vit",
                     .epochs = a.epochs,
                     .min_lr_fraction = 0.01,
                     .examples_per_step = B,
                     .items_per_step = B,
                     .items = "images",
                     .rate_unit = "img/s",
                     .batch = fmt::format("batch {}", B),
                     .eval_name = "test",
                     .config_json = cfg.to_json()},
                    resume ? &*resume : nullptr);

  fmt::print("ViT '{}' ({:.2f}M parameters): {}x{}x{} images, patch {}, dim {}, depth {}, heads {}, mlp {}, {}\n",
             cfg.preset, model.params().count() / 1e6, C, S, S, cfg.patch_size, cfg.embed_dim, cfg.depth,
             cfg.num_heads, cfg.mlp_hidden(), cfg.gelu);
  fmt::print("data: {} ({} train, {} test images, {} classes); augmentation: crop pad {}, hflip {}, random erasing {}, "
             "label smoothing {}\n",
             data.description, data.train.n, data.test.n, data.train.classes, crop_pad, a.hflip ? "on" : "off",
             a.erase_prob, e);
  fmt::print("{}\n", loop.describe());
  if (a.gradient_checkpointing) fmt::print("gradient checkpointing: blocks recomputed in the backward\n");
  std::fflush(stdout);
  loop.run();
  return kExitOk;
}

}  // namespace nabla::cli
