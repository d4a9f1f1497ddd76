// The CUDA backend's kernels: what each kernel file (src/backend/cuda/*.cu)
// sees. A kernel here is a host function that launches device kernels on
// the program's stream for one op application; it registers in its file's
// register_*_kernels(), which backend.cu calls. Everything compiles twice
// (device.h): by nvcc for the GPU, and as host C++ for the emulator.
#pragma once

#include <cstdint>
#include <string>

#include "backend/cuda/device.h"
#include "core/op.h"

namespace nabla::NABLA_GPU {

inline constexpr int kMaxRank = 8;

// A device-side error, written by the first thread that finds one and read
// at the next synchronize, which throws it: an index out of range (the CPU
// kernels' ShapeError, with the same message), or a bad optimizer setting.
struct DeviceError {
  int32_t code;  // 0: none; else an ErrorCode
  int32_t pad;
  const char* op;  // the op's name (a host pointer, never read on the device)
  int64_t position, value, limit, extra;
};
enum ErrorCode : int32_t { kNoError = 0, kIndexOutOfRange = 1, kBadHyper = 2, kLabelOutOfRange = 3 };
// kBadHyper's `value`: which setting.
enum BadHyper : int64_t { kBadLearningRate = 0, kBadStep = 1, kBadWeightDecay = 2, kBadSgd = 3 };

struct ScratchList;
// What a kernel runs with: the stream and cuBLAS handle (opaque here), the
// error record, the op being run (for its errors), and the scratch it may use.
struct Context {
  void* stream = nullptr;
  void* blas = nullptr;
  DeviceError* error = nullptr;
  const char* op = "";
  bool bf16_matmul = false;
  ScratchList* scratch = nullptr;
};

using Kernel = void (*)(const Operands&, const Context&);
void register_kernel(const OpDef& op, Kernel kernel);
Kernel kernel_of(const OpDef& op);

void register_elementwise_kernels();
void register_reduction_kernels();
void register_layout_kernels();
void register_indexing_kernels();
void register_matmul_kernels();
void register_image_kernels();
void register_random_kernels();
void register_optimizer_kernels();
void register_factored_kernels();
void register_norm_kernels();
void register_softmax_kernels();
void register_attention_kernels();

// Device memory for a kernel's scratch, valid until the call returns (the
// next call's kernels may reuse it): the k-th request of a call gets the
// program's k-th buffer (backend.cu).
void* scratch(const Context& ctx, size_t bytes);

// A view as the device reads it: rank, shape and strides in elements, dtype.
struct View {
  void* data;
  int32_t rank;
  DType dtype;
  int64_t shape[kMaxRank];
  int64_t strides[kMaxRank];
};

// `v` as a View, or `v` read as if of rank `rank` (broadcast to the right,
// size-1 axes read with stride 0): an elementwise op's input against its
// output's shape.
View make_view(const TensorView& v);
View broadcast_view(const TensorView& v, const Shape& to);
// Views of one shape with their axes merged wherever every view steps
// through two neighbours as through one axis, and size-1 axes dropped: the
// same offsets for the same positions, with fewer divisions per element in
// offset_of (a bias [C] against [B, T, C] reads as [B*T, C], a contiguous
// tensor as one axis).
void coalesce(View* const* views, int count);
// `v` as a view of its elements in row-major order, coalesced: for kernels
// that only ask offset_of(v, i).
View flat_view(const TensorView& v);

// The element offset of row-major position `i` (in range) of v's shape.
__host__ __device__ __forceinline__ int64_t offset_of(const View& v, int64_t i) {
  int64_t at = 0;
  for (int d = v.rank - 1; d > 0; --d) {
    const int64_t n = v.shape[d];
    at += (i % n) * v.strides[d];
    i /= n;
  }
  return v.rank > 0 ? at + i * v.strides[0] : at;
}

// v's element at `at` converted to T.
template <class T>
__device__ __forceinline__ T load(const View& v, int64_t at) {
  switch (v.dtype) {
    case DType::f32: return T(static_cast<const float*>(v.data)[at]);
    case DType::f64: return T(static_cast<const double*>(v.data)[at]);
    case DType::i32: return T(static_cast<const int32_t*>(v.data)[at]);
    case DType::u8: return T(static_cast<const uint8_t*>(v.data)[at]);
  }
  return T(0);
}
template <class T>
__device__ __forceinline__ void store(const View& v, int64_t at, T x) {
  switch (v.dtype) {
    case DType::f32: static_cast<float*>(v.data)[at] = float(x); return;
    case DType::f64: static_cast<double*>(v.data)[at] = double(x); return;
    case DType::i32: static_cast<int32_t*>(v.data)[at] = int32_t(x); return;
    case DType::u8: static_cast<uint8_t*>(v.data)[at] = uint8_t(x); return;
  }
}

// Records an error unless one is recorded already.
__device__ __forceinline__ void report(DeviceError* e, const char* op, int32_t code, int64_t position, int64_t value,
                                       int64_t limit, int64_t extra = 0) {
#if defined(NABLA_CUDA_EMULATED)
  if (e->code != kNoError) return;
  e->code = code;
#else
  if (atomicCAS(&e->code, kNoError, code) != kNoError) return;
#endif
  e->op = op;
  e->position = position;
  e->value = value;
  e->limit = limit;
  e->extra = extra;
}

// ---- Launching.
struct Launch {
  dim3 grid, block;
  size_t shared = 0;
  // The kernel calls __syncthreads or a warp shuffle (the emulator then runs
  // each thread on a fiber; the GPU ignores it).
  bool barriers = false;
};

inline constexpr unsigned kThreads = 256;
// A grid-stride loop's launch over n elements.
inline Launch elementwise_launch(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return {dim3(unsigned(blocks < 1 ? 1 : blocks > 65535 * 8 ? 65535 * 8 : blocks)), dim3(kThreads)};
}
// One block (of `threads`) per row, rows along x then y (grids of more
// than 2^31 - 1 blocks never arise).
inline Launch rows_launch(int64_t rows, unsigned threads, size_t shared = 0) {
  const int64_t x = rows < 65535 ? (rows < 1 ? 1 : rows) : 65535, y = (rows + x - 1) / x;
  return {dim3(unsigned(x), unsigned(y < 1 ? 1 : y)), dim3(threads), shared, true};
}
__device__ __forceinline__ int64_t block_row() { return int64_t(blockIdx.y) * gridDim.x + blockIdx.x; }

// Throws the last launch's error, naming the op.
void check_launch(const Context& ctx);

#if defined(NABLA_CUDA_EMULATED)
template <class... P, class... A>
void launch(const Context& ctx, const Launch& l, void (*kernel)(P...), const A&... args) {
  (void)ctx;
  ::nabla::cuda_emulator::launch(l.grid, l.block, l.shared, l.barriers, [&] { kernel(args...); });
}
#elif defined(__CUDACC__)
template <class... P, class... A>
void launch(const Context& ctx, const Launch& l, void (*kernel)(P...), const A&... args) {
  // Past 48 KiB a kernel's dynamic shared memory must be asked for.
  if (l.shared > (size_t(48) << 10)) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(l.shared));
  kernel<<<l.grid, l.block, l.shared, static_cast<cudaStream_t>(ctx.stream)>>>(args...);
  check_launch(ctx);
}
#endif

