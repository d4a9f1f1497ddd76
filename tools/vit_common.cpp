#include "vit_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "nabla/error.h"
#include "nabla/ops.h"

namespace nabla::cli {

VitData load_vit_data(const std::string& dataset, const std::string& dir, const models::VitConfig& cfg) {
  VitData d;
  if (dataset == "fashion-mnist") {
    std::string where = dir.empty() ? find_fashion_mnist() : dir;
    if (where.empty()) {
      throw IoError(
          "train vit: Fashion-MNIST not found: install Debian's dataset-fashion-mnist "
          "(apt-get install dataset-fashion-mnist) or pass --data DIR");
    }
    d.train = load_fashion_mnist(where, true);
    d.test = load_fashion_mnist(where, false);
    d.normalize = Normalize::fashion_mnist();
    d.description = "Fashion-MNIST from " + where;
  } else if (dataset == "cifar10") {
    if (dir.empty()) throw UsageError("train vit: --dataset cifar10 needs --data DIR (the binary version)");
    d.train = load_cifar10(dir, true);
    d.test = load_cifar10(dir, false);
    d.normalize = Normalize::cifar10();
    d.description = "CIFAR-10 from " + dir;
  } else {
    throw UsageError("train vit: unknown dataset '" + dataset + "' (fashion-mnist or cifar10)");
  }
  return d;
}

void check_fits(const VitData& d, const std::string& dataset, const models::VitConfig& cfg) {
  const ImageDataset& t = d.train;
  if (t.channels != cfg.in_chans || t.height != cfg.img_size || t.width != cfg.img_size) {
    throw ShapeError(fmt::format("train vit: the model takes {}x{}x{} images, {} has {}x{}x{} (--resize adapts them)",
                                 cfg.in_chans, cfg.img_size, cfg.img_size, dataset, t.channels, t.height, t.width));
  }
  if (t.classes > cfg.num_classes) {
    throw ShapeError(fmt::format("train vit: the model has {} classes, {} has {}", cfg.num_classes, dataset,
                                 t.classes));
  }
}

void shrink(ImageDataset& d, int64_t n) {
  d.n = n;
  d.pixels.resize(size_t(n * d.image_size()));
  d.labels.resize(size_t(n));
}

void resize(ImageDataset& d, int64_t channels, int64_t size) {
  if (d.channels != channels && d.channels != 1) {
    throw ShapeError(fmt::format("resize: cannot turn {} channels into {}", d.channels, channels));
  }
  double bytes = double(d.n) * channels * size * size;
  if (bytes > 4e9) {
    throw UsageError(fmt::format("resize: {} images of {}x{}x{} need {:.1f} GB; use --train-subset/--test-subset",
                                 d.n, channels, size, size, bytes / 1e9));
  }
  std::vector<uint8_t> out(size_t(d.n * channels * size * size));
  const double sy = double(d.height) / size, sx = double(d.width) / size;
  for (int64_t i = 0; i < d.n; ++i) {
    for (int64_t c = 0; c < channels; ++c) {
      const uint8_t* src = d.pixels.data() + (i * d.channels + (d.channels == 1 ? 0 : c)) * d.height * d.width;
      uint8_t* dst = out.data() + (i * channels + c) * size * size;
      for (int64_t y = 0; y < size; ++y) {
        // Pixel centres aligned, as align_corners=False.
        double fy = std::clamp((y + 0.5) * sy - 0.5, 0.0, double(d.height - 1));
        int64_t y0 = int64_t(fy), y1 = std::min(y0 + 1, d.height - 1);
        double wy = fy - y0;
        for (int64_t x = 0; x < size; ++x) {
          double fx = std::clamp((x + 0.5) * sx - 0.5, 0.0, double(d.width - 1));
          int64_t x0 = int64_t(fx), x1 = std::min(x0 + 1, d.width - 1);
          double wx = fx - x0;
          double v = (1 - wy) * ((1 - wx) * src[y0 * d.width + x0] + wx * src[y0 * d.width + x1]) +
                     wy * ((1 - wx) * src[y1 * d.width + x0] + wx * src[y1 * d.width + x1]);
          dst[y * size + x] = static_cast<uint8_t>(std::lround(v));
        }
      }
    }
  }
  d.pixels = std::move(out);
  d.channels = channels;
  d.height = d.width = size;
}

int64_t count_correct(const std::vector<float>& logits, const Tensor& labels, int64_t classes) {
  const int32_t* y = static_cast<const int32_t*>(labels.data());
  int64_t rows = int64_t(logits.size()) / classes, correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * classes;
    correct += (std::max_element(row, row + classes) - row) == y[r];
  }
  return correct;
}

VitEvaluator::VitEvaluator(const models::Vit& model, const ImageDataset& data, const Normalize& normalize,
                           int64_t batch, int threads)
    : data_(data), classes_(model.config().num_classes) {
  const models::VitConfig& c = model.config();
  batch = std::max<int64_t>(1, std::min(batch, data.n));
  loader_ = std::make_unique<BatchLoader>(data, batch, /*shuffle=*/false, /*drop_last=*/false, Augment{},
                                          normalize, 0);
  images_ = Tensor::zeros(DType::f32, {batch, c.in_chans, c.img_size, c.img_size});
  labels_ = Tensor::zeros(DType::i32, {batch});
  logits_ = model.forward(images_, /*train=*/false);
  // Per-row losses, so a partial last batch counts only its real rows.
  loss_ = neg(sum(log_softmax(logits_) * one_hot(labels_, c.num_classes), {-1}));
  executor_ = std::make_unique<Executor>(Graph({logits_, loss_}), ExecOptions{.threads = threads});
}

EvalResult VitEvaluator::run() {
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0;
  loader_->start_epoch(0);
  while (loader_->next(images_.data_as<float>(), labels_.data_as<int32_t>())) {
    executor_->run();
    int64_t rows = loader_->batch_rows();
    std::vector<float> logits = executor_->read<float>(logits_);
    std::vector<float> losses = executor_->read<float>(loss_);
    logits.resize(size_t(rows * classes_));
    correct += count_correct(logits, labels_, classes_);
    for (int64_t i = 0; i < rows; ++i) loss_sum += losses[i];
    r.count += rows;
  }
  r.loss = loss_sum / std::max<int64_t>(1, r.count);
  r.accuracy = double(correct) / std::max<int64_t>(1, r.count);
  return r;
}

}  // namespace nabla::cli
