// Reference kernels: one per primitive op, single-threaded, written to be
// obviously right rather than fast: strided loops over multi-indices, sums
// in double. Fused ops have none: the executor runs their composites here,
// which define them. A kernel file registers its kernels in a function that
// src/backend/reference/backend.cpp calls.
#pragma once

#include <cstdint>
#include <vector>

#include "core/op.h"

namespace nabla::reference {

using Kernel = void (*)(const Operands&);
void register_kernel(const OpDef& op, Kernel kernel);
Kernel kernel_of(const OpDef& op);

// The kernel files' registrations (src/backend/reference/*.cpp).
void register_elementwise_kernels();
void register_reduction_kernels();
void register_layout_kernels();
void register_indexing_kernels();
void register_matmul_kernels();
void register_image_kernels();
void register_random_kernels();
void register_optimizer_kernels();

// ---- Helpers over views (any strides, including 0).
using Index = std::vector<int64_t>;
// Calls fn(index) for every multi-index of `shape`, in row-major order.
template <class F>
void for_each_index(const Shape& shape, F&& fn) {
  const int64_t n = numel(shape);
  Index idx(shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    fn(static_cast<const Index&>(idx));
    for (size_t a = shape.size(); a-- > 0;) {
      if (++idx[a] < shape[a]) break;
      idx[a] = 0;
    }
  }
}
// Element offset of `idx` in v (idx has v's rank).
int64_t offset_of(const TensorView& v, const Index& idx);
// v's element at idx, or at flat element offset `at`, as double (f32, f64, i32).
double get(const TensorView& v, const Index& idx);
double get_at(const TensorView& v, int64_t at);
// Stores x (rounded to v's dtype) at idx / at flat element offset `at`.
void set(const TensorView& v, const Index& idx, double x);
void set_at(const TensorView& v, int64_t at, double x);
// A factored gradient's dW [R, C], row-major, in double, from the operands
// a.in[first...] and attrs.ints of factored_squared_norm and
// adamw_update_factored (src/ops/factored.h): each block's left^T right
// (both rounded to bf16 first where the bf16 attr is set, as the CPU's
// products round them), then the values added at the indices.
std::vector<double> factored_gradient(const Operands& a, size_t first);

// idx of an output of rank r read from an input of v's rank, broadcast
// NumPy-style (v's axes aligned to the right; its size-1 axes read at 0).
Index broadcast_index(const TensorView& v, const Index& out_idx);

}  // namespace nabla::reference
