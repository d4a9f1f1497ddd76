#include "nabla/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"
#include "core/graph_internal.h"
#include "core/node.h"
#include "core/op.h"
#include "nabla/error.h"
#include "nabla/graph.h"
#include "ops/internal_ops.h"
#include "optim/update.h"
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

// Every rank's step must be the same: its parameters (names, shapes and
// values: the model, its initialisation or checkpoint), the optimizer and the
// replica count.
void check_same_step(dist::Communicator& comm, const nn::Params& params, const optim::AdamWConfig& adamw,
                     const ExecOptions& options, int micro_batches, int replicas, bool sharded) {
  std::string names;
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const auto& [name, p] : params.list()) {
    names += name + to_string(p.shape()) + " ";
    hash = dist::fingerprint(p.data(), size_t(p.numel()) * dtype_size(p.dtype()), hash);
  }
  dist::check_same(comm, "the model's parameters", std::to_string(params.list().size()) + " tensors " + names);
  dist::check_same(comm, "the parameters' values (seed, initialisation or checkpoint)", "hash " + std::to_string(hash));
  char text[256];
  std::snprintf(text, sizeof text,
                "AdamW betas %.17g %.17g eps %.17g wd %.17g%s, %d replicas, %d micro-batches, %s matmul", adamw.beta1,
                adamw.beta2, adamw.eps, adamw.weight_decay, sharded ? " sharded" : "", replicas, micro_batches,
                options.bf16_matmul ? "bf16" : "f32");
  dist::check_same(comm, "the training step's options", text);
}

// Gradient elements per piece when summing runs and replicas into the
// accumulation: enough pieces to share among threads.
constexpr int64_t kSumChunk = int64_t{1} << 14;

}  // namespace

// Gradients across ranks, overlapped with the backward pass: each
// replica's executor counts down its bucket as a gradient completes; a
// thread of the step's own reduces the buckets in order as they reach zero.
struct TrainStep::Overlap {
  // About 1 MiB of f32: large enough that each message's fixed costs vanish,
  // small enough that the first bucket leaves early in the backward.
  static constexpr int64_t kBucket = int64_t{1} << 18;
  std::vector<dist::Communicator::Range> buckets;  // in reduction order
  std::vector<int> initial;                        // per bucket: gradients still to come at a run's start
  std::vector<std::vector<size_t>> params;         // per bucket: its parameters (staged: their host copies to wait for)
  std::unique_ptr<std::atomic<int>[]> pending;
  std::mutex mu;
  std::condition_variable cv;
  bool start = false, finished = false, stop = false;
  // NABLA_OVERLAP=0: every bucket waits for the whole backward pass, to
  // measure what the overlap hides (bench/train_mpi.sh).
  bool after_backward = false;
  // This rank's run failed: the reduction goes on without its gradients
  // (the other ranks are in it), and the run fails on every rank.
  std::atomic<bool> abandoned{false};
  std::exception_ptr error;
  double busy_seconds = 0;  // the last run's
  CommunicationTime time;
  std::thread thread;
};

struct TrainStep::Replica {
  std::unique_ptr<Executor> executor;
  GradMap copies;  // original node -> this replica's
  Tensor loss;
  std::vector<const float*> grads;
};

