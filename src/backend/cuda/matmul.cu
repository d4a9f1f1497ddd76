// The products on the GPU: matmul ([..., M, K] x [..., K, N] -> [..., M,
// N], batch axes broadcast), matmul_heads (the result's heads after its
// rows), matmul_add (onto an addend), matmul_quantized (a ggml-format weight
// dequantized first), and dequantize. On the GPU an operand whose matrices
// are row- or column-major goes to cuBLAS as it is (others are first copied
// contiguous), one strided batched call per index of the batch axes before
// the last; f32 products are exact f32 (no TF32) unless --bf16-matmul.
// Under the emulator the same calls reach an emulated cuBLAS (runtime.h).
#include "backend/cuda/kernel.h"
#include "backend/cuda/runtime.h"
#include "nabla/gguf.h"

namespace nabla {
namespace ops {
extern const OpDef op_dequantize, op_matmul, op_matmul_add, op_matmul_heads, op_matmul_quantized;
}  // namespace ops

namespace NABLA_GPU {
namespace {

// An operand read as [batch..., rows, cols] against the output's batch axes.
View batched(const TensorView& x, const Shape& batch) {
  Shape to = batch;
  to.push_back(x.shape[x.shape.size() - 2]);
  to.push_back(x.shape.back());
  return broadcast_view(x, to);
}

// A product [batch..., M, K] x [batch..., K, N] written to out at the
// strides of `to` ([batch..., M, N]: row-major for matmul, heads after the
// rows for matmul_heads), added to what is there with `accumulate`.
struct Product {
  View a, b, to;
  int64_t M, N, K;
  bool accumulate, bf16;
};

// How cuBLAS reads a matrix: row- or column-major with a leading dimension,
// or `ok` false when neither (then the operand is copied first).
struct Layout {
  bool ok = false, row_major = true;
  int64_t ld = 0;
};

Layout layout_of(const View& v) {
  const int r = v.rank;
  const int64_t rows = v.shape[r - 2], cols = v.shape[r - 1];
  const int64_t rs = rows == 1 ? (cols > 1 ? cols : 1) : v.strides[r - 2], cs = cols == 1 ? 1 : v.strides[r - 1];
  if (cs == 1 && rs >= (cols > 1 ? cols : 1)) return {true, true, rs};
  const int64_t cs2 = cols == 1 ? (rows > 1 ? rows : 1) : v.strides[r - 1], rs2 = rows == 1 ? 1 : v.strides[r - 2];
  if (rs2 == 1 && cs2 >= (rows > 1 ? rows : 1)) return {true, false, cs2};
  return {};
}

// An operand cuBLAS cannot read as it is, copied contiguous into the call's
// scratch (its batch axes too).
Layout readable(const Context& ctx, View& v, DType dtype) {
  Layout l = layout_of(v);
  if (l.ok) return l;
  int64_t n = 1;
  for (int d = 0; d < v.rank; ++d) n *= v.shape[d];
  void* copy = scratch(ctx, size_t(n) * dtype_size(dtype));
  View to = v;
  to.data = copy;
  const Strides cs = contiguous_strides(Shape(v.shape, v.shape + v.rank));
  for (int d = 0; d < v.rank; ++d) to.strides[d] = cs[size_t(d)];
  copy_view(ctx, v, to, dtype);
  v.data = copy;
  for (int d = 0; d < v.rank; ++d) v.strides[d] = cs[size_t(d)];
  return layout_of(v);
}

// Row-major C = A B is column-major C^T = B^T A^T: cuBLAS's (m, n, k) =
// (N, M, K) with B first. A row-major operand is its own transpose in
// column-major (op N); a column-major one needs op T. One strided batched
// call per index of the batch axes but the last, which cuBLAS walks.
void run(const Context& ctx, Product p, DType dtype, void* out) {
  const int r = p.a.rank;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < r - 3; ++d) outer *= p.a.shape[d];
  if (r >= 3) inner = p.a.shape[r - 3];
  if (outer * inner * p.M * p.N == 0) return;
  if (p.K == 0 && !p.accumulate) {
    // Nothing to sum: zeros (the output of a product is contiguous, heads or not).
    TensorView o{out, dtype, {outer * inner * p.M * p.N}, {1}, true};
    return fill(ctx, o, 0.0);
  }
  if (p.K == 0) return;
  const Layout la = readable(ctx, p.a, dtype), lb = readable(ctx, p.b, dtype);
  const size_t elem = dtype_size(dtype);
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rest = o, ao = 0, bo = 0, co = 0;
    for (int d = r - 4; d >= 0; --d) {
      const int64_t idx = rest % p.a.shape[d];
      rest /= p.a.shape[d];
      ao += idx * p.a.strides[d];
      bo += idx * p.b.strides[d];
      co += idx * p.to.strides[d];
    }
    Gemm g{};
    g.dtype = dtype;
    g.trans_a = !lb.row_major;
    g.trans_b = !la.row_major;
    g.accumulate = p.accumulate;
    g.bf16 = p.bf16;
    g.m = p.N;
    g.n = p.M;
    g.k = p.K;
    g.a = static_cast<const char*>(p.b.data) + bo * int64_t(elem);
    g.lda = lb.ld;
    g.stride_a = r >= 3 ? p.b.strides[r - 3] : 0;
    g.b = static_cast<const char*>(p.a.data) + ao * int64_t(elem);
    g.ldb = la.ld;
    g.stride_b = r >= 3 ? p.a.strides[r - 3] : 0;
    g.c = static_cast<char*>(out) + co * int64_t(elem);
    g.ldc = p.to.strides[r - 2];
    g.stride_c = r >= 3 ? p.to.strides[r - 3] : 0;
    g.batch = inner;
    gemm(ctx.blas, g);
  }
}

// out [batch..., M, N] = a b (+ out with accumulate), row-major.
Product product_of(const TensorView& a, const TensorView& b, const Shape& out_shape, bool accumulate, bool bf16) {
  const size_t r = out_shape.size();
  const Shape batch(out_shape.begin(), out_shape.end() - 2);
  Product p{batched(a, batch), batched(b, batch), {}, out_shape[r - 2], out_shape[r - 1], a.shape.back(), accumulate,
            bf16};
  p.to = p.a;
  const Strides cs = contiguous_strides(out_shape);
  for (size_t d = 0; d < r; ++d) {
    p.to.shape[d] = out_shape[d];
    p.to.strides[d] = cs[d];
  }
  return p;
}

void matmul(const Operands& a, const Context& ctx) {
  run(ctx, product_of(a.in[0], a.in[1], a.out.shape, false, ctx.bf16_matmul), a.out.dtype, a.out.data);
}

// [..., H, M, K] x [..., H, K, N] -> [..., M, H, N].
void matmul_heads(const Operands& a, const Context& ctx) {
  const size_t r = a.out.shape.size();
  Shape logical = a.out.shape;  // [..., H, M, N]
  std::swap(logical[r - 3], logical[r - 2]);
  Product p = product_of(a.in[0], a.in[1], logical, false, ctx.bf16_matmul);
  const Strides os = contiguous_strides(a.out.shape);  // [..., M, H, N]
  p.to.strides[r - 3] = os[r - 2];
  p.to.strides[r - 2] = os[r - 3];
  run(ctx, p, a.out.dtype, a.out.data);
}

// [M, K] x [K, N] + c: c broadcast into the output, then the product added.
void matmul_add(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  copy_view(ctx, broadcast_view(a.in[2], a.out.shape), make_view(a.out), a.out.dtype);
  run(ctx, product_of(a.in[0], a.in[1], a.out.shape, true, ctx.bf16_matmul), a.out.dtype, a.out.data);
}

}  // namespace

