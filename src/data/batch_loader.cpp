// BatchLoader: shuffled, augmented, normalised batches, one batch prepared
// ahead on a background thread.
//
// Randomness is counter-based: every draw is a hash of (seed, stream, epoch,
// counter), so the loader carries no generator state, and any batch can be
// made on its own, on any thread, in any order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "data/counter_random.h"
#include "nabla/data.h"
#include "nabla/error.h"

namespace nabla {

namespace {

// Streams keep the draws of different purposes independent.
enum Stream : uint64_t { kOrder = 1, kCropY = 2, kCropX = 3, kFlip = 4, kErase = 5 };

using data::below;
using data::draw;

std::vector<float> channel_values(const std::vector<float>& v, float fallback, int64_t channels,
                                  const char* what) {
  if (v.empty()) return std::vector<float>(channels, fallback);
  if (v.size() == 1) return std::vector<float>(channels, v[0]);
  if (static_cast<int64_t>(v.size()) != channels) {
    throw UsageError(std::string("BatchLoader: ") + what + " has " + std::to_string(v.size()) +
                     " values, the images have " + std::to_string(channels) + " channels");
  }
  return v;
}

}  // namespace

BatchLoader::BatchLoader(const ImageDataset& data, int64_t batch_size, bool shuffle, bool drop_last,
                         Augment augment, Normalize normalize, uint64_t seed, bool prefetch)
    : data_(data),
      batch_size_(batch_size),
      row_count_(batch_size),
      shuffle_(shuffle),
      augment_(augment),
      seed_(seed),
      prefetch_(prefetch) {
  const ImageDataset& d = data;
  if (batch_size < 1)
    throw UsageError("BatchLoader: batch size must be >= 1, got " + std::to_string(batch_size));
  if (d.n < 1 || d.channels < 1 || d.height < 1 || d.width < 1 || d.classes < 1) {
    throw UsageError("BatchLoader: empty dataset: n " + std::to_string(d.n) + ", image " +
                     std::to_string(d.channels) + "x" + std::to_string(d.height) + "x" +
                     std::to_string(d.width) + ", classes " + std::to_string(d.classes));
  }
  if (static_cast<int64_t>(d.pixels.size()) != d.n * d.image_size() ||
      static_cast<int64_t>(d.labels.size()) != d.n) {
    throw UsageError("BatchLoader: dataset of " + std::to_string(d.n) + " images of " +
                     std::to_string(d.image_size()) + " pixels holds " +
                     std::to_string(d.pixels.size()) + " pixels and " +
                     std::to_string(d.labels.size()) + " labels");
  }
  if (augment.pad < 0 || augment.pad > 4096) {
    throw UsageError("BatchLoader: crop padding must be in [0, 4096], got " +
                     std::to_string(augment.pad));
  }
  if (!(augment.erase_prob >= 0 && augment.erase_prob <= 1)) {
    throw UsageError("BatchLoader: random-erasing probability must be in [0, 1], got " +
                     std::to_string(augment.erase_prob));
  }
  batches_ = drop_last ? d.n / batch_size : (d.n + batch_size - 1) / batch_size;
  if (batches_ == 0) {
    throw UsageError("BatchLoader: batch size " + std::to_string(batch_size) +
                     " with drop_last leaves no batch of " + std::to_string(d.n) + " samples");
  }

  std::vector<float> mean = channel_values(normalize.mean, 0.0f, d.channels, "mean");
  std::vector<float> stdev = channel_values(normalize.std, 1.0f, d.channels, "std");
  lut_.resize(d.channels * 256);
  for (int64_t c = 0; c < d.channels; ++c) {
    if (!(stdev[c] > 0.0f) || !std::isfinite(stdev[c]) || !std::isfinite(mean[c])) {
      throw UsageError("BatchLoader: channel " + std::to_string(c) +
                       " needs a finite mean and a std > 0, got " + std::to_string(mean[c]) +
                       " and " + std::to_string(stdev[c]));
    }
    for (int v = 0; v < 256; ++v)
      lut_[c * 256 + v] = (static_cast<float>(v) / 255.0f - mean[c]) / stdev[c];
  }

  if (prefetch_) {
    images_.resize(batch_size * d.image_size());
    labels_.resize(batch_size);
    worker_ = std::thread([this] { worker_loop(); });
  }
  try {
    start_epoch(0);
  } catch (...) {
    stop_worker();  // a constructor that throws runs no destructor
    throw;
  }
}

BatchLoader::~BatchLoader() { stop_worker(); }

void BatchLoader::stop_worker() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void BatchLoader::start_epoch(int64_t epoch) {
  if (epoch < 0) throw UsageError("BatchLoader: epoch must be >= 0, got " + std::to_string(epoch));
  auto order = std::make_shared<std::vector<int64_t>>(data_.n);
  std::iota(order->begin(), order->end(), int64_t(0));
  if (shuffle_) data::shuffle(*order, seed_, kOrder, epoch);
  order_ = std::move(order);
  epoch_ = epoch;
  pos_ = 0;
  rows_ = 0;
  request(0);
}

void BatchLoader::skip(int64_t batches) {
  if (batches < 0 || batches > batches_ - pos_) {
    throw UsageError("BatchLoader: cannot skip " + std::to_string(batches) + " batches at batch " +
                     std::to_string(pos_) + " of " + std::to_string(batches_));
  }
  if (batches == 0) return;
  pos_ += batches;
  request(pos_);
}

void BatchLoader::set_rows(int64_t begin, int64_t count) {
  if (begin < 0 || count < 1 || begin + count > batch_size_) {
    throw UsageError("BatchLoader: rows [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                     ") of a batch of " + std::to_string(batch_size_));
  }
  if (prefetch_) {
    // The worker may be filling the old rows: let it finish first.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    done_ = false;
    job_ = {};
  }
  row_begin_ = begin;
  row_count_ = count;
  start_epoch(epoch_);
}

void BatchLoader::request(int64_t batch) {
  if (!prefetch_ || batch >= batches_) return;
  std::unique_lock<std::mutex> lock(mu_);
  // The worker writes the one staging buffer: let it finish any stale job.
  cv_.wait(lock, [&] { return !busy_; });
  job_ = {order_, epoch_, batch};
  busy_ = true;
  done_ = false;
  error_ = nullptr;
  lock.unlock();
  cv_.notify_all();
}

bool BatchLoader::next(float* images, int32_t* labels) {
  if (pos_ >= batches_) return false;
  if (!prefetch_) {
    rows_ = fill({order_, epoch_, pos_}, images, labels);
    ++pos_;
    return true;
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!((busy_ || done_ || error_) && job_.epoch == epoch_ && job_.batch == pos_)) {
    lock.unlock();
    request(pos_);
    lock.lock();
  }
  cv_.wait(lock, [&] { return !busy_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    done_ = false;
    job_ = {};
    std::rethrow_exception(e);
  }
  std::memcpy(images, images_.data(), size_t(row_count_ * data_.image_size()) * sizeof(float));
  std::memcpy(labels, labels_.data(), size_t(row_count_) * sizeof(int32_t));
  rows_ = job_rows_;
  done_ = false;
  lock.unlock();
  ++pos_;
  request(pos_);
  return true;
}

void BatchLoader::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || busy_; });
    if (stop_) return;
    Job job = job_;
    lock.unlock();
    int64_t rows = 0;
    std::exception_ptr error;
    try {
      rows = fill(job, images_.data(), labels_.data());
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    job_rows_ = rows;
    error_ = error;
    busy_ = false;
    done_ = !error;
    cv_.notify_all();
  }
}