TrainStep::TrainStep(const Tensor& loss, const nn::Params& params, const std::vector<Tensor>& extras,
                     const optim::AdamWConfig& adamw, ExecOptions options, StepOptions step)
    : loss_(loss), comm_(step.comm), ranks_(step.comm ? step.comm->size() : 1),
      sharded_(step.shard_optimizer && ranks_ > 1), micro_batches_(step.micro_batches), replicas_(step.replicas) {
  const int micro_batches = step.micro_batches, replicas = step.replicas;
  const bool low_memory = step.low_memory;
  if (micro_batches < 1) {
    throw UsageError("train step: micro_batches must be at least 1, got " + std::to_string(micro_batches));
  }
  if (replicas < 1) throw UsageError("train step: replicas must be at least 1, got " + std::to_string(replicas));
  if (low_memory && micro_batches > 1) {
    throw UsageError("train step: low_memory keeps no gradient to accumulate over " +
                     std::to_string(micro_batches) + " micro-batches");
  }
  if (low_memory && replicas > 1) {
    throw UsageError("train step: low_memory keeps no gradient to sum over " + std::to_string(replicas) +
                     " replicas");
  }
  if (!loss.defined() || loss.dtype() != DType::f32 || loss.numel() != 1) {
    throw DTypeError("train step: the loss must be one f32 element, got " +
                     (loss.defined() ? to_string(loss) : std::string("an undefined tensor")));
  }
  if (low_memory && ranks_ > 1) {
    throw UsageError("train step: low_memory keeps no gradient to sum over " + std::to_string(ranks_) + " processes");
  }
  const Backend& backend = find_backend(options.backend);
  const std::string backend_name = backend.name();
  if (replicas > 1 && !backend.host_memory()) {
    throw UsageError("train step: replicas sum gradients in host memory; the '" + backend_name +
                     "' backend has memory of its own (one replica a process there; micro-batches sum on it)");
  }
  if (sharded_ && !backend.host_memory()) {
    throw UsageError("train step: a sharded optimizer updates its part on the host; the '" + backend_name +
                     "' backend keeps the parameters in memory of its own (train there without sharding)");
  }
  // Processes on such a backend fold host copies of the gradients, each
  // queued behind the kernel that completes it.
  staged_ = ranks_ > 1 && !backend.host_memory();
  threads_ = options.threads > 0 ? options.threads : cpu::default_threads();
  std::vector<Tensor> wrt;
  std::vector<optim::Slot> slots;
  for (const auto& [name, p] : params.list()) {
    wrt.push_back(p);
    slots.push_back({name, p, optim::default_decay(name, p)});
    sizes_.push_back(p.numel());
  }
  optimizer_ = std::make_unique<optim::AdamW>(std::move(slots), adamw, threads_, /*hold_moments=*/!sharded_);
  // Factoring reads the gradients as the CPU rewrite fuses them (a weight's
  // product placed by add_slice, a tied embedding's add_rows). The loss and
  // the extras are rewritten with them, in one pass: a rewrite that touched
  // the forward (a residual add fused into its matmul) would otherwise leave
  // the gradients on a second copy of the forward pass.
  std::vector<Tensor> stage0{loss};
  stage0.insert(stage0.end(), extras.begin(), extras.end());
  const size_t n_forward = stage0.size();
  for (const Tensor& g : grad(loss, wrt)) stage0.push_back(g);
  stage0 = backend.rewrite(stage0, nullptr);
  loss_ = stage0[0];
  Graph graph;
  graph.add_output(loss_, loss, 0);
  for (size_t i = 0; i < extras.size(); ++i) {
    graph.add_output(stage0[1 + i], extras[i], 0);
    rewritten_extras_.emplace(extras[i].node(), stage0[1 + i]);
  }
  std::vector<std::optional<train::FactoredGradient>> factors;
  for (size_t i = n_forward; i < stage0.size(); ++i) {
    const Tensor& g = stage0[i];
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
      ++n_factored_;
    } else {
      grads_.push_back(own_buffer(g));
      graph.add_output(grads_.back());
    }
  }
  offsets_.push_back(0);
  for (int64_t n : sizes_) offsets_.push_back(offsets_.back() + n);
  graph_sums_ = micro_batches_ > 1 && replicas == 1 && ranks_ == 1;
  if (graph_sums_) {
    // Micro-batches alone: their sums are graph nodes, on the step's backend.
    restart_ = Tensor::zeros(DType::f64, {1});
    for (size_t i = 0; i < grads_.size(); ++i) {
      accum_.push_back(Tensor::zeros(DType::f32, wrt[i].shape()));
      graph.add_output(accumulate_update(accum_.back(), grads_[i], restart_), 0);
    }
  } else if ((micro_batches_ > 1 || replicas > 1 || ranks_ > 1) && !sharded_) {
    // One buffer, each parameter's sum a view of it: across ranks, the
    // reduction writes it in place.
    accum_flat_ = Tensor::zeros(DType::f32, {offsets_.back()});
    for (size_t i = 0; i < grads_.size(); ++i) {
      accum_.push_back(reshape(slice(accum_flat_, 0, offsets_[i], offsets_[i + 1]), wrt[i].shape()));
      for (int64_t b = 0; b < sizes_[i]; b += kSumChunk) chunks_.push_back({i, b, std::min(sizes_[i], b + kSumChunk)});
    }
  }
  if (!sharded_) {
    // Stage 1, the update, reads the gradients (or their sum over runs and
    // replicas), or a factored one's factors: their norm, the clip's scale,
    // and one AdamW node per parameter on its moments. Its numbers come in
    // through two leaves.
    const std::vector<Tensor>& g = accum_.empty() ? grads_ : accum_;
    hyper_ = Tensor::zeros(DType::f64, {int64_t(wrt.size()), 3});
    settings_ = Tensor::zeros(DType::f64, {2});
    Tensor sq;
    if (n_factored_ == 0) {
      sq = squared_norm(g);
    } else {
      // The gradients held whole, their norm squared again (as the bits of
      // the host path this replaced had it), then each factored one's.
      std::vector<Tensor> whole;
      for (size_t i = 0; i < g.size(); ++i) {
        if (!factors[i]) whole.push_back(g[i]);
      }
      sq = whole.empty() ? Tensor::scalar(0.0, DType::f64) : square(sqrt(squared_norm(whole)));
      for (size_t i = 0; i < g.size(); ++i) {
        if (factors[i]) sq = sq + factored_squared_norm(*factors[i], wrt[i].dim(0), wrt[i].dim(1), options.bf16_matmul);
      }
    }
    clip_ = clip_scale(sq, settings_);
    graph.add_output(clip_, 1);
    const Tensor scale = slice(clip_, 0, 1, 2);
    for (size_t i = 0; i < wrt.size(); ++i) {
      const Tensor hyper = reshape(slice(hyper_, 0, int64_t(i), int64_t(i) + 1), {3});
      const Tensor &m = optimizer_->exp_avg(i), &v = optimizer_->exp_avg_sq(i);
      graph.add_output(factors[i] ? adamw_update_factored(wrt[i], m, v, hyper, scale, *factors[i], options.bf16_matmul,
                                                          adamw.beta1, adamw.beta2, adamw.eps)
                                  : adamw_update(wrt[i], g[i], m, v, hyper, scale, adamw.beta1, adamw.beta2, adamw.eps),
                       1);
    }
  }
  // Replicas run side by side, each on one of the pool's threads; a kernel
  // inside one runs on that thread alone.
  ExecOptions replica_options = options;
  if (replicas > 1) replica_options.threads = 1;
  executor_ = std::make_unique<Executor>(graph, replica_options);
  if (replicas > 1) {
    NodeSet shared;
    for (const Tensor& p : wrt) shared.insert(p.node());
    std::vector<Tensor> outputs(stage0.begin(), stage0.begin() + std::ptrdiff_t(n_forward));
    outputs.insert(outputs.end(), grads_.begin(), grads_.end());
    copies_.resize(size_t(replicas - 1));
    for (Replica& r : copies_) {
      std::vector<Tensor> out = clone_graph(outputs, shared, r.copies);
      r.executor = std::make_unique<Executor>(Graph(out), replica_options);
      r.loss = out[0];
      for (size_t i = 1 + extras.size(); i < out.size(); ++i) {
        r.grads.push_back(static_cast<const float*>(r.executor->data(out[i])));
      }
    }
  }
  // Host addresses for the sums over runs, replicas and ranks (staged: the
  // host copies', set as the reduction waits for them).
  if (staged_) {
    grad_ptrs_.assign(grads_.size(), nullptr);
  } else if ((!accum_.empty() && !graph_sums_) || ranks_ > 1) {
    for (const Tensor& g : grads_) grad_ptrs_.push_back(static_cast<const float*>(executor_->data(g)));
  }
  if (ranks_ > 1) {
    // One run a step, unsharded: the fold lands in the update's buffer.
    if (!sharded_ && micro_batches_ == 1) {
      reduced_ = accum_flat_.data_as<float>();
    } else {
      reduced_storage_.resize(size_t(offsets_.back()));
      reduced_ = reduced_storage_.data();
    }
    check_same_step(*comm_, params, adamw, options, micro_batches, replicas, sharded_);
    if (sharded_) {
      // Parts on the norm's chunk boundaries: each rank sums whole chunks.
      const int64_t n = offsets_.back(), K = optim::kNormChunk;
      for (int r = 0; r < ranks_; ++r) bounds_.push_back(std::min(n, n * r / ranks_ / K * K));
      bounds_.push_back(n);
      const size_t part = size_t(bounds_[size_t(comm_->rank()) + 1] - bounds_[size_t(comm_->rank())]);
      shard_m_.assign(part, 0.0f);
      shard_v_.assign(part, 0.0f);
      if (micro_batches_ > 1) shard_sum_.assign(part, 0.0f);
    }
    start_overlap();
  }
}

