// The CUDA backend's runtime on a GPU (runtime.h): CUDA's runtime API on
// one stream of device 0, and a cuBLAS handle on that stream.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdlib>

#include "backend/cuda/runtime.h"
#include "nabla/error.h"

namespace nabla::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

std::string unavailable() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("no CUDA device (") + cudaGetErrorString(e) + ")";
  if (count == 0) return "no CUDA device";
  return "";
}

namespace {

// The device this process uses, of those it sees: NABLA_CUDA_DEVICE, else
// its rank on its machine under MPI or Slurm (one GPU a rank; ranks beyond
// the GPUs share them in turn), else 0.
int chosen_device() {
  static const int device = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return 0;
    if (const char* v = std::getenv("NABLA_CUDA_DEVICE")) {
      char* end = nullptr;
      const long d = std::strtol(v, &end, 10);
      if (!*v || *end || d < 0 || d >= count) {
        throw UsageError(std::string("NABLA_CUDA_DEVICE=") + v + ": not a device of the " + std::to_string(count) +
                         " this process sees (0 to " + std::to_string(count - 1) + ")");
      }
      return int(d);
    }
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
      const char* v = std::getenv(name);
      if (!v || !*v) continue;
      char* end = nullptr;
      const long rank = std::strtol(v, &end, 10);
      if (!*end && rank >= 0) return int(rank % count);
    }
    return 0;
  }();
  return device;
}

}  // namespace

// The runtime's current device is the calling thread's: set it wherever
// the backend enters from (a caller may run graphs on any thread).
void use_device() { check(cudaSetDevice(chosen_device()), "cudaSetDevice"); }

std::string device_description() {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, chosen_device()), "cudaGetDeviceProperties");
  return std::string(p.name) + ", " + std::to_string(p.totalGlobalMem >> 20) + " MiB, compute capability " +
         std::to_string(p.major) + "." + std::to_string(p.minor);
}

size_t max_shared_bytes() {
  static const size_t bytes = [] {
    int device = 0, value = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
    return size_t(value);
  }();
  return bytes;
}

void* device_allocate(size_t bytes) {
  use_device();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    size_t free = 0, total = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free, &total);
    throw Error("cuda: out of memory allocating " + std::to_string(bytes) + " bytes (" + std::to_string(free >> 20) +
                " of " + std::to_string(total >> 20) + " MiB free)");
  }
  return p;
}
void device_release(void* p) {
  use_device();
  cudaFree(p);
}
void* scratch_allocate(size_t bytes) { return device_allocate(bytes); }
void scratch_release(void* p) { cudaFree(p); }

void* create_stream() {
  use_device();
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}

namespace {

// cuBLAS, opened on first use: linking it would cost every process that
// links nabla a tenth of a second at start, GPU or not.
struct Blas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetAtomicsMode) set_atomics_mode = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  // The C entry point (the header also overloads it for C++).
  cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
                         cudaDataType, int, long long, const void*, cudaDataType, int, long long, const void*, void*,
                         cudaDataType, int, long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

const Blas& blas() {
  static const Blas b = [] {
    void* lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw Error(std::string("cuda: cannot open cuBLAS (libcublas.so.13): ") + dlerror());
    const auto symbol = [&](const char* name) {
      void* f = dlsym(lib, name);
      if (!f) throw Error(std::string("cuda: cuBLAS has no ") + name);
      return f;
    };
    Blas r;
    r.create = reinterpret_cast<decltype(r.create)>(symbol("cublasCreate_v2"));
    r.set_stream = reinterpret_cast<decltype(r.set_stream)>(symbol("cublasSetStream_v2"));
    r.set_atomics_mode = reinterpret_cast<decltype(r.set_atomics_mode)>(symbol("cublasSetAtomicsMode"));
    r.set_math_mode = reinterpret_cast<decltype(r.set_math_mode)>(symbol("cublasSetMathMode"));
    r.gemm = reinterpret_cast<decltype(r.gemm)>(symbol("cublasGemmStridedBatchedEx"));
    return r;
  }();
  return b;
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cuda: ") + what + " failed (cuBLAS status " + std::to_string(int(s)) + ")");
}

}  // namespace

void* create_blas(void* stream) {
  cublasHandle_t h = nullptr;
  check_blas(blas().create(&h), "cublasCreate");
  check_blas(blas().set_stream(h, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  // Results identical run to run: no split-K reductions by atomics.
  check_blas(blas().set_atomics_mode(h, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
  return h;
}

void gemm(void* handle, const Gemm& g) {
  cublasHandle_t h = static_cast<cublasHandle_t>(handle);
  const bool f64 = g.dtype == DType::f64;
  const cudaDataType_t type = f64 ? CUDA_R_64F : CUDA_R_32F;
  // f32: exact f32 products (no TF32) unless bf16 was asked for.
  cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F_PEDANTIC;
  if (!f64 && g.bf16) compute = CUBLAS_COMPUTE_32F_FAST_16BF;
  const double alpha64 = 1.0, beta64 = g.accumulate ? 1.0 : 0.0;
  const float alpha32 = 1.0f, beta32 = g.accumulate ? 1.0f : 0.0f;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  check_blas(blas().gemm(h, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, int(g.m),
                         int(g.n), int(g.k), alpha, g.a, type, int(g.lda), g.stride_a, g.b, type, int(g.ldb),
                         g.stride_b, beta, g.c, type, int(g.ldc), g.stride_c, int(g.batch), compute,
                         CUBLAS_GEMM_DEFAULT),
             "cublasGemmStridedBatchedEx");
}

void copy_to_device(void* dst, const void* src, size_t bytes, void* stream) {
  use_device();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)), "copy to device");
  // The host buffer may change as soon as this returns.
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "copy to device");
}
void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  use_device();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)), "copy to host");
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "copy to host");
}
void copy_device(void* dst, const void* src, size_t bytes, void* stream) {
  use_device();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)), "copy");
}
void fill_zero(void* dst, size_t bytes, void* stream) {
  use_device();
  check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream)), "memset");
}
void stream_synchronize(void* stream) {
  use_device();
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "synchronize");
}
void* host_allocate(size_t bytes) {
  use_device();
  void* p = nullptr;
  if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
    cudaGetLastError();
    throw Error("cuda: out of page-locked host memory allocating " + std::to_string(bytes) + " bytes");
  }
  return p;
}
void host_release(void* p) { cudaFreeHost(p); }
void* copy_to_host_queued(void* dst, const void* src, size_t bytes, void* stream) {
  use_device();
  const auto s = static_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), "copy to host");
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(e, s), "cudaEventRecord");
  return e;
}
void event_wait(void* event) {
  use_device();
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize");
}
void event_release(void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

void check_last_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + op + ": kernel launch failed: " + cudaGetErrorString(e));
}

}  // namespace nabla::cuda
