#include "nabla/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <optional>

#include "backend/cpu/thread_pool.h"
#include "core/node.h"
#include "core/op.h"
#include "nabla/error.h"
#include "nabla/graph.h"
#include "train/factored_gradient.h"

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

// A factored gradient's factor, read in update(): a leaf's (an input the
// caller may rewrite before update(), a parameter the update itself changes)
// is copied, so the factor is the run's.
Tensor factor_buffer(const Tensor& t) {
  if (t.node()->root()->is_leaf()) return apply(ops::op_contiguous, {t});
  return own_buffer(t);
}

}  // namespace

TrainStep::TrainStep(const Tensor& loss, const nn::Params& params, const std::vector<Tensor>& extras,
                     const optim::AdamWConfig& adamw, ExecOptions options, int micro_batches, bool low_memory)
    : loss_(loss), micro_batches_(micro_batches) {
  if (low_memory && micro_batches > 1) {
    throw UsageError("train step: low_memory keeps no gradient to accumulate over " +
                     std::to_string(micro_batches) + " micro-batches");
  }
  if (!loss.defined() || loss.dtype() != DType::f32 || loss.numel() != 1) {
    throw DTypeError("train step: the loss must be one f32 element, got " +
                     (loss.defined() ? to_string(loss) : std::string("an undefined tensor")));
  }
  threads_ = options.threads > 0 ? options.threads : cpu::default_threads();
  std::vector<Tensor> wrt;
  std::vector<optim::Slot> slots;
  for (const auto& [name, p] : params.list()) {
    wrt.push_back(p);
    slots.push_back({name, p, optim::default_decay(name, p)});
  }
  Graph graph({loss});
  for (const Tensor& t : extras) graph.add_output(t);
  std::vector<std::optional<train::FactoredGradient>> factors;
  for (const Tensor& g : grad(loss, wrt)) {
    factors.push_back(low_memory ? train::factor_gradient(g) : std::nullopt);
    if (auto& f = factors.back()) {
      // The factors instead of the product: it is never computed.
      f->left = factor_buffer(f->left);
      graph.add_output(f->left);
      for (auto& b : f->blocks) {
        b.right = factor_buffer(b.right);
        graph.add_output(b.right);
      }
      if (f->values.defined()) {
        f->values = factor_buffer(f->values);
        f->indices = factor_buffer(f->indices);
        for (const Tensor& t : {f->values, f->indices}) graph.add_output(t);
      }
      grads_.emplace_back();
    } else {
      grads_.push_back(own_buffer(g));
      graph.add_output(grads_.back());
    }
  }
  executor_ = std::make_unique<Executor>(graph, options);
  optimizer_ = std::make_unique<optim::AdamW>(std::move(slots), adamw, threads_);
  for (size_t i = 0; i < grads_.size(); ++i) {
    const auto& f = factors[i];
    grad_ptrs_.push_back(f ? nullptr : static_cast<const float*>(executor_->data(grads_[i])));
    sizes_.push_back(wrt[i].numel());
    factored_.emplace_back();
    if (!f) continue;
    const auto data = [&](const Tensor& t) { return static_cast<const float*>(executor_->data(t)); };
    std::vector<train::GradientRows::Block> blocks;
    for (const auto& b : f->blocks) blocks.push_back({data(b.right), b.col, b.right.dim(1)});
    const bool rows_added = f->values.defined();
    factored_.back() = std::make_unique<train::GradientRows>(
        data(f->left), f->left.dim(0), f->left.dim(1), wrt[i].dim(1), std::move(blocks),
        rows_added ? data(f->values) : nullptr,
        rows_added ? static_cast<const int32_t*>(executor_->data(f->indices)) : nullptr,
        rows_added ? f->indices.numel() : 0, options.bf16_matmul);
    ++n_factored_;
  }
  if (micro_batches_ > 1) accum_.resize(grads_.size());
}

TrainStep::~TrainStep() = default;

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
  optim::GradientRange range;
  double norm = 0;
  if (n_factored_ > 0) {
    // The gradients held whole, then the factored ones' norms from their
    // factors, each summed in slot order.
    std::vector<const float*> whole;
    std::vector<int64_t> whole_sizes;
    std::vector<size_t> factored;
    for (size_t i = 0; i < grads.size(); ++i) {
      if (factored_[i]) {
        factored_[i]->check_indices();
        factored_[i]->new_run();
        factored.push_back(i);
      } else {
        whole.push_back(grads[i]);
        whole_sizes.push_back(sizes_[i]);
      }
    }
    std::vector<double> squares(factored.size());
    cpu::parallel_for(threads_, int64_t(factored.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) squares[k] = factored_[factored[k]]->squared_norm();
    });
    const double whole_norm = optim::global_norm(whole, whole_sizes, threads_);
    double sq = whole_norm * whole_norm;
    for (double x : squares) sq += x;
    norm = std::sqrt(sq) * scale;
    range = [this](size_t slot, int64_t begin, int64_t end) { return factored_[slot]->range(begin, end); };
  } else {
    norm = optim::global_norm(grads, sizes_, threads_) * scale;
  }
  if (clip > 0 && norm > clip) scale *= clip / norm;
  optimizer_->step(grads, lr, scale, range);
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