void TrainStep::start_overlap() {
  auto o = std::make_unique<Overlap>();
  const char* overlap = std::getenv("NABLA_OVERLAP");
  o->after_backward = overlap && std::string(overlap) == "0";
  // Buckets of whole parameters, the last first: the backward pass meets them
  // in about that order.
  std::vector<int> bucket_of(sizes_.size());
  for (size_t end = sizes_.size(); end > 0;) {
    size_t begin = end - 1;
    while (begin > 0 && offsets_[end] - offsets_[begin - 1] <= Overlap::kBucket) --begin;
    o->params.emplace_back();
    for (size_t i = begin; i < end; ++i) {
      bucket_of[i] = int(o->buckets.size());
      o->params.back().push_back(i);
    }
    o->buckets.push_back({offsets_[begin], offsets_[end]});
    end = begin;
  }
  o->initial.assign(o->buckets.size(), 0);
  o->pending = std::make_unique<std::atomic<int>[]>(o->buckets.size());
  Overlap* ov = o.get();
  for (int r = 0; r < replicas_; ++r) {
    for (size_t i = 0; i < sizes_.size(); ++i) {
      const Tensor g = r == 0 ? grads_[i] : copies_[size_t(r) - 1].copies.at(grads_[i].node());
      const int b = bucket_of[i];
      const auto arrived = [ov, b] {
        if (ov->pending[size_t(b)].fetch_sub(1) == 1) {
          std::lock_guard<std::mutex> lock(ov->mu);
          ov->cv.notify_all();
        }
      };
      if (staged_) {
        // The copy is queued (not landed) when `arrived` runs; the reduction
        // waits for it before reading.
        host_copies_.push_back(executor_->host_copy(g, arrived));
        if (host_copies_.back() < 0) grad_ptrs_[i] = static_cast<const float*>(g.data());  // a constant
        o->initial[size_t(b)] += host_copies_.back() >= 0;
      } else {
        o->initial[size_t(b)] += executor(r).on_computed(g, arrived);
      }
    }
  }
  o->time.bytes = offsets_.back() * int64_t(sizeof(float));
  o->thread = std::thread([this, ov] {
    std::unique_lock<std::mutex> lock(ov->mu);
    for (;;) {
      ov->cv.wait(lock, [&] { return ov->start || ov->stop; });
      if (ov->stop) return;
      ov->start = false;
      lock.unlock();
      try {
        using Clock = std::chrono::steady_clock;
        const auto begun = Clock::now();
        Clock::duration idle{};
        comm_->allreduce_buckets(
            reduced_, ov->buckets,
            [this, ov](float* acc, int64_t begin, int64_t end, bool first_rank) {
              if (!ov->abandoned) {
                fold_replicas(acc, begin, end, first_rank);
              } else if (first_rank) {
                std::fill(acc, acc + (end - begin), 0.0f);
              }
            },
            [&](size_t k) {
              const auto waiting = Clock::now();
              std::unique_lock<std::mutex> wait(ov->mu);
              ov->cv.wait(wait, [&] {
                if (ov->stop || ov->abandoned) return true;
                if (!ov->after_backward) return ov->pending[k].load() == 0;
                for (size_t j = 0; j < ov->buckets.size(); ++j) {
                  if (ov->pending[j].load() != 0) return false;
                }
                return true;
              });
              if (ov->stop) throw UsageError("train step: destroyed during a run");
              wait.unlock();
              for (size_t i : staged_ && !ov->abandoned ? ov->params[k] : std::vector<size_t>{}) {
                if (host_copies_[i] >= 0) grad_ptrs_[i] = static_cast<const float*>(executor_->host_copied(host_copies_[i]));
              }
              idle += Clock::now() - waiting;
            },
            bounds_);
        // Time at work (folding, sending, waiting on other ranks), not
        // waiting for this rank's gradients.
        ov->busy_seconds = std::chrono::duration<double>(Clock::now() - begun - idle).count();
      } catch (...) {
        ov->error = std::current_exception();
      }
      lock.lock();
      ov->finished = true;
      ov->cv.notify_all();
    }
  });
  overlap_ = std::move(o);
}

