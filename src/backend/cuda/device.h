// What the CUDA kernels (src/backend/cuda/*.cu) are written against: CUDA
// itself under nvcc, the emulator (emulator.h) when the same files compile
// as host C++ (NABLA_CUDA_EMULATED), so one source is both the GPU's kernel
// and the kernel the CPU-only test suite checks. Kernels use the subset
// defined here: threadIdx/blockIdx/blockDim/gridDim, __syncthreads,
// NABLA_SHARED for a block's shared arrays, the warp_* reductions, and the
// math of gpu_math.
//
// Both builds live in one library, so their code sits in different
// namespaces: nabla::NABLA_GPU (cuda or cuda_emulated).
#pragma once

#include <cstdint>

#if defined(NABLA_CUDA_EMULATED)

#include <cmath>
#include <cstring>

#include "backend/cuda/emulator.h"

#define NABLA_GPU cuda_emulated
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// One copy per host thread, and the emulator runs one block at a time per
// host thread: a block's shared array.
#define NABLA_SHARED static thread_local
#define threadIdx (::nabla::cuda_emulator::thread().thread_idx)
#define blockIdx (::nabla::cuda_emulator::thread().block_idx)
#define blockDim (::nabla::cuda_emulator::launch_state().block)
#define gridDim (::nabla::cuda_emulator::launch_state().grid)

namespace nabla::cuda_emulated {
using dim3 = ::nabla::cuda_emulator::dim3;
inline void __syncthreads() { ::nabla::cuda_emulator::sync_block(); }
inline int lane_id() { return ::nabla::cuda_emulator::lane(); }
// __syncwarp: every lane of the warp arrives.
inline void warp_sync() { ::nabla::cuda_emulator::exchange(0, 0); }
// __nv_bfloat16: the upper half of an f32's bits, rounded to nearest even
// (subnormals kept, NaN kept a NaN), as __float2bfloat16_rn rounds.
struct bf16 {
  uint16_t bits;
};
inline bf16 to_bf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return {uint16_t((b >> 16) | 0x40u)};
  b += 0x7fffu + ((b >> 16) & 1u);
  return {uint16_t(b >> 16)};
}
inline float to_float(bf16 x) {
  const uint32_t b = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
template <class T>
T shuffle_xor(T v, int mask) {
  return ::nabla::cuda_emulator::shuffle(v, lane_id() ^ mask);
}
template <class T>
T shuffle_down(T v, int delta) {
  return ::nabla::cuda_emulator::shuffle(v, lane_id() + delta);
}
template <class T>
T shuffle_from(T v, int source) {
  return ::nabla::cuda_emulator::shuffle(v, source);
}
// The block's dynamic shared memory (launch's shared_bytes), as T.
template <class T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(::nabla::cuda_emulator::launch_state().dynamic_shared);
}
// Integer atomics (blocks run one at a time: plain operations). Only
// integer ones exist: float sums in atomic order would differ run to run.
inline int atomic_add(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}
inline int atomic_max(int* p, int v) {
  const int old = *p;
  if (v > old) *p = v;
  return old;
}
}  // namespace nabla::cuda_emulated

#else  // nvcc

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define NABLA_GPU cuda
#define NABLA_SHARED __shared__

namespace nabla::cuda {
__device__ __forceinline__ int lane_id() { return int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) & 31; }
template <class T>
__device__ __forceinline__ T shuffle_xor(T v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}
// Lanes past the warp's end keep their own value, as __shfl_down_sync does.
template <class T>
__device__ __forceinline__ T shuffle_down(T v, int delta) {
  return __shfl_down_sync(0xffffffffu, v, delta);
}
template <class T>
__device__ __forceinline__ T shuffle_from(T v, int source) {
  return __shfl_sync(0xffffffffu, v, source);
}
__device__ __forceinline__ void warp_sync() { __syncwarp(); }
using bf16 = __nv_bfloat16;
__device__ __forceinline__ bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ int atomic_add(int* p, int v) { return atomicAdd(p, v); }
__device__ __forceinline__ int atomic_max(int* p, int v) { return atomicMax(p, v); }
template <class T>
__device__ __forceinline__ T* dynamic_shared() {
  extern __shared__ __align__(128) unsigned char nabla_dynamic_shared[];
  return reinterpret_cast<T*>(nabla_dynamic_shared);
}
}  // namespace nabla::cuda

#endif

namespace nabla::NABLA_GPU {

// ---- Math on float and double alike (kernels are templates over T).
namespace gpu_math {
#if defined(NABLA_CUDA_EMULATED)
using std::abs;
using std::cos;
using std::erf;
using std::floor;
using std::ldexp;
using std::pow;
using std::sin;
using std::exp;
using std::expm1;
using std::log;
using std::log1p;
using std::sqrt;
using std::tanh;
inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline bool isnan(double x) { return std::isnan(x); }
#else
__device__ __forceinline__ float abs(float x) { return fabsf(x); }
__device__ __forceinline__ double abs(double x) { return ::fabs(x); }
__device__ __forceinline__ float erf(float x) { return erff(x); }
__device__ __forceinline__ double erf(double x) { return ::erf(x); }
__device__ __forceinline__ float exp(float x) { return expf(x); }
__device__ __forceinline__ double exp(double x) { return ::exp(x); }
__device__ __forceinline__ float expm1(float x) { return expm1f(x); }
__device__ __forceinline__ double expm1(double x) { return ::expm1(x); }
__device__ __forceinline__ float log(float x) { return logf(x); }
__device__ __forceinline__ double log(double x) { return ::log(x); }
__device__ __forceinline__ float log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double log1p(double x) { return ::log1p(x); }
__device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt(double x) { return ::sqrt(x); }
__device__ __forceinline__ float tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh(double x) { return ::tanh(x); }
__device__ __forceinline__ float rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ double rsqrt(double x) { return ::rsqrt(x); }
__device__ __forceinline__ bool isnan(double x) { return x != x; }
__device__ __forceinline__ double cos(double x) { return ::cos(x); }
__device__ __forceinline__ double sin(double x) { return ::sin(x); }
__device__ __forceinline__ double floor(double x) { return ::floor(x); }
__device__ __forceinline__ double pow(double x, double y) { return ::pow(x, y); }
__device__ __forceinline__ float ldexp(float x, int e) { return ldexpf(x, e); }
#endif
}  // namespace gpu_math

// x rounded to bf16 and back (f64 is never rounded: the bf16 matmul option
// is for f32).
__device__ __forceinline__ float round_bf16(float x) { return to_float(to_bf16(x)); }
__device__ __forceinline__ double round_bf16(double x) { return x; }

}  // namespace nabla::NABLA_GPU
