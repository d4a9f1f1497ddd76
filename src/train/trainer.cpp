#include "nabla/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "backend/cpu/thread_pool.h"
#include "core/node.h"
#include "core/op.h"
#include "nabla/error.h"
#include "nabla/graph.h"

namespace nabla {

namespace ops {
extern const OpDef op_contiguous;
}  // namespace ops

namespace {

// A parameter's gradient in memory of its own. One that is a small view of a
// larger buffer (layer_norm_affine's dgamma and dbeta share one with dx) is
// copied out: as an output it would otherwise keep the whole buffer alive for
// the rest of the step.
Tensor own_buffer(const Tensor& g) {
  if (g.node()->is_view() && g.node()->root()->numel() > g.numel()) return apply(ops::op_contiguous, {g});
  return contiguous(g);
}

}  // namespace

TrainStep::TrainStep(const Tensor& loss, const nn::Params& params, const std::vector<Tensor>& extras,
                     const optim::AdamWConfig& adamw, ExecOptions options, int micro_batches)
    : loss_(loss), micro_batches_(micro_batches) {
  threads_ = options.threads > 0 ? options.threads : cpu::default_threads();
  std::vector<Tensor> wrt;
  std::vector<optim::Slot> slots;
  for (const auto& [name, p] : params.list()) {
    wrt.push_back(p);
    slots.push_back({name, p, optim::default_decay(name, p)});
  }
  Graph graph({loss});
  for (const Tensor& t : extras) graph.add_output(t);
  for (const Tensor& g : grad(loss, wrt)) {
    grads_.push_back(own_buffer(g));
    graph.add_output(grads_.back());
  }
  executor_ = std::make_unique<Executor>(graph, options);
  optimizer_ = std::make_unique<optim::AdamW>(std::move(slots), adamw, threads_);
  for (const Tensor& g : grads_) {
    grad_ptrs_.push_back(static_cast<const float*>(executor_->data(g)));
    sizes_.push_back(g.numel());
  }
  if (micro_batches_ > 1) accum_.resize(grads_.size());
}

void TrainStep::run() {
  executor_->run();
  ++runs_since_update_;
  if (micro_batches_ <= 1) return;
  if (runs_since_update_ > micro_batches_) {
    throw UsageError("train step: " + std::to_string(runs_since_update_) + " runs without update(), " +
                     std::to_string(micro_batches_) + " micro-batches configured");
  }
  for (size_t i = 0; i < grads_.size(); ++i) {
    const float* g = grad_ptrs_[i];
    std::vector<float>& a = accum_[i];
    if (runs_since_update_ == 1) a.assign(g, g + sizes_[i]);
    else for (int64_t k = 0; k < sizes_[i]; ++k) a[k] += g[k];
  }
}

float TrainStep::loss() const { return executor_->read<float>(loss_)[0]; }

double TrainStep::update(double lr, double clip) {
  if (runs_since_update_ == 0) throw UsageError("train step: update() before any run()");
  std::vector<const float*> grads = grad_ptrs_;
  double scale = 1.0;
  if (micro_batches_ > 1) {
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = accum_[i].data();
    scale = 1.0 / runs_since_update_;
  }
  double norm = optim::global_norm(grads, sizes_, threads_) * scale;
  if (clip > 0 && norm > clip) scale *= clip / norm;
  optimizer_->step(grads, lr, scale);
  runs_since_update_ = 0;
  return norm;
}

Progress::Progress(int every) : tty_(::isatty(STDERR_FILENO)), every_(every) {}

void Progress::update(const std::string& line, bool force) {
  ++calls_;
  if (tty_) {
    std::string padded = line;
    if (padded.size() < last_len_) padded.append(last_len_ - padded.size(), ' ');
    std::fprintf(stderr, "\r%s", padded.c_str());
    std::fflush(stderr);
    last_len_ = line.size();
  } else if (force || calls_ % every_ == 0) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void Progress::finish() {
  if (tty_ && last_len_) std::fprintf(stderr, "\n");
  last_len_ = 0;
}

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

}  // namespace nabla
