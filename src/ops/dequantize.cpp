// dequantize: a weight matrix stored as ggml stores it, w u8 [N, row bytes]
// (N rows of K elements in GgmlType `type`: F16, BF16, Q8_0, Q4_0, Q4_K or
// Q6_K, each row a whole number of blocks), as f32 or f64 [N, K]. The bytes
// are data, not a differentiable input. attrs: ints {type, K, dtype}.
#include <cmath>
#include <string>

#include "backend/cpu/kernel.h"
#include "core/op.h"
#include "io/ggml_quants.h"
#include "nabla/gguf.h"
#include "ops/quantized.h"

namespace nabla {
namespace ops {

int64_t quantized_row_bytes(const char* op, int64_t type, int64_t K) {
  const io::GgmlBlock block = io::ggml_block(static_cast<GgmlType>(type));
  const auto t = static_cast<GgmlType>(type);
  if (block.elements == 0 || t == GgmlType::f32 || t == GgmlType::f64 || t == GgmlType::i32) {
    throw DTypeError(std::string(op) + ": storage type " + std::to_string(type) +
                     " is not one of F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K");
  }
  if (K <= 0 || K % block.elements != 0) {
    throw ShapeError(std::string(op) + ": rows of " + std::to_string(K) + " elements are not a whole number of " +
                     ggml_type_name(t) + " blocks of " + std::to_string(block.elements));
  }
  return K / block.elements * int64_t(block.bytes);
}

void check_quantized_weight(const char* op, const Tensor& w, int64_t type, int64_t K) {
  if (w.dtype() != DType::u8) throw DTypeError(std::string(op) + ": w must be u8 storage, got " + dtype_name(w.dtype()));
  const int64_t bytes = quantized_row_bytes(op, type, K);
  if (w.rank() != 2 || w.dim(1) != bytes) {
    throw ShapeError(std::string(op) + ": w must be [N, " + std::to_string(bytes) + "] (rows of " +
                     std::to_string(K) + " " + ggml_type_name(static_cast<GgmlType>(type)) + " elements), got " +
                     to_string(w.shape()));
  }
}

void dequantize_rows(const TensorView& w, int64_t type, int64_t K, int64_t row, int64_t rows, int64_t k0, int64_t k1,
                     float* dst, int64_t ld, std::vector<uint8_t>& gather) {
  const auto t = static_cast<GgmlType>(type);
  const io::GgmlBlock block = io::ggml_block(t);
  const int64_t bytes = K / block.elements * int64_t(block.bytes);
  const int64_t b0 = k0 / block.elements * int64_t(block.bytes), n = k1 - k0;
  for (int64_t r = row; r < row + rows; ++r) {
    const uint8_t* src = w.ptr<uint8_t>() + r * w.strides[0];
    if (w.strides[1] != 1) {  // a strided view of the bytes: gathered first
      gather.resize(size_t(bytes));
      for (int64_t i = 0; i < bytes; ++i) gather[size_t(i)] = src[i * w.strides[1]];
      src = gather.data();
    }
    io::dequantize(t, src + b0, n, dst + (r - row) * ld);
  }
}

Tensor quantized_fixture(GgmlType type, int64_t N, int64_t K) {
  std::vector<float> v(size_t(N * K));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(std::sin(0.7 * double(i) + 0.3) * (1 + double(i % 5)) / 3);
  const std::string bytes = io::quantize(type, v.data(), N * K);
  return Tensor::from_data(DType::u8, {N, quantized_row_bytes("quantized_fixture", int64_t(type), K)}, bytes.data());
}

namespace {

DType dtype_attr(const Attrs& a) { return static_cast<DType>(a.ints[2]); }

Meta dequantize_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  check_quantized_weight("dequantize", in[0], attrs.ints[0], attrs.ints[1]);
  if (!is_floating(dtype_attr(attrs))) throw DTypeError("dequantize: the output dtype must be f32 or f64");
  return {dtype_attr(attrs), {in[0].dim(0), attrs.ints[1]}};
}

template <class T>
void dequantize_kernel(const KernelArgs& a) {
  const int64_t type = a.attrs->ints[0], K = a.attrs->ints[1], N = a.out.shape[0];
  T* out = a.out.ptr<T>();
  a.parallel_for(N, std::max<int64_t>(1, 16384 / K), [&](int64_t b, int64_t e) {
    std::vector<uint8_t> gather;
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = b; r < e; ++r) {
      float* dst = std::is_same_v<T, float> ? reinterpret_cast<float*>(out + r * K) : row.data();
      dequantize_rows(a.in[0], type, K, r, 1, 0, K, dst, K, gather);
      if constexpr (!std::is_same_v<T, float>) std::copy(row.begin(), row.end(), out + r * K);
    }
  });
}

void dequantize_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "dequantize", [&]<class T>() { dequantize_kernel<T>(a); });
}

// The storage's values, times x so that the case has a floating input.
std::vector<GradCase> dequantize_cases() {
  using V = std::vector<Tensor>;
  return {
      {"q8_0", {normal({3, 64})},
       [](const V& x) { return dequantize(quantized_fixture(GgmlType::q8_0, 3, 64), GgmlType::q8_0, 64, x[0].dtype()) * x[0]; }},
      {"q4_k", {normal({2, 256})},
       [](const V& x) { return dequantize(quantized_fixture(GgmlType::q4_k, 2, 256), GgmlType::q4_k, 256, x[0].dtype()) * x[0]; }},
  };
}

}  // namespace

extern const OpDef op_dequantize{
    .name = "dequantize",
    .summary = "u8 [N, row bytes] in a ggml storage type (F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K) as f32/f64 [N, K]; "
               "not differentiated",
    .inputs = {{"w", Diff::no}},
    .infer = dequantize_infer,
    .cases = dequantize_cases,
};
NABLA_CPU_KERNEL(op_dequantize, dequantize_forward);

}  // namespace ops

Tensor dequantize(const Tensor& w, GgmlType type, int64_t K, DType dtype) {
  if (!w.defined()) throw UsageError("dequantize: w is an undefined tensor");
  return apply(ops::op_dequantize, {w}, Attrs{{int64_t(type), K, int64_t(dtype)}, {}});
}

}  // namespace nabla
