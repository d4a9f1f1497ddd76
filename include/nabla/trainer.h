// The pieces every training command shares: a compiled training step
// (forward, loss, backward, optimizer, planned once and run per batch) and
// the progress line.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nabla/executor.h"
#include "nabla/nn.h"
#include "nabla/optim.h"

namespace nabla {

// loss (scalar) and `extras` (e.g. logits, for accuracy) are outputs; the
// gradient of every parameter is made contiguous so the fused optimizer reads
// it in place.
class TrainStep {
 public:
  TrainStep(const Tensor& loss, const nn::Params& params, const std::vector<Tensor>& extras,
            const optim::AdamWConfig& adamw, ExecOptions options, int micro_batches = 1);

  // Forward and backward for the batch now in the input leaves. With
  // micro_batches > 1, gradients are summed over successive calls and
  // update() averages them.
  void run();
  float loss() const;
  // The gradient of each parameter (in params.list() order), readable
  // through executor() after run().
  const std::vector<Tensor>& gradients() const { return grads_; }
  const Executor& executor() const { return *executor_; }
  Executor& executor() { return *executor_; }
  optim::AdamW& optimizer() { return *optimizer_; }
  const optim::AdamW& optimizer() const { return *optimizer_; }

  // Clips the (accumulated, averaged) gradients to global norm `clip` (0: no
  // clipping), takes one AdamW step at `lr`, and resets the accumulation.
  // Returns the gradient norm before clipping.
  double update(double lr, double clip);
  int runs_since_update() const { return runs_since_update_; }

 private:
  Tensor loss_;
  std::vector<Tensor> grads_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::vector<const float*> grad_ptrs_;
  std::vector<int64_t> sizes_;
  std::vector<std::vector<float>> accum_;  // used when several runs feed one update
  int micro_batches_ = 1;
  int runs_since_update_ = 0;
  int threads_;
};

// One progress line: rewritten in place on a terminal, printed every
// `every` calls elsewhere (logs, CI).
class Progress {
 public:
  explicit Progress(int every = 50);
  void update(const std::string& line, bool force = false);
  void finish();  // ends the in-place line

 private:
  bool tty_;
  int every_, calls_ = 0;
  size_t last_len_ = 0;
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

}  // namespace nabla
