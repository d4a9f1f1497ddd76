// matmul and dequantize on the GPU. matmul: [..., M, K] x [..., K, N] ->
// [..., M, N], batch axes broadcast. On the GPU each operand whose matrices
// are row- or column-major with one batch stride goes to cuBLAS as it is
// (others are first copied contiguous); f32 products are exact f32 (no
// TF32) unless --bf16-matmul. Under the emulator a plain kernel computes
// each output element as its dot product, k ascending.
#include "backend/cuda/kernel.h"
#include "backend/cuda/runtime.h"
#include "nabla/gguf.h"

namespace nabla {
namespace ops {
extern const OpDef op_dequantize, op_matmul;
}  // namespace ops

namespace NABLA_GPU {
namespace {

// An operand read as [batch, rows, cols] against the output's batch axes.
View batched(const TensorView& x, const Shape& out_shape) {
  Shape to(out_shape.begin(), out_shape.end() - 2);
  to.push_back(x.shape[x.shape.size() - 2]);
  to.push_back(x.shape.back());
  return broadcast_view(x, to);
}

#if defined(NABLA_CUDA_EMULATED)

template <class T>
__global__ void matmul_kernel(int64_t n, View a, View b, int64_t M, int64_t N, int64_t K, T* out) {
  NABLA_GRID_STRIDE(i, n) {
    const int64_t j = i % N, r = i / N % M, batch = i / (N * M);
    // The batch offsets: the output's batch index through each operand's strides.
    int64_t ao = 0, bo = 0;
    int64_t rest = batch;
    for (int d = a.rank - 3; d >= 0; --d) {
      const int64_t idx = rest % a.shape[d];
      rest /= a.shape[d];
      ao += idx * a.strides[d];
      bo += idx * b.strides[d];
    }
    const T* pa = static_cast<const T*>(a.data) + ao + r * a.strides[a.rank - 2];
    const T* pb = static_cast<const T*>(b.data) + bo + j * b.strides[b.rank - 1];
    T acc = T(0);
    for (int64_t k = 0; k < K; ++k) acc += pa[k * a.strides[a.rank - 1]] * pb[k * b.strides[b.rank - 2]];
    out[i] = acc;
  }
}

// f32 x -> bf16 -> f32, to nearest even (as the GPU's bf16 products read
// their inputs).
__device__ __forceinline__ float round_bf16(float x) {
  uint32_t bits;
  memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return x;
  bits += 0x7fffu + ((bits >> 16) & 1);
  bits &= 0xffff0000u;
  memcpy(&x, &bits, 4);
  return x;
}

__global__ void product_kernel(int64_t n, View a, View b, int64_t N, int64_t K, float* out, int64_t ldc, bool bf16) {
  NABLA_GRID_STRIDE(i, n) {
    const int64_t j = i % N, r = i / N;
    const float* pa = static_cast<const float*>(a.data) + r * a.strides[0];
    const float* pb = static_cast<const float*>(b.data) + j * b.strides[1];
    float acc = 0;
    for (int64_t k = 0; k < K; ++k) {
      float x = pa[k * a.strides[1]], y = pb[k * b.strides[0]];
      if (bf16) {
        x = round_bf16(x);
        y = round_bf16(y);
      }
      acc += x * y;
    }
    out[r * ldc + j] = acc;
  }
}

}  // namespace

void product_2d(const Context& ctx, const TensorView& A, const TensorView& B, float* C, int64_t ldc, bool bf16) {
  const int64_t M = A.shape[0], N = B.shape[1], K = A.shape[1];
  if (M * N == 0) return;
  launch(ctx, elementwise_launch(M * N), product_kernel, M * N, make_view(A), make_view(B), N, K, C, ldc, bf16);
}

namespace {

void matmul(const Operands& a, const Context& ctx) {
  const int64_t n = a.out.numel();
  if (n == 0) return;
  const size_t r = a.out.shape.size();
  const int64_t M = a.out.shape[r - 2], N = a.out.shape[r - 1], K = a.in[0].shape.back();
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), matmul_kernel<T>, n, batched(a.in[0], a.out.shape),
           batched(a.in[1], a.out.shape), M, N, K, a.out.ptr<T>());
  });
}

#else

// How cuBLAS reads an operand: its matrices' layout, leading dimension and
// batch stride, or `ok` false when they have none (then it is copied).
struct Layout {
  bool ok = false, row_major = true;
  int64_t ld = 0, batch_stride = 0;
};

