// What the ViT commands (train, eval, grad) share: dataset selection and
// evaluation on a test set.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nabla/models/vit.h"
#include "nabla/data.h"
#include "nabla/executor.h"

namespace nabla::cli {

struct VitData {
  ImageDataset train, test;
  Normalize normalize;
  std::string description;
};
// dataset: "fashion-mnist" or "cifar10"; dir "" = the default location.
// Checks that the images fit the model (size, channels, classes).
VitData load_vit_data(const std::string& dataset, const std::string& dir, const models::VitConfig& cfg);
// ShapeError unless the images fit the model (size, channels, classes).
void check_fits(const VitData& d, const std::string& dataset, const models::VitConfig& cfg);
// Keeps the first n samples (smoke tests, quick runs).
void shrink(ImageDataset& d, int64_t n);
// Bilinear resize to size x size, replicating a grey channel to `channels`:
// lets a 224x224x3 model (vit-tiny) train on Fashion-MNIST.
void resize(ImageDataset& d, int64_t channels, int64_t size);

// Predictions equal to the labels, from logits [B, classes].
int64_t count_correct(const std::vector<float>& logits, const Tensor& labels, int64_t classes);

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
};

// A forward-only graph over the model's weight leaves (no dropout), planned
// once, run over the whole set in batches.
class VitEvaluator {
 public:
  VitEvaluator(const models::Vit& model, const ImageDataset& data, const Normalize& normalize, int64_t batch,
               int threads);
  EvalResult run();

 private:
  const ImageDataset& data_;
  std::unique_ptr<BatchLoader> loader_;
  Tensor images_, labels_, logits_, loss_;
  std::unique_ptr<Executor> executor_;
  int64_t classes_;
};

}  // namespace nabla::cli
