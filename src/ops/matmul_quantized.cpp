// matmul_quantized: x times a weight matrix kept in a ggml storage type (u8
// [N, row bytes], rows of K elements; see dequantize): y = x W^T, x [..., K]
// -> [..., N] (a linear layer's forward), or with `transposed` y = x W,
// x [..., N] -> [..., K] (its input gradient). The weight is dequantized a
// panel at a time into a per-thread scratch in cache, never whole, so a
// frozen base weighs what its file does (QLoRA). Differentiated in x alone.
// attrs: ints {type, K, transposed}.
#include <algorithm>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/strided.h"
#include "core/op.h"
#include "io/ggml_quants.h"
#include "ops/quantized.h"

namespace nabla {
namespace ops {

extern const OpDef op_matmul_quantized;

namespace {

bool transposed_of(const Attrs& a) { return a.ints[2] != 0; }

Meta matmul_quantized_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &w = in[1];
  const int64_t type = attrs.ints[0], K = attrs.ints[1];
  require_floating("matmul_quantized", x, "x");
  check_quantized_weight("matmul_quantized", w, type, K);
  const int64_t N = w.dim(0), inner = transposed_of(attrs) ? N : K, outer = transposed_of(attrs) ? K : N;
  if (x.rank() < 1 || x.dim(-1) != inner) {
    throw ShapeError("matmul_quantized: x must be [..., " + std::to_string(inner) + "] for a weight of " +
                     std::to_string(N) + " x " + std::to_string(K) + (transposed_of(attrs) ? " (transposed)" : "") +
                     ", got " + to_string(x.shape()));
  }
  Shape shape = x.shape();
  shape.back() = outer;
  return {x.dtype(), shape};
}

// Weight rows (or, transposed, columns) a task dequantizes and multiplies:
// 64, or a whole block where blocks are wider.
int64_t panel(int64_t type, bool transposed) {
  const int64_t block = io::ggml_block(static_cast<GgmlType>(type)).elements;
  return transposed ? std::max<int64_t>(64, block) : 64;
}

template <class T>
struct Scratch {
  std::vector<float> w;
  std::vector<T> wt;  // the panel in T (f64 products)
  std::vector<uint8_t> gather;
  std::vector<T> x;   // x's rows made contiguous
};
template <class T>
Scratch<T>& scratch() {
  thread_local Scratch<T> s;
  return s;
}

template <class T>
void matmul_quantized_kernel(const KernelArgs& a) {
  const TensorView &x = a.in[0], &w = a.in[1];
  const int64_t type = a.attrs->ints[0], K = a.attrs->ints[1], N = w.shape[0];
  const bool transposed = transposed_of(*a.attrs);
  const int64_t inner = transposed ? N : K, outer = transposed ? K : N, M = x.numel() / std::max<int64_t>(inner, 1);
  T* out = a.out.ptr<T>();
  // x as contiguous rows [M, inner].
  const T* X = x.ptr<T>();
  std::vector<T> copy;
  if (!x.contiguous) {
    copy.resize(size_t(M * inner));
    Strides cs = contiguous_strides(x.shape);
    cpu::Walker<2> walk(x.shape, {&cs, &x.strides});
    walk.run(0, M * inner, [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
      for (int64_t i = 0; i < n; ++i) copy[size_t(o[0] + i)] = x.ptr<T>()[o[1] + i * s[1]];
    });
    X = copy.data();
  }
  const int64_t width = panel(type, transposed), panels = (outer + width - 1) / width;
  a.parallel_for(panels, 1, [&](int64_t p0, int64_t p1) {
    Scratch<T>& s = scratch<T>();
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t c0 = p * width, c1 = std::min(outer, c0 + width), n = c1 - c0;
      if (!transposed) {
        // W rows [c0, c1): the panel [n, K]; out[:, c0:c1] = X panel^T.
        s.w.resize(size_t(n * K));
        dequantize_rows(w, type, K, c0, n, 0, K, s.w.data(), K, s.gather);
      } else {
        // W columns [c0, c1) of every row: the panel [N, n]; out[:, c0:c1] = X panel.
        s.w.resize(size_t(N * n));
        dequantize_rows(w, type, K, 0, N, c0, c1, s.w.data(), n, s.gather);
      }
      const T* W = nullptr;
      if constexpr (std::is_same_v<T, float>) {
        W = s.w.data();
      } else {
        s.wt.assign(s.w.begin(), s.w.end());
        W = s.wt.data();
      }
      if (!transposed) {
        cpu::product<T>(a.bf16_matmul, false, true, M, n, K, X, K, W, K, out + c0, outer);
      } else {
        cpu::product<T>(a.bf16_matmul, false, false, M, n, N, X, N, W, n, out + c0, outer);
      }
    }
  });
}

void matmul_quantized_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "matmul_quantized", [&]<class T>() { matmul_quantized_kernel<T>(a); });
}

