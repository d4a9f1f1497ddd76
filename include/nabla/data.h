// Image datasets and the batch loader that feeds training.
//
// Dimension legend: N samples, B batch, C channels, H height, W width.
//
// A dataset is u8 pixels in memory. BatchLoader turns it into normalised f32
// batches [B, C, H, W] with optional random crop and horizontal flip. Every
// random choice (the epoch's order, each sample's crop and flip) is a pure
// function of (seed, epoch, position), so a run resumed at epoch e, batch k
// sees exactly the batches it would have seen, at any thread count.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace nabla {

struct ImageDataset {
  int64_t n = 0, channels = 0, height = 0, width = 0, classes = 0;
  std::vector<uint8_t> pixels;           // [N, C, H, W]
  std::vector<int32_t> labels;           // [N], each in [0, classes)
  std::vector<std::string> class_names;  // [classes], or empty when unknown
  int64_t image_size() const { return channels * height * width; }
};

// IDX images (rank 3 [N, H, W], or rank 4 [N, C, H, W]) and labels (rank 1
// [N]), gzip-compressed or not. `classes` = 0 infers max(label) + 1, at least
// 10 (the MNIST family); otherwise every label must be below it. IoError
// names the file and what is wrong.
ImageDataset load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                              int64_t classes = 0);

// The Fashion-MNIST directory: $NABLA_DATA/fashion-mnist when it holds the
// dataset, else /usr/share/datasets/fashion-mnist (Debian's
// dataset-fashion-mnist package); "" when neither does.
std::string find_fashion_mnist();

// {train,t10k}-{images-idx3,labels-idx1}-ubyte, with or without .gz, from
// `dir` ("" = find_fashion_mnist()). 28x28 grey images, 10 classes.
ImageDataset load_fashion_mnist(const std::string& dir, bool train);
const std::vector<std::string>& fashion_mnist_class_names();

// CIFAR-10 binary version: data_batch_1.bin .. data_batch_5.bin (train) or
// test_batch.bin, each a sequence of 3073-byte records (a label byte, then
// 3x32x32 pixels in CHW order). `dir` may also be the parent of
// cifar-10-batches-bin/.
ImageDataset load_cifar10(const std::string& dir, bool train);
const std::vector<std::string>& cifar10_class_names();

// Random crop with zero padding and horizontal flip, as in the usual
// `RandomCrop(size, padding=pad)` + `RandomHorizontalFlip()`: pad the image
// with `pad` black pixels on each side, cut an H x W window at a uniform
// random offset, and mirror it left-right with probability 1/2.
struct Augment {
  int pad = 0;
  bool hflip = false;
  // Random erasing (Zhong et al. 2017, timm's RandomErasing in "const" mode):
  // with this probability, a rectangle of 2%-33% of the image with aspect
  // ratio 0.3-3.3 is set to 0 after normalisation (the dataset's mean).
  double erase_prob = 0;
};

// Per-channel normalisation of pixels scaled to [0, 1]: (p / 255 - mean) / std.
// One value applies to every channel; empty vectors mean 0 and 1.
struct Normalize {
  std::vector<float> mean, std;
  static Normalize fashion_mnist() { return {{0.2860f}, {0.3530f}}; }
  static Normalize cifar10() { return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}}; }
};

// Serves an epoch as batches in a shuffled (or natural) order. A background
// thread prepares the next batch while the caller works on the current one.
//
//   BatchLoader loader(data, 64, /*shuffle=*/true, /*drop_last=*/true, Augment{},
//                      Normalize::fashion_mnist(), seed);
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);
//     while (loader.next(images, labels)) { ... }
//   }
//
// The whole state is (seed, epoch, batch_index()): to resume, call
// start_epoch(epoch) then skip(batch_index). `data` must outlive the loader
// and stay unchanged while it runs.
class BatchLoader {
 public:
  BatchLoader(const ImageDataset& data, int64_t batch_size, bool shuffle, bool drop_last,
              Augment augment, Normalize normalize, uint64_t seed, bool prefetch = true);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Starts epoch `epoch` at its first batch; its order depends only on
  // (seed, epoch). The constructor starts epoch 0.
  void start_epoch(int64_t epoch);
  // Moves `batches` batches forward in the current epoch without making them.
  void skip(int64_t batches);
  // Serves rows [begin, begin + count) of every batch alone, as they are in
  // the whole batch (a process's share of a batch split across processes):
  // next() writes count rows, batch_rows() counts the real ones among them.
  // Restarts the current epoch. UsageError for rows outside the batch.
  void set_rows(int64_t begin, int64_t count);
  // Writes the next batch: `images` [B, C, H, W] normalised, `labels` [B]
  // (B: set_rows' count, the batch size unless set).
  // Returns false, writing nothing, when the epoch is over. When drop_last is
  // false the epoch's last batch may be partial: rows past batch_rows() are
  // zero images with label 0. Rethrows an error met while preparing it.
  bool next(float* images, int32_t* labels);

  int64_t batches_per_epoch() const { return batches_; }
  int64_t batch_size() const { return batch_size_; }
  int64_t rows_per_batch() const { return row_count_; }  // what next() writes: set_rows' count
  int64_t batch_rows() const { return rows_; }  // real rows of the last batch next() wrote
  int64_t epoch() const { return epoch_; }
  int64_t batch_index() const { return pos_; }  // batches served (or skipped) this epoch
  uint64_t seed() const { return seed_; }

 private:
  struct Job {
    std::shared_ptr<const std::vector<int64_t>> order;  // the epoch's sample order
    int64_t epoch = -1, batch = -1;
  };
  int64_t fill(const Job& job, float* images, int32_t* labels) const;
  void erase(int64_t epoch, int64_t position, float* image) const;
  void request(int64_t batch);  // hands `batch` of the current epoch to the worker
  void worker_loop();
  void stop_worker();

  const ImageDataset& data_;
  int64_t batch_size_, batches_;
  int64_t row_begin_ = 0, row_count_;  // set_rows
  bool shuffle_;
  Augment augment_;
  std::vector<float> lut_;  // [C, 256] normalised value of each pixel byte
  uint64_t seed_;
  int64_t epoch_ = 0, pos_ = 0, rows_ = 0;
  std::shared_ptr<const std::vector<int64_t>> order_;

  // Prefetch: the worker fills images_/labels_ for `job_`; `done_` when
  // finished (or `error_`). Guarded by mu_.
  bool prefetch_;
  std::mutex mu_;
  std::condition_variable cv_;
  Job job_;
  bool busy_ = false, done_ = false, stop_ = false;
  int64_t job_rows_ = 0;
  std::exception_ptr error_;
  std::vector<float> images_;
  std::vector<int32_t> labels_;
  std::thread worker_;
};

}  // namespace nabla