TrainStep::~TrainStep() {
  if (!overlap_) return;
  {
    std::lock_guard<std::mutex> lock(overlap_->mu);
    overlap_->stop = true;
  }
  overlap_->cv.notify_all();
  overlap_->thread.join();
}

void TrainStep::run() {
  if (micro_batches_ > 1 && runs_since_update_ >= micro_batches_) {
    throw UsageError("train step: " + std::to_string(runs_since_update_ + 1) + " runs without update(), " +
                     std::to_string(micro_batches_) + " micro-batches configured");
  }
  // One micro-batch: a run replaces the last one's gradients.
  if (micro_batches_ == 1) runs_since_update_ = 0;
  const auto start_reduction = [&] {
    for (size_t b = 0; b < overlap_->buckets.size(); ++b) overlap_->pending[b] = overlap_->initial[b];
    std::lock_guard<std::mutex> lock(overlap_->mu);
    overlap_->start = true;
    overlap_->finished = false;
    overlap_->abandoned = false;
    overlap_->cv.notify_all();
  };
  // The reduction starts as the first bucket completes.
  if (overlap_) start_reduction();
  if (graph_sums_) restart_.assign<double>({runs_since_update_ == 0 ? 1.0 : 0.0});
  std::exception_ptr failed;
  try {
    if (copies_.empty()) {
      executor_->run(0);  // stage 1, the update, is update()'s
    } else {
      cpu::parallel_for(threads_, replicas(), 1, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) executor(int(r)).run(0);
      });
    }
  } catch (...) {
    if (ranks_ == 1) throw;
    // The other ranks are reducing: take part without gradients, then fail
    // on every rank below (a rank left out would wait for ever).
    failed = std::current_exception();
    std::lock_guard<std::mutex> lock(overlap_->mu);
    overlap_->abandoned = true;
    overlap_->cv.notify_all();
  }
  if (ranks_ > 1) {
    // Every rank's replicas folded in global order (by the overlap's
    // thread, bucket by bucket), then accum (+)= it.
    {
      const auto waited = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(overlap_->mu);
      overlap_->cv.wait(lock, [&] { return overlap_->finished; });
      const auto now = std::chrono::steady_clock::now();
      if (overlap_->error) std::rethrow_exception(overlap_->error);
      CommunicationTime& t = overlap_->time;
      t.exposed_seconds += std::chrono::duration<double>(now - waited).count();
      t.seconds += overlap_->busy_seconds;
      ++t.runs;
    }
    // The losses of every replica and whether its rank's run failed, before
    // anything is accumulated: a failed run counts on no rank.
    const size_t per_rank = size_t(replicas_) + 1;
    std::vector<float> mine(per_rank, 0.0f), all(per_rank * size_t(ranks_));
    for (int r = 0; r < replicas_ && !failed; ++r) {
      const Tensor& l = r == 0 ? loss_ : copies_[size_t(r) - 1].loss;
      mine[size_t(r)] = executor(r).read<float>(l)[0];
    }
    mine.back() = failed ? 1.0f : 0.0f;
    comm_->all_gather_bytes(mine.data(), all.data(), mine.size() * sizeof(float));
    if (failed) std::rethrow_exception(failed);
    for (int k = 0; k < ranks_; ++k) {
      if (all[size_t(k + 1) * per_rank - 1] != 0) {
        throw DistributedError("train step: the run failed on rank " + std::to_string(k) +
                               " (its error says why); no rank counts it");
      }
    }
    // The losses summed in the same order as one process's.
    double sum = 0;
    for (int k = 0; k < ranks_; ++k) {
      for (int r = 0; r < replicas_; ++r) sum += all[size_t(k) * per_rank + size_t(r)];
    }
    global_loss_ = float(sum / global_replicas());
    const bool first = ++runs_since_update_ == 1;
    if (sharded_ && micro_batches_ > 1) {
      // This rank's part alone: shard_sum (+)= it.
      const float* s = reduced_ + bounds_[size_t(comm_->rank())];
      for (size_t k = 0; k < shard_sum_.size(); ++k) shard_sum_[k] = first ? s[k] : shard_sum_[k] + s[k];
    }
    if (!sharded_ && micro_batches_ > 1) {
      float* accum = accum_flat_.data_as<float>();
      cpu::parallel_for(threads_, int64_t(chunks_.size()), 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
          const Chunk& piece = chunks_[size_t(c)];
          const float* s = reduced_ + offsets_[piece.slot];
          float* a = accum + offsets_[piece.slot];
          for (int64_t k = piece.begin; k < piece.end; ++k) a[k] = first ? s[k] : a[k] + s[k];
        }
      });
    }
    return;
  }
  const bool first = ++runs_since_update_ == 1;
  if (accum_.empty() || graph_sums_) return;
  // accum (+)= g_0 + g_1 + ...: the same order whichever thread sums a piece.
  float* accum = accum_flat_.data_as<float>();
  cpu::parallel_for(threads_, int64_t(chunks_.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const Chunk& piece = chunks_[size_t(c)];
      const float* g0 = grad_ptrs_[piece.slot];
      float* a = accum + offsets_[piece.slot];
      for (int64_t k = piece.begin; k < piece.end; ++k) {
        float s = g0[k];
        for (const Replica& r : copies_) s += r.grads[piece.slot][k];
        a[k] = first ? s : a[k] + s;
      }
    }
  });
}