#define NABLA_GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// ---- Block reductions (blockDim.x a multiple of 32, at most 1024).
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int m = 16; m > 0; m /= 2) v += shuffle_xor(v, m);
  return v;
}
template <class T>
__device__ __forceinline__ T warp_max(T v) {
  for (int m = 16; m > 0; m /= 2) {
    const T o = shuffle_xor(v, m);
    v = o > v || gpu_math::isnan(double(o)) ? o : v;
  }
  return v;
}
// The sum over the block of every thread's v, on every thread; the same
// tree for the same blockDim, so the result is the same run to run.
template <class T>
__device__ T block_sum(T v) {
  NABLA_SHARED T partial[32];
  v = warp_sum(v);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = int(blockDim.x) / 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : T(0);
  return warp_sum(v);
}
template <class T>
__device__ T block_max(T v, T lowest) {
  NABLA_SHARED T partial[32];
  v = warp_max(v);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = int(blockDim.x) / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : lowest;
  return warp_max(v);
}

// A tensor [..., C] as rows: `rows` holds the leading axes (offset_of(rows,
// r) is row r's first element), `stride` the last axis's, `len` its size.
struct Rows {
  View rows;
  int64_t stride, len, count;
};
Rows rows_of(const TensorView& v);
template <class T>
__device__ __forceinline__ const T* row_ptr(const Rows& r, int64_t row) {
  return static_cast<const T*>(r.rows.data) + offset_of(r.rows, row);
}
// Threads for a block that walks a row of `len` elements: a warp at least,
// 512 at most.
inline unsigned row_threads(int64_t len) {
  unsigned t = 32;
  while (t < 512 && int64_t(t) < len) t *= 2;
  return t;
}

// Calls fn<T>() with T the C++ type of a floating dtype (f32 or f64).
template <class F>
void dispatch_real(DType dtype, const char* op, F&& fn) {
  if (dtype == DType::f32) fn.template operator()<float>();
  else if (dtype == DType::f64) fn.template operator()<double>();
  else throw DTypeError(std::string(op) + ": cuda kernels take f32 or f64, got " + dtype_name(dtype));
}

// Calls fn<T>() with T the C++ type of `dtype` (any of them: copies).
template <class F>
void dispatch_any(DType dtype, F&& fn) {
  switch (dtype) {
    case DType::f32: fn.template operator()<float>(); return;
    case DType::f64: fn.template operator()<double>(); return;
    case DType::i32: fn.template operator()<int32_t>(); return;
    case DType::u8: fn.template operator()<uint8_t>(); return;
  }
}

// Copies the elements of `from` (any strides) to where `to` (the same
// shape; its data the destination) puts them, in `dtype` (layout.cu).
void copy_view(const Context& ctx, View from, View to, DType dtype);

// Sets every element of the contiguous `out` to value (layout.cu).
void fill(const Context& ctx, const TensorView& out, double value);

// Shared by the factored-gradient ops (factored.cu) and their parts' own ops:
// C [M, N] (row stride ldc) = A [M, K] B [K, N], f32, any strides; `bf16`
// rounds A and B to bf16 first (matmul.cu).
void product_2d(const Context& ctx, const TensorView& A, const TensorView& B, float* C, int64_t ldc, bool bf16);
// out [rows, width] (+)= values [*I, width...] added at the rows indices [*I]
// name, each row's sum in position order (indexing.cu).
void add_rows(const Context& ctx, const TensorView& values, const TensorView& indices, float* out, int64_t rows,
              int64_t width, bool accumulate);
// *out = the squares of every element of xs summed in double (reductions.cu).
void squares_sum(const Context& ctx, const std::vector<TensorView>& xs, double* out);
// One AdamW step of p, m, v (a.in[0], [first], [first + 1]) from gradient g,
// with hyper and grad_scale at a.in[first + 2], [first + 3] (optimizer.cu).
void adamw(const Context& ctx, const Operands& a, size_t first, const View& g);

}  // namespace nabla::NABLA_GPU
