// Reference kernel of matmul: [..., M, K] x [..., K, N] -> [..., M, N], each
// output element a dot product summed in double, k ascending.
#include "backend/reference/kernel.h"
#include "io/ggml_quants.h"
#include "nabla/gguf.h"

namespace nabla {
namespace ops {
extern const OpDef op_matmul;
extern const OpDef op_dequantize;
}  // namespace ops

namespace reference {
namespace {

// The batch axes broadcast NumPy-style: out index (..., i, j) reads a at
// (..., i, k) and b at (..., k, j), each with its own batch axes aligned to
// the right and read at 0 where they have size 1 (broadcast_index).
void matmul_kernel(const Operands& a) {
  const TensorView &A = a.in[0], &B = a.in[1];
  const int64_t K = A.shape.back();
  const size_t r = a.out.shape.size();
  for_each_index(a.out.shape, [&](const Index& o) {
    Index ia = o, ib = o;
    double acc = 0;
    for (int64_t k = 0; k < K; ++k) {
      ia[r - 1] = k;
      ib[r - 2] = k;
      acc += get(A, broadcast_index(A, ia)) * get(B, broadcast_index(B, ib));
    }
    set(a.out, o, acc);
  });
}

// dequantize: each row's blocks decoded by the format's definition
// (io::dequantize), one row at a time.
void dequantize_kernel(const Operands& a) {
  const TensorView& w = a.in[0];
  const auto type = static_cast<GgmlType>(a.attrs->ints[0]);
  const int64_t K = a.attrs->ints[1];
  std::vector<uint8_t> bytes(size_t(w.shape[1]));
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t r = 0; r < w.shape[0]; ++r) {
    for (int64_t i = 0; i < w.shape[1]; ++i) bytes[size_t(i)] = w.ptr<uint8_t>()[r * w.strides[0] + i * w.strides[1]];
    io::dequantize(type, bytes.data(), K, row.data());
    for (int64_t k = 0; k < K; ++k) set(a.out, {r, k}, row[size_t(k)]);
  }
}

}  // namespace

void register_matmul_kernels() {
  register_kernel(ops::op_matmul, matmul_kernel);
  register_kernel(ops::op_dequantize, dequantize_kernel);
}

}  // namespace reference
}  // namespace nabla