// On the overlap's thread, beside the backward pass that holds the pool:
// one thread, memory-bound anyway.
void TrainStep::fold_replicas(float* acc, int64_t begin, int64_t end, bool first) const {
  size_t slot = size_t(std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin()) - 1;
  for (int64_t k = begin; k < end; ++slot) {
    const int64_t stop = std::min(end, offsets_[slot + 1]), base = offsets_[slot];
    const float* g0 = grad_ptrs_[slot];
    for (int64_t i = k; i < stop; ++i) {
      float s = first ? g0[i - base] : acc[i - begin] + g0[i - base];
      for (const Replica& r : copies_) s += r.grads[slot][i - base];
      acc[i - begin] = s;
    }
    k = stop;
  }
}

TrainStep::CommunicationTime TrainStep::communication() const {
  return overlap_ ? overlap_->time : CommunicationTime{};
}

int TrainStep::global_replica(int replica) const {
  check_replica(replica);
  return (comm_ ? comm_->rank() : 0) * replicas_ + replica;
}

float TrainStep::loss() const {
  if (ranks_ > 1) return global_loss_;
  double sum = executor_->read<float>(loss_)[0];  // one replica: exactly its loss again
  for (const Replica& r : copies_) sum += r.executor->read<float>(r.loss)[0];
  return float(sum / replicas());
}

