// The pieces every training command shares: a compiled training step
// (forward, loss, backward, optimizer, planned once and run per batch) and
// the progress line.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "nabla/distributed.h"
#include "nabla/executor.h"
#include "nabla/nn.h"
#include "nabla/optim.h"

namespace nabla {

// One graph, compiled once on options.backend: loss (scalar) and `extras`
// (e.g. logits, for accuracy) and the gradient of every parameter are stage
// 0's outputs (run()); the gradients' norm, the clip and one AdamW node per
// parameter are stage 1 (update()), bit for bit optim::AdamW's arithmetic.
//
// low_memory: a weight gradient that autodiff builds as a product of factors
// smaller than it (a linear layer's over few tokens: [T, R] and [T, C]
// against [R, C]; a fused projection's column blocks; a tied embedding's,
// with the lookup's rows) is never formed whole: the step keeps the factors,
// takes the clip's norm from their Gram matrices, and the update multiplies
// the gradient out a chunk at a time for AdamW (see src/train/factored_gradient.h).
// The backward pass skips those products. Without clipping the parameters
// are the same bit for bit where both paths run nabla's own GEMM kernels;
// with it, the norm (and so the scale) agrees to rounding. Less memory for
// a slightly longer step (docs/performance.md). Needs micro_batches == 1 and
// replicas == 1. The factored norm and update are graph nodes
// (factored_squared_norm, adamw_update_factored), so any backend runs them.
//
// replicas: data parallelism inside the process. The graph (built for one
// replica's share of the batch) is copied replicas - 1 times, sharing the
// parameters; every other leaf (the inputs, and constants, copied with their
// values at construction) is each replica's own: fill replica r's through
// in_replica(r, leaf). run() runs the replicas at once, each on one thread of the
// pool with its own arena, and sums their gradients in replica order;
// update() averages them, as it does micro-batches. For small models, whose
// kernels are too short to split across cores without the fork, join and
// cross-core traffic costing much of the gain, this scales better than
// splitting every kernel (Fashion-MNIST ViT: see docs/performance.md). The
// results depend on the replica count (the batch's gradient is summed in
// that many groups), not on the thread count. Replicas sum in host memory:
// backends with memory of their own run one (micro-batches alone are summed
// by graph nodes, on any backend; processes fold host copies of the
// gradients made after the backward pass, without the overlap below).
//
// comm: data parallelism across processes (distributed.h). Each of its
// comm->size() ranks runs `replicas` replicas; the step is one over all
// size() x replicas of them, rank r's being replicas r x replicas, ...
// (global_replica()). run() folds every replica's gradients in that order
// across the ranks (Communicator::allreduce), so every rank updates the same
// parameters the same way, bit for bit as one process with size() x replicas
// replicas would. The gradients travel in buckets (about 1 MiB, the last
// parameters' first) as the backward pass completes them, on a thread of
// the step's own, while the rest of the backward runs: communication() says
// how much of that time the backward hid.
//
// shard_optimizer (ZeRO-1, with comm): each rank holds and updates its part
// of the AdamW moments alone: the gradients are reduce-scattered (the same
// fold, each rank keeping its part of the sum), each rank updates its part of
// the parameters, and the parts are all-gathered. The parameters are the
// same bit for bit as without sharding: the clip's norm is summed from each
// part's fixed chunks in the same order. The moments take 1/size() of the
// memory; optimizer_state() gathers them for a checkpoint.
//
// The ranks must build the same step (same parameters,
// options and replica count): the constructor checks, a DistributedError on
// every rank where they differ. comm must outlive the step.
// How a TrainStep runs besides its graph: the modes described above.
struct StepOptions {
  int micro_batches = 1;
  bool low_memory = false;
  int replicas = 1;
  dist::Communicator* comm = nullptr;
  bool shard_optimizer = false;
};

class TrainStep {
 public:
  TrainStep(const Tensor& loss, const nn::Params& params, const std::vector<Tensor>& extras,
            const optim::AdamWConfig& adamw, ExecOptions options, StepOptions step = {});
  ~TrainStep();

