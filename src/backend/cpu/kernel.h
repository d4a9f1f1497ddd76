// CPU kernels: what one is given (host memory, the thread pool, the
// executor's options) and how an op's file registers its kernel:
//
//   extern const OpDef op_exp{...};
//   NABLA_CPU_KERNEL(op_exp, unary_forward<Fn>);
//
// An op with no CPU kernel runs its composite on the CPU, or a graph holding
// it fails to compile, naming the op (src/core/executor.cpp).
#pragma once

#include <vector>

#include <cstdint>

#include "backend/cpu/thread_pool.h"
#include "core/op.h"

namespace nabla {

struct KernelArgs : Operands {
  int threads = 1;
  int64_t max_grain = 0;     // ExecOptions::max_grain
  bool bf16_matmul = false;  // ExecOptions::bf16_matmul
  // Runs fn over [0, n) in chunks of `grain`. The grain must not depend on the
  // thread count, so results do not either.
  void parallel_for(int64_t n, int64_t grain, cpu::RangeFn fn) const {
    cpu::parallel_for(threads, n, max_grain > 0 && grain > max_grain ? max_grain : grain, fn);
  }
};

namespace cpu {

using Kernel = void (*)(const KernelArgs&);
// Records op's CPU kernel; returns true (for NABLA_CPU_KERNEL's static).
// A second kernel for one op is a bug: it throws.
bool register_kernel(const OpDef& op, Kernel kernel);
// op's CPU kernel, or null.
Kernel kernel_of(const OpDef& op);

}  // namespace cpu

namespace ops {
// Kernel helper: x (any strides) copied into row-major memory at out, over
// a's threads. The contiguous op's kernel; ops that start from a copy of an
// input they could not take over in place use it too.
void copy_to_contiguous(const KernelArgs& a, const TensorView& x, void* out);
// x's f32 elements in row-major order: in place where x is contiguous, else
// gathered into `scratch` (an update op's gradient, which may be strided).
const float* contiguous_f32(const KernelArgs& a, const TensorView& x, std::vector<float>& scratch);
// The same into memory laid out by out_strides (e.g. concat's band of its output).
void copy_into(const KernelArgs& a, const TensorView& x, void* out, const Strides& out_strides);
}  // namespace ops

}  // namespace nabla

// In the op's file, after its OpDef (the file is linked whenever the op is).
#define NABLA_CPU_KERNEL(op, ...) \
  [[maybe_unused]] static const bool nabla_cpu_kernel_##op = ::nabla::cpu::register_kernel(op, __VA_ARGS__)