void TrainStep::check_replica(int replica) const {
  if (replica < 0 || replica >= replicas()) {
    throw UsageError("train step: replica " + std::to_string(replica) + " of " + std::to_string(replicas()));
  }
}

Tensor TrainStep::in_replica(int replica, const Tensor& t) const {
  check_replica(replica);
  if (!t.defined()) throw UsageError("train step: in_replica of an undefined tensor");
  if (replica == 0) return t;
  const GradMap& copies = copies_[size_t(replica - 1)].copies;
  const auto extra = rewritten_extras_.find(t.node());
  auto it = copies.find(extra != rewritten_extras_.end() ? extra->second.node() : t.node());
  if (it == copies.end()) throw UsageError("train step: " + to_string(t) + " is not in the step's graph");
  return it->second;
}

const Executor& TrainStep::executor(int replica) const {
  check_replica(replica);
  if (replica == 0) return *executor_;
  return *copies_[size_t(replica - 1)].executor;
}

Executor& TrainStep::executor(int replica) {
  return const_cast<Executor&>(static_cast<const TrainStep&>(*this).executor(replica));
}

double TrainStep::update(double lr, double clip) {
  if (runs_since_update_ == 0) throw UsageError("train step: update() before any run()");
  if (!(lr >= 0) || !std::isfinite(lr)) {
    throw UsageError("adamw: learning rate must be finite and >= 0, got " + std::to_string(lr));
  }
  if (!(clip >= 0)) throw UsageError("train step: clip must be >= 0 (0: none), got " + std::to_string(clip));
  if (sharded_) return sharded_update(lr, clip);
  // Runs and replicas summed: their mean.
  const double average = accum_.empty() ? 1.0 : 1.0 / (double(runs_since_update_) * global_replicas());
  const int64_t t = optimizer_->count_step();
  const double wd = optimizer_->config().weight_decay;
  double* hyper = hyper_.data_as<double>();
  for (size_t i = 0; i < optimizer_->slots().size(); ++i) {
    hyper[3 * i] = lr;
    hyper[3 * i + 1] = double(t);
    hyper[3 * i + 2] = optimizer_->slots()[i].decay ? wd : 0.0;
  }
  settings_.assign<double>({average, clip});
  executor_->run(1);
  runs_since_update_ = 0;
  return executor_->read<double>(clip_)[0];
}