void product_2d(const Context& ctx, const TensorView& A, const TensorView& B, float* C, int64_t ldc, bool bf16) {
  Product p = product_of(A, B, {A.shape[0], B.shape[1]}, false, bf16);
  p.to.strides[0] = ldc;
  run(ctx, p, DType::f32, C);
}

namespace {

// ---- dequantize: ggml's block formats (src/io/ggml_quants.h), element by
// element: row r's element k of a u8 [N, bytes] weight.
__device__ __forceinline__ float half_to_float(uint32_t h) {
  const uint32_t sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v;
  if (e == 0) v = gpu_math::ldexp(float(m), -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = gpu_math::ldexp(float(m + 1024), int(e) - 25);
  return sign ? -v : v;
}

struct Bytes {
  const uint8_t* p;
  int64_t stride;
  __device__ __forceinline__ uint32_t operator[](int64_t i) const { return p[i * stride]; }
  __device__ __forceinline__ float f16(int64_t i) const { return half_to_float((*this)[i] | ((*this)[i + 1] << 8)); }
};

__device__ float decode(GgmlType type, const Bytes& row, int64_t k) {
  switch (type) {
    case GgmlType::f32: {
      const uint32_t bits = row[4 * k] | (row[4 * k + 1] << 8) | (row[4 * k + 2] << 16) | (row[4 * k + 3] << 24);
      float f;
      memcpy(&f, &bits, 4);
      return f;
    }
    case GgmlType::f16: return row.f16(2 * k);
    case GgmlType::bf16: {
      const uint32_t bits = (row[2 * k] | (row[2 * k + 1] << 8)) << 16;
      float f;
      memcpy(&f, &bits, 4);
      return f;
    }
    case GgmlType::q8_0: {
      const Bytes b{row.p + (k / 32) * 34 * row.stride, row.stride};
      return b.f16(0) * float(int8_t(uint8_t(b[2 + k % 32])));
    }
    case GgmlType::q4_0: {
      const Bytes b{row.p + (k / 32) * 18 * row.stride, row.stride};
      const int64_t j = k % 32;
      const int q = j < 16 ? int(b[2 + j] & 0xF) : int(b[2 + j - 16] >> 4);
      return b.f16(0) * float(q - 8);
    }
    case GgmlType::q4_k: {
      const Bytes b{row.p + (k / 256) * 144 * row.stride, row.stride};
      const int64_t j = k % 256, c = j / 64, l = j % 64;
      const int sub = int(2 * c + (l >= 32 ? 1 : 0));
      // The sub-block's 6-bit scale and min, packed in bytes 4..15.
      int scale, min;
      if (sub < 4) {
        scale = int(b[4 + sub] & 63);
        min = int(b[4 + sub + 4] & 63);
      } else {
        scale = int((b[4 + sub + 4] & 0xF) | ((b[4 + sub - 4] >> 6) << 4));
        min = int((b[4 + sub + 4] >> 4) | ((b[4 + sub] >> 6) << 4));
      }
      const uint32_t byte = b[16 + c * 32 + l % 32];
      const int q = int(l < 32 ? byte & 0xF : byte >> 4);
      return b.f16(0) * float(scale) * float(q) - b.f16(2) * float(min);
    }
    case GgmlType::q6_k: {
      const Bytes b{row.p + (k / 256) * 210 * row.stride, row.stride};
      const int64_t j = k % 256, h = j / 128, part = j % 128 / 32, l = j % 32;
      const int64_t ql = h * 64, qh = 128 + h * 32, sc = 192 + h * 8 + l / 16 + 2 * part;
      const uint32_t low = part % 2 == 0 ? b[ql + l] : b[ql + l + 32];
      const int q = int((part < 2 ? low & 0xF : low >> 4) | (((b[qh + l] >> (2 * part)) & 3) << 4)) - 32;
      return b.f16(208) * float(int8_t(uint8_t(b[sc]))) * float(q);
    }
    default: return 0;
  }
}

// attrs.ints = {type, K, dtype}: w u8 [N, bytes] -> [N, K].
template <class T>
__global__ void dequantize_kernel(int64_t n, int64_t K, GgmlType type, View w, T* out) {
  NABLA_GRID_STRIDE(i, n) {
    const int64_t r = i / K, k = i % K;
    out[i] = T(decode(type, Bytes{static_cast<const uint8_t*>(w.data) + r * w.strides[0], w.strides[1]}, k));
  }
}

void dequantize(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  const auto type = static_cast<GgmlType>(a.attrs->ints[0]);
  const int64_t K = a.attrs->ints[1];
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), dequantize_kernel<T>, n, K, type, make_view(a.in[0]), a.out.ptr<T>());
  });
}

