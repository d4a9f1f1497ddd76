// contiguous: a row-major copy of a strided view; no node when x already is.
// Its backward is the identity on whatever layout the gradient has: unlike
// ggml's CONT, nothing here asks for a contiguous gradient.
#include "backend/cpu/strided.h"
#include "core/op.h"

namespace nabla {
namespace ops {
namespace {

void contiguous_forward(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  size_t elem = dtype_size(x.dtype);
  Strides os = contiguous_strides(x.shape);
  cpu::Walker<2> w(x.shape, {&os, &x.strides});
  auto* src = static_cast<const char*>(x.data);
  auto* dst = static_cast<char*>(a.out.data);
  a.parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
      if (s[1] == 1) {
        std::memcpy(dst + o[0] * elem, src + o[1] * elem, n * elem);
      } else {
        for (int64_t i = 0; i < n; ++i) std::memcpy(dst + (o[0] + i) * elem, src + (o[1] + i * s[1]) * elem, elem);
      }
    });
  });
}

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

extern const OpDef op_contiguous{
    .name = "contiguous",
    .summary = "row-major copy of a strided view (no-op when already contiguous)",
    .inputs = {{"x", Diff::yes}},
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return Meta{in[0].dtype(), in[0].shape()}; },
    .forward = contiguous_forward,
    .backward = contiguous_backward,
    .cases = contiguous_cases,
};

}  // namespace ops

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return apply(ops::op_contiguous, {x});
}

}  // namespace nabla