double TrainStep::sharded_update(double lr, double clip) {
  const double average = 1.0 / (double(runs_since_update_) * global_replicas());
  runs_since_update_ = 0;
  const int64_t t = optimizer_->count_step();
  const size_t rank = size_t(comm_->rank());
  const int64_t lo = bounds_[rank], hi = bounds_[rank + 1], K = optim::kNormChunk;
  if (micro_batches_ > 1) std::copy(shard_sum_.begin(), shard_sum_.end(), reduced_ + lo);
  // The norm: this part's chunks, then every rank's partial sums added in
  // chunk order, as squared_norm's kernel adds them in one process.
  std::vector<const float*> grads;
  for (size_t i = 0; i < sizes_.size(); ++i) grads.push_back(reduced_ + offsets_[i]);
  int64_t most = 0;
  for (int r = 0; r < ranks_; ++r) most = std::max(most, (bounds_[size_t(r) + 1] - bounds_[size_t(r)] + K - 1) / K);
  std::vector<double> mine(static_cast<size_t>(most), 0.0), all(static_cast<size_t>(most * ranks_));
  const int64_t first_chunk = lo / K, chunks = (hi - lo + K - 1) / K;
  cpu::parallel_for(threads_, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) mine[size_t(c)] = optim::squared_norm_chunk(grads, offsets_, first_chunk + c);
  });
  comm_->all_gather_bytes(mine.data(), all.data(), mine.size() * sizeof(double));
  double squares = 0;
  for (int r = 0; r < ranks_; ++r) {
    const int64_t count = (bounds_[size_t(r) + 1] - bounds_[size_t(r)] + K - 1) / K;
    for (int64_t c = 0; c < count; ++c) squares += all[size_t(r * most + c)];
  }
  const optim::ClipScale cs = optim::clip_scale(squares, average, clip);
  // AdamW on this part: each parameter's elements in it, in pieces for the
  // threads (an element's update does not depend on where a piece starts).
  for (size_t i = 0; i < sizes_.size(); ++i) {
    const int64_t b = std::max(lo, offsets_[i]), e = std::min(hi, offsets_[i + 1]);
    if (b >= e) continue;
    const optim::Slot& slot = optimizer_->slots()[i];
    const optim::AdamWConstants k = optim::adamw_constants(optimizer_->config(), t, lr, cs.scale, slot.decay);
    float* p = Tensor(slot.param).data_as<float>() + (b - offsets_[i]);
    float *m = shard_m_.data() + (b - lo), *v = shard_v_.data() + (b - lo);
    const float* g = reduced_ + b;
    cpu::parallel_for(threads_, e - b, kSumChunk, [&](int64_t pb, int64_t pe) {
      optim::adamw_update(p + pb, m + pb, v + pb, g + pb, pe - pb, k);
    });
  }
  // Every rank's part of the parameters to every rank, through reduced_.
  for (size_t i = 0; i < sizes_.size(); ++i) {
    const int64_t b = std::max(lo, offsets_[i]), e = std::min(hi, offsets_[i + 1]);
    const float* p = static_cast<const float*>(optimizer_->slots()[i].param.data());
    if (b < e) std::copy_n(p + (b - offsets_[i]), e - b, reduced_ + b);
  }
  comm_->all_gather(reduced_, bounds_);
  for (size_t i = 0; i < sizes_.size(); ++i) {
    float* p = Tensor(optimizer_->slots()[i].param).data_as<float>();
    for (int64_t k = offsets_[i]; k < offsets_[i + 1]; ++k) {
      if (k < lo || k >= hi) p[k - offsets_[i]] = reduced_[size_t(k)];
    }
  }
  return cs.norm;
}