Layout layout_of(const View& v) {
  const int r = v.rank;
  const int64_t rows = v.shape[r - 2], cols = v.shape[r - 1];
  Layout l;
  // One stride for the flattened batch: each axis's stride the next one's
  // times its size, or all 0 (broadcast).
  int64_t stride = 0, extent = 1;
  bool uniform = true, all_zero = true;
  for (int d = r - 3; d >= 0; --d) {
    if (v.shape[d] == 1) continue;
    all_zero = all_zero && v.strides[d] == 0;
    if (extent == 1) stride = v.strides[d];
    else uniform = uniform && v.strides[d] == stride * extent;
    extent *= v.shape[d];
  }
  if (!(uniform || all_zero)) return l;
  l.batch_stride = all_zero ? 0 : stride;
  const int64_t rs = rows == 1 ? cols : v.strides[r - 2], cs = cols == 1 ? 1 : v.strides[r - 1];
  if (cs == 1 && rs >= (cols > 1 ? cols : 1)) {
    l = {true, true, rs, l.batch_stride};
  } else if (rs == 1 && v.strides[r - 1] >= (rows > 1 ? rows : 1)) {
    l = {true, false, v.strides[r - 1], l.batch_stride};
  } else if (rows == 1 && cols == 1) {
    l = {true, true, 1, l.batch_stride};
  }
  return l;
}

// Row-major C = A B is column-major C^T = B^T A^T: cuBLAS's (m, n, k) =
// (N, M, K) with B first. A row-major operand is its own transpose in
// column-major (op N); a column-major one needs op T.
Gemm swapped(DType dtype, const Layout& la, const void* a, const Layout& lb, const void* b, int64_t M, int64_t N,
             int64_t K, void* c, int64_t ldc, bool bf16) {
  Gemm g{};
  g.dtype = dtype;
  g.trans_a = !lb.row_major;
  g.trans_b = !la.row_major;
  g.accumulate = false;
  g.bf16 = bf16;
  g.m = N;
  g.n = M;
  g.k = K;
  g.a = b;
  g.lda = lb.ld;
  g.stride_a = lb.batch_stride;
  g.b = a;
  g.ldb = la.ld;
  g.stride_b = la.batch_stride;
  g.c = c;
  g.ldc = ldc;
  g.stride_c = M * ldc;
  g.batch = 1;
  return g;
}

// An operand cuBLAS cannot read as it is, copied to [batch, rows, cols] in
// the call's scratch; returns how cuBLAS reads it.
Layout readable(const Context& ctx, View& v, int64_t batch, DType dtype) {
  Layout l = layout_of(v);
  if (l.ok) return l;
  const int64_t n = batch * v.shape[v.rank - 2] * v.shape[v.rank - 1];
  void* copy = scratch(ctx, size_t(n) * dtype_size(dtype));
  View to = v;
  const Strides cs = contiguous_strides(Shape(v.shape, v.shape + v.rank));
  for (int d = 0; d < v.rank; ++d) to.strides[d] = cs[size_t(d)];
  dispatch_real(dtype, ctx.op, [&]<class T>() {
    launch(ctx, elementwise_launch(n), copy_kernel<T>, n, v, static_cast<T*>(copy), to);
  });
  v.data = copy;
  for (int d = 0; d < v.rank; ++d) v.strides[d] = cs[size_t(d)];
  return layout_of(v);
}

}  // namespace

void product_2d(const Context& ctx, const TensorView& A, const TensorView& B, float* C, int64_t ldc, bool bf16) {
  const int64_t M = A.shape[0], N = B.shape[1], K = A.shape[1];
  if (M * N == 0) return;
  View a = make_view(A), b = make_view(B);
  const Layout la = readable(ctx, a, 1, DType::f32), lb = readable(ctx, b, 1, DType::f32);
  if (K == 0) {
    TensorView c{C, DType::f32, {M, ldc}, {ldc, 1}, true};
    return fill(ctx, c, 0.0);
  }
  gemm(ctx.blas, swapped(DType::f32, la, a.data, lb, b.data, M, N, K, C, ldc, bf16));
}

namespace {

void matmul(const Operands& a, const Context& ctx) {
  const size_t r = a.out.shape.size();
  const int64_t M = a.out.shape[r - 2], N = a.out.shape[r - 1], K = a.in[0].shape.back();
  const int64_t batch = M * N == 0 ? 0 : a.out.numel() / (M * N);
  if (a.out.numel() == 0) return;
  if (K == 0) return fill(ctx, a.out, 0.0);
  View A = batched(a.in[0], a.out.shape), B = batched(a.in[1], a.out.shape);
  const Layout la = readable(ctx, A, batch, a.out.dtype), lb = readable(ctx, B, batch, a.out.dtype);
  Gemm g = swapped(a.out.dtype, la, A.data, lb, B.data, M, N, K, a.out.data, N, ctx.bf16_matmul);
  g.batch = batch;
  gemm(ctx.blas, g);
}

#endif

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

}  // namespace

void register_matmul_kernels() {
  register_kernel(ops::op_matmul, matmul);
  register_kernel(ops::op_dequantize, dequantize);
}

}  // namespace NABLA_GPU
}  // namespace nabla