  // Forward and backward for the batch now in the input leaves (of every
  // replica). With micro_batches > 1, gradients are summed over successive
  // calls and update() averages them. Across ranks, a run that throws on
  // one throws on all (the others a DistributedError naming it) and counts
  // on none.
  void run();
  // The mean of the replicas' losses (of every rank's).
  float loss() const;
  // The gradient of each parameter (in params.list() order), readable
  // through executor() after run(); undefined for the gradients low_memory
  // keeps factored. Replica 0's alone when there are several.
  const std::vector<Tensor>& gradients() const { return grads_; }
  int factored_gradients() const { return n_factored_; }
  int replicas() const { return replicas_; }  // in this process
  // Replica r of this process among all ranks' (0 without a communicator).
  int global_replica(int replica) const;
  int global_replicas() const { return replicas_ * ranks_; }
  dist::Communicator* communicator() const { return comm_; }
  // Across ranks, since construction: the time the gradients' reduction
  // worked (folding, sending, waiting on other ranks; not waiting for this
  // rank's gradients) and the part of it the step waited for after its
  // backward pass; the rest was hidden behind the backward.
  struct CommunicationTime {
    double seconds = 0, exposed_seconds = 0;
    int64_t runs = 0, bytes = 0;  // bytes: one run's reduced gradients
  };
  CommunicationTime communication() const;
  int threads() const { return threads_; }
  // Replica r's copy of a node of the step's graph (an input leaf to fill,
  // an extra to read through executor(r)); t itself for replica 0, and for
  // a parameter (shared). UsageError for a tensor outside the graph.
  Tensor in_replica(int replica, const Tensor& t) const;
  const Executor& executor(int replica = 0) const;
  Executor& executor(int replica = 0);
  // The optimizer's configuration, slots and step count; its moments too
  // unless sharded().
  optim::AdamW& optimizer() { return *optimizer_; }
  const optim::AdamW& optimizer() const { return *optimizer_; }
  bool sharded() const { return sharded_; }
  // Calls use() with an optimizer holding every moment: this step's, or
  // when sharded, on rank 0 alone, one gathered from every rank's part (every
  // rank must call: a collective).
  void with_optimizer_state(const std::function<void(const optim::AdamW&)>& use);
  // Restores the moments (AdamW::state()'s names) and the step count; when
  // sharded, this rank's part of them.
  void load_optimizer_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t steps);

  // Clips the (accumulated, averaged) gradients to global norm `clip` (0: no
  // clipping), takes one AdamW step at `lr`, and resets the accumulation.
  // Returns the gradient norm before clipping. The weight decay of each
  // parameter is optimizer().slots()'s at the time of the call.
  double update(double lr, double clip);
  int runs_since_update() const { return runs_since_update_; }

 private:
  void check_replica(int replica) const;  // UsageError outside [0, replicas())
  Tensor loss_;  // as compiled (rewritten with the gradients)
  std::unordered_map<const Node*, Tensor> rewritten_extras_;  // an extra as given -> as compiled
  std::vector<Tensor> grads_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::vector<const float*> grad_ptrs_;
  std::vector<int64_t> sizes_;
  // The gradients summed when several runs, replicas or ranks feed one
  // update: views of one f32 leaf, in offsets_' order, summed on the host;
  // with micro-batches alone (graph_sums_), a leaf each, summed by the
  // step's accumulate_update nodes (restart_: 1 on a run after an update).
  Tensor accum_flat_;
  std::vector<Tensor> accum_;
  bool graph_sums_ = false;
  Tensor restart_;
  // The update stage's inputs: per parameter {lr, step, weight decay} (rows
  // of f64 [P, 3]); {average, clip}. Its clip_scale node: {norm, scale}.
  Tensor hyper_, settings_, clip_;
  struct Replica;
  std::vector<Replica> copies_;  // replicas 1, 2, ...
  struct Chunk {
    size_t slot;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks_;  // accum_'s elements in pieces, summed in parallel
  // The gradients as one buffer (offsets_[i]: parameter i's first element).
  // Across ranks, reduced_ receives the fold of every replica's
  // (fold_replicas()): accum_flat_'s memory itself with one run a step,
  // unsharded; memory of its own otherwise.
  void fold_replicas(float* acc, int64_t begin, int64_t end, bool first) const;
  dist::Communicator* comm_ = nullptr;
  int ranks_ = 1;
  std::vector<int64_t> offsets_;
  float* reduced_ = nullptr;
  std::vector<float> reduced_storage_;
  // Across ranks on a backend with memory of its own: each gradient's host
  // copy (Executor::host_copy; -1: a constant, read where it is), which
  // the fold reads.
  bool staged_ = false;
  std::vector<int> host_copies_;
  float global_loss_ = 0;
  struct Overlap;  // the buckets and the thread that reduces them
  std::unique_ptr<Overlap> overlap_;
  void start_overlap();
  double sharded_update(double lr, double clip);
  bool sharded_ = false;
  std::vector<int64_t> bounds_;                 // rank r's part: [bounds_[r], bounds_[r + 1]) of offsets_' space
  std::vector<float> shard_m_, shard_v_;        // this rank's part of the moments
  std::vector<float> shard_sum_;                // its part of the gradients, summed over micro-batches
  int n_factored_ = 0;
  int micro_batches_ = 1;
  int replicas_ = 1;
  int runs_since_update_ = 0;
  int threads_;
};

// The replica count the training commands use unless told: one per thread
// (threads 0: the machine's) for a model of at most 2M parameters whose batch
// divides evenly among them, where each replica's copy of the gradients is
// cheap and the kernels are too short to split well; 1 otherwise.
int default_replicas(int threads, int64_t batch, int64_t parameters);

// Replica g's dropout seed (g over every process's replicas, global_replica())
// from the step's: replicas draw different masks, replica 0 the one a single
// replica would.
int32_t replica_seed(int32_t step_seed, int64_t replica);

// Whether the training commands keep weight gradients factored (low_memory)
// unless told: for models of more than 50M parameters, where the gradients
// held whole are a large share of the step's memory and the factors, at the
// few tokens per step that such a model trains on here, a fraction of them. A gradient whose factors would not be smaller
// stays whole, so at many tokens this changes nothing.
bool default_low_memory(int64_t parameters);

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
