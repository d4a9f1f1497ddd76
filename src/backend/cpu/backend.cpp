// The CPU backend: host memory, the kernels beside each op (NABLA_CPU_KERNEL),
// the thread pool, and the fusions of src/backend/cpu/fusion.h.
#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/fusion.h"
#include "backend/cpu/kernel.h"
#include "core/node.h"
#include "nabla/error.h"
#include "nabla/executor.h"

namespace nabla {
namespace cpu {

namespace {
// Filled while static objects are constructed (NABLA_CPU_KERNEL): built on first use.
KernelTable<Kernel>& kernels() {
  static KernelTable<Kernel> table("CPU");
  return table;
}
}  // namespace

bool register_kernel(const OpDef& op, Kernel kernel) {
  kernels().add(op, kernel);
  return true;
}

Kernel kernel_of(const OpDef& op) { return kernels().find(op); }

namespace {

class CpuProgram : public Program {
 public:
  CpuProgram(std::vector<KernelCall> calls, const ExecOptions& options) {
    for (KernelCall& c : calls) {
      Step s{kernel_of(*c.op), {}};
      static_cast<Operands&>(s.args) = std::move(c.operands);
      s.args.threads = options.threads;
      s.args.max_grain = options.max_grain;
      s.args.bf16_matmul = options.bf16_matmul;
      steps_.push_back(std::move(s));
    }
  }
  void run(size_t i) override { steps_[i].kernel(steps_[i].args); }

 private:
  struct Step {
    Kernel kernel;
    KernelArgs args;
  };
  std::vector<Step> steps_;
};

class CpuBackend : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  bool supports(DType) const override { return true; }
  bool has_bf16_matmul() const override { return true; }
  bool host_memory() const override { return true; }
  // Host memory from Buffer, whose large allocations get huge pages.
  void* allocate(size_t) const override { throw Error("internal: the CPU backend's memory is Buffer's"); }
  void release(void*, size_t) const override {}
  void copy_in(void* dst, const void* src, size_t bytes) const override { std::memcpy(dst, src, bytes); }
  void copy_out(void* dst, const void* src, size_t bytes) const override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) const override { std::memcpy(dst, src, bytes); }
  std::vector<Tensor> rewrite(const std::vector<Tensor>& outputs, GradMap* replaced) const override {
    return fuse(outputs, replaced);
  }
  bool has_kernel(const OpDef& op) const override { return kernel_of(op) != nullptr; }
  std::unique_ptr<Program> compile(std::vector<KernelCall> calls, const ExecOptions& options) const override {
    return std::make_unique<CpuProgram>(std::move(calls), options);
  }
};

}  // namespace
}  // namespace cpu

const Backend& cpu_backend() {
  static const cpu::CpuBackend backend;
  return backend;
}

}  // namespace nabla
