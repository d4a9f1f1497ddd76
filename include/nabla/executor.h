// Executor: compiles a Graph once (memory plan, kernel arguments) and runs it
// as often as needed; leaves may be rewritten between runs (new batches,
// updated weights).
#pragma once

#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nabla/graph.h"

namespace nabla {

struct ExecOptions {
  int threads = 0;            // 0: cpu::default_threads()
  bool plan_memory = true;    // reuse buffers once their last reader has run
  bool inplace = true;        // let elementwise ops overwrite a dying input
  bool check_finite = false;  // stop at the first op that produces NaN or Inf
  size_t memory_limit = 0;    // bytes; 0: none. Checked before allocating.
  // f32 matmuls round their operands to bfloat16 and accumulate in f32 (as
  // mixed-precision training does); f64 matmuls are unaffected.
  bool bf16_matmul = false;
  // For tests: caps every kernel's chunk size so work is split finely and
  // chunk boundaries are exercised; results must not change. 0: no cap.
  int64_t max_grain = 0;
  // Time every kernel (also NABLA_PROFILE=1); see Executor::profile().
  bool profile = false;
  // Which backend runs the graph: "cpu", "reference", "cuda-emulated" (the
  // CUDA kernels on the CPU, for tests) or "cuda" (backend_names()).
  // Leaves on the host are copied to a backend with memory of its own at
  // every run, except parameters and what update ops write: those stay
  // there between runs, copied back only when the host reads them.
  std::string backend = "cpu";
};

// The backends this build has, "cpu" first.
std::vector<std::string> backend_names();
// Empty when backend `name` can run here; else why not ("cuda: no CUDA
// device (...)", or that this build has no such backend).
std::string backend_unavailable(const std::string& name);

struct MemoryReport {
  size_t arena_bytes = 0;     // planned size of the intermediate-buffer arena
  size_t unplanned_bytes = 0; // what the intermediates would take without reuse
  int buffers = 0;            // intermediates with their own memory
  int inplace = 0;            // intermediates that reuse an input's buffer in place
};

class Executor {
 public:
  explicit Executor(const Graph& graph, ExecOptions options = {});
  ~Executor();
  Executor(Executor&&) noexcept;
  Executor& operator=(Executor&&) noexcept;

  void run();  // every stage, as one
  // The nodes of one stage of the graph (Graph::add_output), e.g. a training
  // step's update after its gradients were read or summed.
  void run(int stage);
  int stages() const;

  const MemoryReport& memory() const;
  // Per-op kernel time over every run() so far, largest first, one line per
  // op: "matmul  41.2%  812.3 ms  2400 calls". Empty unless profiling.
  std::string profile() const;
  // Forgets the times gathered so far, e.g. after warm-up runs whose first
  // touches of the arena (page faults) would swell every node's figure.
  void reset_profile();
  int threads() const;

  // The values of an output, leaf, or view of either, after run(); in
  // row-major order whatever the tensor's strides. UsageError for a tensor
  // whose memory the plan may have reused.
  void read(const Tensor& t, void* dst, size_t bytes) const;
  template <class T>
  std::vector<T> read(const Tensor& t) const {
    std::vector<T> out(static_cast<size_t>(t.numel()));
    read_checked(t, dtype_of<T>(), out.data(), out.size() * sizeof(T));
    return out;
  }
  // Address of a readable tensor's first element, for contiguous tensors
  // (e.g. gradients made contiguous for an optimizer); valid across runs.
  // UsageError for a strided tensor or one whose memory the plan reuses.
  const void* data(const Tensor& t) const;
  // A new leaf holding a contiguous copy of t's value.
  Tensor fetch(const Tensor& t) const;

  // Calls `done` in every run, on the running thread, as soon as t's value
  // is complete (after the node that writes its memory), while the rest of
  // the graph runs on: a training step hands each gradient to communication
  // this way. False, registering nothing, when no node of the graph writes
  // t (a leaf, or a constant): its value is there before any run.
  // UsageError for a tensor outside the graph.
  bool on_computed(const Tensor& t, std::function<void()> done);
  // In every run, a host copy of t's values (t contiguous), begun as soon as
  // the node that writes t has run, without waiting for it there: on a
  // backend with memory of its own the copy is queued behind that node,
  // into page-locked host memory, and overlaps the kernels after it (a
  // training step on a GPU hands each gradient to communication this way).
  // `queued` is called on the running thread once the copy is under way;
  // host_copied(id) waits for the run's copy to land and returns it (valid
  // until the next run). -1, registering nothing, when no node writes t.
  int host_copy(const Tensor& t, std::function<void()> queued);
  const void* host_copied(int id) const;

 private:
  void read_checked(const Tensor& t, DType dtype, void* dst, size_t bytes) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Builds, plans and runs a graph for `outputs`; returns their values as leaves.
std::vector<Tensor> eval(const std::vector<Tensor>& outputs, ExecOptions options = {});
Tensor eval(const Tensor& output, ExecOptions options = {});

}  // namespace nabla