// x [..., K] W^T -> [..., N] (or, transposed, x [..., N] W -> [..., K]),
// W a u8 [N, bytes] weight of K-element rows: dequantized into the call's
// scratch, then multiplied. attrs.ints = {type, K, transposed}.
void matmul_quantized(const Operands& a, const Context& ctx) {
  const TensorView &x = a.in[0], &w = a.in[1];
  const auto type = static_cast<GgmlType>(a.attrs->ints[0]);
  const int64_t K = a.attrs->ints[1], N = w.shape[0];
  const bool transposed = a.attrs->ints[2] != 0;
  if (a.out.numel() == 0) return;
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    T* weight = static_cast<T*>(scratch(ctx, size_t(N * K > 0 ? N * K : 1) * sizeof(T)));
    if (N * K > 0) {
      launch(ctx, elementwise_launch(N * K), dequantize_kernel<T>, N * K, K, type, make_view(w), weight);
    }
    // W [N, K] as it is, or W^T [K, N] as its transpose's strides.
    const TensorView wt = transposed ? TensorView{weight, a.out.dtype, {N, K}, {K, 1}, true}
                                     : TensorView{weight, a.out.dtype, {K, N}, {1, K}, false};
    // x [..., inner] as [rows, inner].
    const int64_t inner = x.shape.back(), rows = x.numel() / (inner > 0 ? inner : 1);
    View xv = make_view(x);
    Shape x2{rows, inner};
    TensorView x_flat = x;
    if (x.shape.size() == 1) {
      x_flat = TensorView{x.data, x.dtype, x2, {inner, x.strides[0]}, false};
    } else if (x.shape.size() != 2) {
      // Rows of x as one axis: its leading axes must collapse (they do for
      // the contiguous activations this op takes; others are copied).
      bool collapses = true;
      for (size_t d = 0; d + 2 < x.shape.size(); ++d) {
        collapses = collapses && (x.shape[d] == 1 || x.strides[d] == x.strides[d + 1] * x.shape[d + 1]);
      }
      if (!collapses) {
        T* copy = static_cast<T*>(scratch(ctx, size_t(x.numel()) * sizeof(T)));
        View to = xv;
        to.data = copy;
        const Strides cs = contiguous_strides(x.shape);
        for (size_t d = 0; d < cs.size(); ++d) to.strides[d] = cs[d];
        copy_view(ctx, xv, to, x.dtype);
        x_flat = TensorView{copy, x.dtype, x.shape, cs, true};
      }
      x_flat = TensorView{x_flat.data, x.dtype, x2, {x_flat.strides[x.shape.size() - 2], x_flat.strides.back()}, false};
    }
    run(ctx, product_of(x_flat, wt, {rows, a.out.shape.back()}, false, ctx.bf16_matmul), a.out.dtype, a.out.data);
  });
}

}  // namespace

void register_matmul_kernels() {
  register_kernel(ops::op_matmul, matmul);
  register_kernel(ops::op_matmul_heads, matmul_heads);
  register_kernel(ops::op_matmul_add, matmul_add);
  register_kernel(ops::op_dequantize, dequantize);
  register_kernel(ops::op_matmul_quantized, matmul_quantized);
}

}  // namespace NABLA_GPU
}  // namespace nabla
