// What the CUDA backend needs of the machine, in two implementations:
// runtime_cuda.cu (CUDA's runtime and cuBLAS, the real GPU) and
// runtime_emulated.cpp (guarded host pages and the emulator). Streams and
// handles are opaque pointers so that host code needs no CUDA header.
#pragma once

#include <cstddef>
#include <string>

#include "backend/cuda/device.h"
#include "nabla/dtype.h"

namespace nabla::NABLA_GPU {

// Empty when a device can be used; else why not ("no CUDA device: ...").
std::string unavailable();
// Makes the process's device the calling thread's current one
// (NABLA_CUDA_DEVICE, else the MPI/Slurm local rank, else 0; none in the
// emulator).
void use_device();
// The device's name and memory, for messages and benchmarks.
std::string device_description();

// The most dynamic shared memory a block may ask for (the opt-in limit).
size_t max_shared_bytes();

// Memory the executor plans in (guarded pages in the emulator).
void* device_allocate(size_t bytes);
void device_release(void* p);
// Memory of the backend's own (scratch, the error record): plain pages in
// the emulator, so kernels may touch it without opening it.
void* scratch_allocate(size_t bytes);
void scratch_release(void* p);

void* create_stream();
void* create_blas(void* stream);
void copy_to_device(void* dst, const void* host_src, size_t bytes, void* stream);
void copy_to_host(void* host_dst, const void* src, size_t bytes, void* stream);
void copy_device(void* dst, const void* src, size_t bytes, void* stream);
void fill_zero(void* dst, size_t bytes, void* stream);
void stream_synchronize(void* stream);
// Page-locked host memory (plain in the emulator): copies into it run
// behind the stream's work without holding up the caller.
void* host_allocate(size_t bytes);
void host_release(void* p);
// Queues a copy to the host behind the stream's work so far and returns an
// event after it; event_wait returns once the copy has landed.
void* copy_to_host_queued(void* host_dst, const void* src, size_t bytes, void* stream);
void event_wait(void* event);
void event_release(void* event);
// Throws the last kernel launch's error (a bad configuration), naming the op.
void check_last_launch(const char* op);

// cuBLAS's strided batched product, column-major: C = op(A) op(B) (+ C with
// `accumulate`), f32 or f64; `bf16` rounds f32 inputs to bf16 (tensor cores).
// The emulator's follows cuBLAS's definition and refuses what cuBLAS refuses
// (a leading dimension too small for its matrix), so matmul.cu's mapping
// of nabla's layouts onto it is checked on every machine.
struct Gemm {
  DType dtype;
  bool trans_a, trans_b, accumulate, bf16;
  int64_t m, n, k;
  const void* a;
  int64_t lda, stride_a;
  const void* b;
  int64_t ldb, stride_b;
  void* c;
  int64_t ldc, stride_c;
  int64_t batch;
};
void gemm(void* blas, const Gemm& g);

}  // namespace nabla::NABLA_GPU
