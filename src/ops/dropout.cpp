// dropout: zeroes each element with probability p and scales the rest by
// 1 / (1 - p). Whether element i is kept is a hash of (seed, i), i its
// row-major position: the mask depends on neither layout nor threads, and
// needs no buffer, since the backward recomputes it. The seed is an i32
// scalar tensor, so a static training graph draws a new mask each step by
// rewriting that leaf; a salt separates the masks of call sites sharing a
// seed. attrs: ints {salt}, reals {p}.
#include "backend/cpu/kernel.h"
#include "ops/elementwise.h"

namespace nabla {
namespace ops {

extern const OpDef op_dropout;

namespace {

// SplitMix64's finalizer: a bijection of 64-bit words whose outputs pass
// BigCrush for consecutive inputs.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Meta dropout_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &x = in[0], &seed = in[1];
  require_floating("dropout", x, "x");
  if (seed.dtype() != DType::i32) {
    throw DTypeError(std::string("dropout: seed must be i32, got ") + dtype_name(seed.dtype()));
  }
  if (seed.numel() != 1)
    throw ShapeError("dropout: seed must have one element, got " + to_string(seed.shape()));
  return {x.dtype(), x.shape()};
}

template <class T>
void dropout_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  double p = a.attrs->reals[0];
  // Keep element i when the top 32 bits of its hash reach p * 2^32; an
  // integer test, so f32 and f64 runs drop the same elements.
  uint64_t threshold = static_cast<uint64_t>(p * 4294967296.0);
  T keep_scale = p < 1 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
  uint64_t salt = a.attrs->ints.empty() ? 0 : static_cast<uint64_t>(a.attrs->ints[0]);
  uint64_t key = mix64((static_cast<uint64_t>(static_cast<uint32_t>(a.in[1].ptr<int32_t>()[0])) | (salt << 32)) +
                       0x9e3779b97f4a7c15ull);
  T* out = a.out.ptr<T>();
  const T* xp = x.ptr<T>();
  Strides os = contiguous_strides(a.out.shape);
  cpu::Walker<2> w(a.out.shape, {&os, &x.strides});
  a.parallel_for(a.out.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
      for (int64_t i = 0; i < n; ++i) {
        uint64_t h = mix64(key + static_cast<uint64_t>(o[0] + i)) >> 32;
        out[o[0] + i] = h >= threshold ? xp[o[1] + i * s[1]] * keep_scale : T(0);
      }
    });
  });
}

void dropout_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "dropout", [&]<class T>() { dropout_kernel<T>(a); });
}

// A fixed linear map, diagonal: dx = the same mask and scale applied to dout.
Grads dropout_backward(const BackwardArgs& g) {
  return {apply(op_dropout, {g.dout, g.inputs[1]}, g.attrs), Tensor()};
}

std::vector<GradCase> dropout_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"matrix",
       {normal({4, 5}), integers({}, 0, 1000)},
       [](X x) { return dropout(x[0], 0.3, x[1]); }},
      {"rank3",
       {normal({2, 3, 4}), integers({1}, -50, 50)},
       [](X x) { return dropout(x[0], 0.3, x[1]); }},
      {"half",
       {normal({3, 6}), integers({}, 0, 1000)},
       [](X x) { return dropout(x[0], 0.5, x[1]); }},
  };
}

}  // namespace

extern const OpDef op_dropout{
    .name = "dropout",
    .summary = "zeroes elements with probability p (seeded hash), scales the rest by 1/(1-p)",
    .inputs = {{"x", Diff::yes}, {"seed", Diff::no}},
    .elementwise = true,
    .infer = dropout_infer,
    .backward = dropout_backward,
    .cases = dropout_cases,
};
NABLA_CPU_KERNEL(op_dropout, dropout_forward);

}  // namespace ops

Tensor dropout(const Tensor& x, double p, const Tensor& seed, bool train, int64_t salt) {
  if (!(p >= 0 && p <= 1))
    throw UsageError("dropout: p must be in [0, 1], got " + std::to_string(p));
  if (!train || p == 0) return x;
  return apply(ops::op_dropout, {x, seed}, Attrs{{salt}, {p}});
}

}  // namespace nabla
