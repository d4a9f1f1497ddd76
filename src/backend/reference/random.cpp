// Reference kernel of dropout: the CPU kernel's mask, recomputed from its
// definition (src/ops/dropout.cpp): element i (row-major position) is kept
// when the top 32 bits of mix64(key + i) reach p * 2^32.
#include <cstdint>

#include "backend/reference/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_dropout;
}  // namespace ops

namespace reference {
namespace {

// SplitMix64's finalizer.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// dropout(x, seed i32 [one element]); attrs.ints = {salt}, reals = {p}.
// key = mix64((seed as u32 | salt << 32) + golden ratio); kept elements are
// scaled by 1 / (1 - p), the others (all of them at p = 1) are 0.
void dropout_kernel(const Operands& a) {
  const TensorView &x = a.in[0], &seed = a.in[1];
  const double p = a.attrs->reals[0];
  const uint64_t salt = a.attrs->ints.empty() ? 0 : static_cast<uint64_t>(a.attrs->ints[0]);
  const auto s = static_cast<uint32_t>(static_cast<int32_t>(get(seed, Index(seed.shape.size(), 0))));
  const uint64_t key = mix64((uint64_t{s} | (salt << 32)) + 0x9e3779b97f4a7c15ull);
  const auto threshold = static_cast<uint64_t>(p * 4294967296.0);
  // The scale rounded to the dtype, as the CPU multiplies by it in the dtype;
  // then the double product (exact for f32) rounds once to the same result.
  double scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
  if (a.out.dtype == DType::f32) scale = static_cast<float>(scale);
  int64_t i = 0;
  for_each_index(a.out.shape, [&](const Index& o) {
    const bool keep = (mix64(key + static_cast<uint64_t>(i)) >> 32) >= threshold;
    set_at(a.out, i++, keep ? get(x, o) * scale : 0.0);
  });
}

}  // namespace

void register_random_kernels() { register_kernel(ops::op_dropout, dropout_kernel); }

}  // namespace reference
}  // namespace nabla