Tensor matmul_quantized_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor weight = dequantize(in[1], static_cast<GgmlType>(attrs.ints[0]), attrs.ints[1], in[0].dtype());
  return matmul(in[0], transposed_of(attrs) ? weight : transpose(weight));
}

// d(x W^T) / dx = dout W; d(x W) / dx = dout W^T: the same op the other way.
Grads matmul_quantized_backward(const BackwardArgs& g) {
  return {matmul_quantized(g.dout, g.inputs[1], static_cast<GgmlType>(g.attrs.ints[0]), g.attrs.ints[1],
                           !transposed_of(g.attrs)),
          Tensor()};
}

std::vector<GradCase> matmul_quantized_cases() {
  using V = std::vector<Tensor>;
  auto with = [](GgmlType type, int64_t N, int64_t K, bool transposed) {
    return [=](const V& x) { return matmul_quantized(x[0], quantized_fixture(type, N, K), type, K, transposed); };
  };
  return {
      {"q8_0", {normal({2, 3, 64})}, with(GgmlType::q8_0, 5, 64, false)},
      {"q8_0_transposed", {normal({3, 5})}, with(GgmlType::q8_0, 5, 64, true)},
      {"q4_0_many_panels", {normal({4, 32})}, with(GgmlType::q4_0, 130, 32, false)},
      {"q4_k", {normal({2, 256})}, with(GgmlType::q4_k, 3, 256, false)},
      {"q4_k_transposed", {normal({2, 3})}, with(GgmlType::q4_k, 3, 512, true)},
      {"q6_k", {normal({2, 256})}, with(GgmlType::q6_k, 2, 256, false)},
      {"bf16_transposed", {normal({3, 4})}, with(GgmlType::bf16, 4, 136, true)},
      {"f16", {normal({1, 2, 8})}, with(GgmlType::f16, 70, 8, false)},
  };
}

}  // namespace

extern const OpDef op_matmul_quantized{
    .name = "matmul_quantized",
    .summary = "x W^T (or x W) for a weight in a ggml storage type (u8 rows), dequantized a panel at a time; "
               "differentiated in x",
    .inputs = {{"x", Diff::yes}, {"w", Diff::no}},
    .fused = true,
    .infer = matmul_quantized_infer,
    .backward = matmul_quantized_backward,
    .composite = matmul_quantized_composite,
    .cases = matmul_quantized_cases,
};
NABLA_CPU_KERNEL(op_matmul_quantized, matmul_quantized_forward);

}  // namespace ops

Tensor matmul_quantized(const Tensor& x, const Tensor& w, GgmlType type, int64_t K, bool transposed) {
  if (!x.defined() || !w.defined()) throw UsageError("matmul_quantized: an input is an undefined tensor");
  return apply(ops::op_matmul_quantized, {x, w}, Attrs{{int64_t(type), K, transposed ? 1 : 0}, {}});
}

}  // namespace nabla