void TrainStep::with_optimizer_state(const std::function<void(const optim::AdamW&)>& use) {
  if (!sharded_) return use(*optimizer_);
  // Each moment's parts gathered to rank 0 through reduced_ (unused between
  // steps), into an optimizer of its own there.
  const int rank = comm_->rank();
  const int64_t lo = bounds_[size_t(rank)];
  std::vector<std::pair<std::string, Tensor>> state;
  for (const auto* part : {&shard_m_, &shard_v_}) {
    std::copy(part->begin(), part->end(), reduced_ + lo);
    comm_->gather(reduced_, bounds_, 0);
    if (rank != 0) continue;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      const optim::Slot& slot = optimizer_->slots()[i];
      state.emplace_back(std::string(part == &shard_m_ ? "optimizer.exp_avg." : "optimizer.exp_avg_sq.") + slot.name,
                         Tensor::from_data(DType::f32, slot.param.shape(), reduced_ + offsets_[i]));
    }
  }
  if (rank != 0) return;
  optim::AdamW gathered(optimizer_->slots(), optimizer_->config(), threads_);
  gathered.load_state(state, optimizer_->steps());
  use(gathered);
}

void TrainStep::load_optimizer_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t steps) {
  optimizer_->load_state(tensors, steps);  // all of them, or (sharded) checked and the step count
  if (!sharded_) return;
  const int64_t lo = bounds_[size_t(comm_->rank())], hi = bounds_[size_t(comm_->rank()) + 1];
  auto find = [&](const std::string& name) -> const float* {
    for (const auto& [n, t] : tensors) {
      if (n == name) return static_cast<const float*>(t.data());
    }
    throw IoError("optimizer state: missing '" + name + "'");
  };
  for (size_t i = 0; i < sizes_.size(); ++i) {
    const int64_t b = std::max(lo, offsets_[i]), e = std::min(hi, offsets_[i + 1]);
    if (b >= e) continue;
    const std::string& name = optimizer_->slots()[i].name;
    std::copy_n(find("optimizer.exp_avg." + name) + (b - offsets_[i]), e - b, shard_m_.begin() + (b - lo));
    std::copy_n(find("optimizer.exp_avg_sq." + name) + (b - offsets_[i]), e - b, shard_v_.begin() + (b - lo));
  }
}

int32_t replica_seed(int32_t step_seed, int64_t replica) {
  return int32_t(uint32_t(step_seed) + uint32_t(replica) * 0x9e3779b9u);
}

int default_replicas(int threads, int64_t batch, int64_t parameters) {
  const int t = threads > 0 ? threads : cpu::default_threads();
  constexpr int64_t kSmallModel = 2'000'000;
  if (t <= 1 || parameters > kSmallModel || batch % t != 0) return 1;
  return t;
}

bool default_low_memory(int64_t parameters) {
  constexpr int64_t kLargeModel = 50'000'000;
  return parameters > kLargeModel;
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