int64_t BatchLoader::fill(const Job& job, float* images, int32_t* labels) const {
  const ImageDataset& d = data_;
  const int64_t C = d.channels, H = d.height, W = d.width, image = d.image_size();
  const int pad = augment_.pad;
  int64_t first = job.batch * batch_size_ + row_begin_;
  int64_t rows = std::clamp<int64_t>(d.n - first, 0, row_count_);
  for (int64_t r = 0; r < row_count_; ++r) {
    float* out = images + r * image;
    if (r >= rows) {
      std::fill(out, out + image, 0.0f);
      labels[r] = 0;
      continue;
    }
    int64_t position = first + r;  // in the epoch: keys this sample's augmentation
    int64_t index = (*job.order)[position];
    int32_t label = d.labels[index];
    if (label < 0 || label >= d.classes) {
      throw UsageError("BatchLoader: sample " + std::to_string(index) + " has label " +
                       std::to_string(label) + ", outside [0, " + std::to_string(d.classes) + ")");
    }
    labels[r] = label;
    const uint8_t* src = d.pixels.data() + index * image;
    int64_t dy = 0, dx = 0;
    bool flip = false;
    if (pad > 0) {
      dy = below(draw(seed_, kCropY, job.epoch, position), 2 * pad + 1) - pad;
      dx = below(draw(seed_, kCropX, job.epoch, position), 2 * pad + 1) - pad;
    }
    if (augment_.hflip) flip = draw(seed_, kFlip, job.epoch, position) >> 63;
    for (int64_t c = 0; c < C; ++c) {
      const float* lut = lut_.data() + c * 256;
      const uint8_t* plane = src + c * H * W;
      float* dst = out + c * H * W;
      if (dy == 0 && dx == 0 && !flip) {
        for (int64_t i = 0; i < H * W; ++i) dst[i] = lut[plane[i]];
        continue;
      }
      // Crop the padded image at (pad + dy, pad + dx), then mirror the crop:
      // out(y, x) = src(y + dy, (flip ? W-1-x : x) + dx), zero outside.
      for (int64_t y = 0; y < H; ++y) {
        int64_t sy = y + dy;
        for (int64_t x = 0; x < W; ++x) {
          int64_t sx = (flip ? W - 1 - x : x) + dx;
          bool inside = sy >= 0 && sy < H && sx >= 0 && sx < W;
          dst[y * W + x] = lut[inside ? plane[sy * W + sx] : 0];
        }
      }
    }
    if (augment_.erase_prob > 0) erase(job.epoch, position, out);
  }
  return rows;
}

