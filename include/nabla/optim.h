// Optimizers as one fused update over every parameter at once (one
// parallel pass over all elements), not a host loop per tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nabla/tensor.h"

namespace nabla::optim {

// One parameter leaf (f32, contiguous) and where its gradient lies.
struct Slot {
  std::string name;
  Tensor param;
  bool decay = true;  // weight decay applies (not to biases, norms, tokens)
};

// timm's rule: no weight decay for 1-D tensors (biases, norm weights) and
// for position embeddings and class tokens.
bool default_decay(const std::string& name, const Tensor& param);

// Elements [begin, end) of gradient `slot`, for a gradient that is not held
// in memory (see TrainStep's low_memory): computed on demand, valid until the
// calling thread's next call. Called from several threads at once.
using GradientRange = std::function<const float*(size_t slot, int64_t begin, int64_t end)>;

// Global L2 norm over all gradients, summed in a fixed order (the same at
// any thread count). grads[i] has slots[i].param's element count.
double global_norm(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes, int threads);

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.05;
};

// AdamW (Loshchilov & Hutter): decoupled weight decay p -= lr wd p, and
// bias-corrected moments m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t).
class AdamW {
 public:
  // hold_moments false: the moments live elsewhere (a TrainStep that shards
  // them across processes); step() and state() are then errors, and
  // load_state() checks the moments and takes the step count alone.
  AdamW(std::vector<Slot> slots, AdamWConfig config, int threads, bool hold_moments = true);
  // grads[i]: contiguous f32 gradient of slots[i].param, or null to read it
  // through `range`, a chunk at a time. grad_scale
  // multiplies every gradient first (clipping, averaging micro-batches).
  void step(const std::vector<const float*>& grads, double lr, double grad_scale = 1.0,
            const GradientRange& range = {});

  int64_t steps() const { return t_; }
  bool holds_moments() const { return hold_moments_; }
  const std::vector<Slot>& slots() const { return slots_; }
  const AdamWConfig& config() const { return config_; }
  // For a training graph whose adamw_update nodes step these moments in
  // place: counts one step taken there and returns its number (from 1).
  int64_t count_step() { return ++t_; }
  const Tensor& exp_avg(size_t slot) const { return m_.at(slot); }
  const Tensor& exp_avg_sq(size_t slot) const { return v_.at(slot); }
  // Overrides the weight-decay rule for one slot (e.g. a position embedding
  // that a caller without names wants left undecayed).
  void set_decay(size_t slot, bool decay);
  // Moments as named leaves ("optimizer.exp_avg.<name>", "optimizer.exp_avg_sq.<name>")
  // for checkpoints, and back.
  std::vector<std::pair<std::string, Tensor>> state() const;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t steps);

 private:
  std::vector<Slot> slots_;
  AdamWConfig config_;
  int threads_;
  bool hold_moments_;
  int64_t t_ = 0;
  std::vector<Tensor> m_, v_;
  std::vector<int64_t> offsets_;  // start of each slot in the concatenated element space
};

// SGD with momentum (PyTorch's form: buf = mu buf + g; p -= lr buf) and
// coupled weight decay g += wd p.
class Sgd {
 public:
  Sgd(std::vector<Slot> slots, double momentum, double weight_decay, int threads);
  void step(const std::vector<const float*>& grads, double lr, double grad_scale = 1.0);

 private:
  std::vector<Slot> slots_;
  double momentum_, weight_decay_;
  int threads_;
  std::vector<Tensor> buf_;
  std::vector<int64_t> offsets_;
};

// Linear warmup from 0 to base over `warmup` steps, then cosine decay to
// min_lr at `total` steps.
double warmup_cosine(int64_t step, int64_t warmup, int64_t total, double base, double min_lr);

}  // namespace nabla::optim
