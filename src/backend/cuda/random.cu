// dropout on the GPU: the CPU kernel's mask from its definition
// (src/ops/dropout.cpp): element i (row-major) is kept when the top 32 bits
// of mix64(key + i) reach p * 2^32, so every backend drops the same elements.
#include "backend/cuda/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_dropout;
}  // namespace ops

namespace NABLA_GPU {
namespace {

// SplitMix64's finalizer.
__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The seed is read on the device (it changes from step to step in place).
template <class T>
__global__ void dropout_kernel(int64_t n, View x, View seed, uint64_t salt, uint64_t threshold, T scale, T* out) {
  const auto s = static_cast<uint32_t>(*static_cast<const int32_t*>(seed.data));
  const uint64_t key = mix64((uint64_t{s} | (salt << 32)) + 0x9e3779b97f4a7c15ull);
  NABLA_GRID_STRIDE(i, n) {
    const bool keep = (mix64(key + static_cast<uint64_t>(i)) >> 32) >= threshold;
    out[i] = keep ? static_cast<const T*>(x.data)[offset_of(x, i)] * scale : T(0);
  }
}

// dropout(x, seed i32 [one element]); attrs.ints = {salt}, reals = {p}.
void dropout(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  const double p = a.attrs->reals[0];
  const uint64_t salt = a.attrs->ints.empty() ? 0 : static_cast<uint64_t>(a.attrs->ints[0]);
  const auto threshold = static_cast<uint64_t>(p * 4294967296.0);
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    const T scale = p < 1 ? T(1.0 / (1.0 - p)) : T(0);
    launch(ctx, elementwise_launch(n), dropout_kernel<T>, n, flat_view(a.in[0]), make_view(a.in[1]), salt, threshold,
           scale, a.out.ptr<T>());
  });
}

}  // namespace

void register_random_kernels() { register_kernel(ops::op_dropout, dropout); }

}  // namespace NABLA_GPU
}  // namespace nabla
