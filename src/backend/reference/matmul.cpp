// Reference kernel of matmul: [..., M, K] x [..., K, N] -> [..., M, N], each
// output element a dot product summed in double, k ascending.
#include "backend/reference/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_matmul;
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

}  // namespace

void register_matmul_kernels() { register_kernel(ops::op_matmul, matmul_kernel); }

}  // namespace reference
}  // namespace nabla