void BatchLoader::erase(int64_t epoch, int64_t position, float* image) const {
  const ImageDataset& d = data_;
  const int64_t C = d.channels, H = d.height, W = d.width;
  // Draws of this sample: [0] decides, then four per attempt. Each draw is
  // (seed, kErase, epoch, position * 64 + k), so samples stay independent.
  auto uniform = [&](int64_t k) {
    return static_cast<double>(draw(seed_, kErase, epoch, position * 64 + k) >> 11) * 0x1p-53;
  };
  if (uniform(0) >= augment_.erase_prob) return;
  // As timm: up to 10 attempts at a rectangle that fits.
  for (int64_t attempt = 0; attempt < 10; ++attempt) {
    const int64_t k = 1 + 4 * attempt;
    double area = H * W * (0.02 + uniform(k) * (1.0 / 3 - 0.02));
    double aspect = std::exp(std::log(0.3) + uniform(k + 1) * (std::log(1 / 0.3) - std::log(0.3)));
    int64_t h = std::llround(std::sqrt(area * aspect)), w = std::llround(std::sqrt(area / aspect));
    if (h < 1 || w < 1 || h >= H || w >= W) continue;
    int64_t top = static_cast<int64_t>(uniform(k + 2) * static_cast<double>(H - h + 1));
    int64_t left = static_cast<int64_t>(uniform(k + 3) * static_cast<double>(W - w + 1));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = top; y < top + h; ++y) std::fill_n(image + (c * H + y) * W + left, w, 0.0f);
    return;
  }
}

}  // namespace nabla
