// A backend: where a graph's memory lives and what runs its ops. The
// executor (src/core/executor.cpp) is the same for all: it asks the backend
// to rewrite the graph, replaces each op the backend has no kernel for by
// the op's composite, plans one arena in the backend's memory and hands the
// backend the kernel calls in order. Op semantics (shape rules, backward
// rules, composites) live in src/ops and are the same on every backend.
//
// A new backend adds src/backend/<name>/: a Backend (memory, copies,
// compile), its kernels, and one line in src/backend/backend.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/graph_internal.h"
#include "core/op.h"
#include "nabla/error.h"

namespace nabla {

struct ExecOptions;

// One op application: which op, its operands in the backend's memory.
struct KernelCall {
  const OpDef* op = nullptr;
  Operands operands;
};

// A point in a backend's queued work a host thread can wait for.
class Fence {
 public:
  virtual ~Fence() = default;
  // Returns once the work queued before the fence is done (at once where
  // the backend works as it is asked).
  virtual void wait() {}
};

// A compiled graph's kernels, in order.
class Program {
 public:
  virtual ~Program() = default;
  // Runs call `i`. The executor runs them in order, each once per run.
  virtual void run(size_t i) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Empty when the backend can run here; else why not ("no CUDA device").
  virtual std::string unavailable() const { return ""; }

  // ---- Capabilities.
  virtual bool supports(DType dtype) const = 0;
  // Whether ExecOptions::bf16_matmul changes anything here.
  virtual bool has_bf16_matmul() const = 0;

  // ---- Memory. A host-memory backend computes in ordinary host memory: its
  // tensors are host leaves and its arena a host buffer. Any other backend's
  // memory is its own, reached only through these copies.
  virtual bool host_memory() const = 0;
  virtual void* allocate(size_t bytes) const = 0;
  virtual void release(void* data, size_t bytes) const = 0;
  virtual void copy_in(void* dst, const void* host_src, size_t bytes) const = 0;
  virtual void copy_out(void* host_dst, const void* src, size_t bytes) const = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) const = 0;
  // Waits for work queued so far (kernels, copies) to finish.
  virtual void synchronize() const {}
  // Copies that overlap the work queued after them: host memory they land
  // in without stalling the queue (page-locked on a GPU), and a copy to it
  // queued behind the work so far, landed once its fence is reached.
  virtual void* allocate_host(size_t bytes) const;
  virtual void release_host(void* host) const;
  virtual std::unique_ptr<Fence> copy_out_queued(void* host_dst, const void* src, size_t bytes) const;
  // The most of its own memory it has held at once (0: host memory).
  virtual size_t peak_bytes() const { return 0; }

  // ---- Compiling a graph.
  // The backend's own rewrite of the graph (fusions); `replaced` receives
  // each changed node's replacement.
  virtual std::vector<Tensor> rewrite(const std::vector<Tensor>& outputs, GradMap* replaced) const {
    (void)replaced;
    return outputs;
  }
  virtual bool has_kernel(const OpDef& op) const = 0;
  // The calls, in order, ready to run; their operands point into memory the
  // executor keeps alive as long as the program.
  virtual std::unique_ptr<Program> compile(std::vector<KernelCall> calls, const ExecOptions& options) const = 0;
};

// A backend's kernels by op; a second kernel for one op is a bug (throws).
template <class Kernel>
class KernelTable {
 public:
  explicit KernelTable(const char* backend) : backend_(backend) {}
  void add(const OpDef& op, Kernel kernel) {
    if (!kernels_.emplace(&op, kernel).second) {
      throw Error(std::string("internal: a second ") + backend_ + " kernel for '" + op.name + "'");
    }
  }
  Kernel find(const OpDef& op) const {
    auto it = kernels_.find(&op);
    return it == kernels_.end() ? nullptr : it->second;
  }

 private:
  const char* backend_;
  std::unordered_map<const OpDef*, Kernel> kernels_;
};

// The backend named `name` ("cpu", "reference", "cuda-emulated", "cuda");
// UsageError naming the known ones otherwise, or (with `usable`) saying why
// the one named cannot run here. Without `usable`: what it has, to describe.
const Backend& find_backend(const std::string& name, bool usable = true);
const Backend& cpu_backend();

}  // namespace nabla
