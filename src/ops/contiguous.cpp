// contiguous: a row-major copy of a strided view; no node when x already is.
// Its backward is the identity on whatever layout the gradient has: unlike
// ggml's CONT, nothing here asks for a contiguous gradient.
#include <cstdint>
#include <cstring>
#include <string>

#include "backend/cpu/kernel.h"
#include "backend/cpu/strided.h"
#include "core/op.h"

namespace nabla {
namespace ops {
namespace {

// Copies with E, an unsigned integer of the element's size: a strided run is
// then a plain loop instead of one memcpy call per element. `os` lays out the
// destination (row-major, or a band of a larger row-major tensor).
template <class E>
void copy_kernel(const KernelArgs& a, const TensorView& x, void* out, const Strides& os) {
  const E* src = static_cast<const E*>(x.data);
  E* dst = static_cast<E*>(out);
  cpu::Walker<2> w(x.shape, {&os, &x.strides});
  a.parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
      E* d = dst + o[0];
      const E* p = src + o[1];
      if (s[0] == 1 && s[1] == 1) {
        std::memcpy(d, p, n * sizeof(E));
      } else if (s[0] == 1) {  // the usual case, kept apart so it vectorizes
        for (int64_t i = 0; i < n; ++i) d[i] = p[i * s[1]];
      } else {
        for (int64_t i = 0; i < n; ++i) d[i * s[0]] = p[i * s[1]];
      }
    });
  });
}

void contiguous_forward(const KernelArgs& a) { copy_to_contiguous(a, a.in[0], a.out.data); }

Grads contiguous_backward(const BackwardArgs& g) { return {g.dout}; }

std::vector<GradCase> contiguous_cases() {
  return {
      {"transposed", {normal({3, 4})},
       [](const std::vector<Tensor>& x) { return contiguous(transpose(x[0])); }},
      // The seed's failure: CONT after a permute, then again, gradient non-contiguous.
      {"chain", {normal({2, 3, 4})},
       [](const std::vector<Tensor>& x) { return contiguous(transpose(contiguous(transpose(x[0], 0, 2)))); }},
  };
}

}  // namespace

const float* contiguous_f32(const KernelArgs& a, const TensorView& x, std::vector<float>& scratch) {
  if (x.contiguous) return x.ptr<float>();
  scratch.resize(size_t(x.numel()));
  copy_to_contiguous(a, x, scratch.data());
  return scratch.data();
}

void copy_to_contiguous(const KernelArgs& a, const TensorView& x, void* out) {
  copy_into(a, x, out, contiguous_strides(x.shape));
}

void copy_into(const KernelArgs& a, const TensorView& x, void* out, const Strides& out_strides) {
  switch (dtype_size(x.dtype)) {
    case 1:
      return copy_kernel<uint8_t>(a, x, out, out_strides);
    case 2:
      return copy_kernel<uint16_t>(a, x, out, out_strides);
    case 4:
      return copy_kernel<uint32_t>(a, x, out, out_strides);
    case 8:
      return copy_kernel<uint64_t>(a, x, out, out_strides);
    default:
      throw DTypeError(std::string("contiguous: no copy for ") + dtype_name(x.dtype));
  }
}

extern const OpDef op_contiguous{
    .name = "contiguous",
    .summary = "row-major copy of a strided view (no-op when already contiguous)",
    .inputs = {{"x", Diff::yes}},
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return Meta{in[0].dtype(), in[0].shape()}; },
    .backward = contiguous_backward,
    .cases = contiguous_cases,
};
NABLA_CPU_KERNEL(op_contiguous, contiguous_forward);

}  // namespace ops

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return apply(ops::op_contiguous, {x});
}

}  // namespace nabla
