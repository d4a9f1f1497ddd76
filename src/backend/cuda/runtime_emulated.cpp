// The CUDA backend's runtime under the emulator (runtime.h): device memory
// is guarded host pages (opened while a kernel or copy uses them), the
// stream runs everything at once, and cuBLAS's gemm is a loop that follows
// its definition.
#define NABLA_CUDA_EMULATED 1
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "backend/cuda/runtime.h"
#include "backend/guarded_pages.h"
#include "nabla/error.h"

namespace nabla::cuda_emulated {

std::string unavailable() { return ""; }
void use_device() {}
std::string device_description() { return "the CUDA emulator (host threads as CUDA threads)"; }

size_t max_shared_bytes() { return cuda_emulator::kMaxSharedBytes; }

void* device_allocate(size_t bytes) { return guarded_pages::allocate(bytes, "cuda-emulated"); }
void device_release(void* p) { guarded_pages::release(p); }
void* scratch_allocate(size_t bytes) {
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p) throw Error("cuda-emulated: out of memory allocating " + std::to_string(bytes) + " bytes of scratch");
  return p;
}
void scratch_release(void* p) { std::free(p); }

void* create_stream() { return nullptr; }
void* create_blas(void*) { return nullptr; }
namespace {
// Opens what is guarded (the executor's memory); scratch is plain memory.
std::vector<const void*> guarded(std::initializer_list<const void*> pointers) {
  std::vector<const void*> v;
  for (const void* p : pointers) {
    if (guarded_pages::contains(p)) v.push_back(p);
  }
  return v;
}
}  // namespace

void copy_to_device(void* dst, const void* src, size_t bytes, void*) {
  guarded_pages::Open open(guarded({dst}));
  std::memcpy(dst, src, bytes);
}
void copy_to_host(void* dst, const void* src, size_t bytes, void*) {
  guarded_pages::Open open(guarded({src}));
  std::memcpy(dst, src, bytes);
}
// The stream has run everything by the time anything is queued.
void* host_allocate(size_t bytes) { return scratch_allocate(bytes); }
void host_release(void* p) { scratch_release(p); }
void* copy_to_host_queued(void* dst, const void* src, size_t bytes, void* stream) {
  copy_to_host(dst, src, bytes, stream);
  return nullptr;
}
void event_wait(void*) {}
void event_release(void*) {}
void copy_device(void* dst, const void* src, size_t bytes, void*) {
  guarded_pages::Open open(guarded({dst, src}));
  std::memmove(dst, src, bytes);
}
void fill_zero(void* dst, size_t bytes, void*) {
  guarded_pages::Open open(guarded({dst}));
  std::memset(dst, 0, bytes);
}
namespace {
template <class T>
void gemm_as(const Gemm& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  for (int64_t batch = 0; batch < g.batch; ++batch) {
    for (int64_t j = 0; j < g.n; ++j) {
      for (int64_t i = 0; i < g.m; ++i) {
        T acc = T(0);
        for (int64_t k = 0; k < g.k; ++k) {
          T x = g.trans_a ? a[k + i * g.lda] : a[i + k * g.lda];
          T y = g.trans_b ? b[j + k * g.ldb] : b[k + j * g.ldb];
          if (g.bf16) {
            x = round_bf16(x);
            y = round_bf16(y);
          }
          acc += x * y;
        }
        T& out = c[i + j * g.ldc];
        out = g.accumulate ? out + acc : acc;
      }
    }
    a += g.stride_a;
    b += g.stride_b;
    c += g.stride_c;
  }
}
}  // namespace

void gemm(void*, const Gemm& g) {
  // cuBLAS's CUBLAS_STATUS_INVALID_VALUE cases.
  const auto at_least = [](int64_t ld, int64_t rows) { return ld >= (rows > 1 ? rows : 1); };
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0 || !at_least(g.lda, g.trans_a ? g.k : g.m) ||
      !at_least(g.ldb, g.trans_b ? g.n : g.k) || !at_least(g.ldc, g.m)) {
    throw Error("cuda-emulated: cublasGemmStridedBatchedEx failed (cuBLAS status 7: invalid value): m " +
                std::to_string(g.m) + ", n " + std::to_string(g.n) + ", k " + std::to_string(g.k) + ", lda " +
                std::to_string(g.lda) + ", ldb " + std::to_string(g.ldb) + ", ldc " + std::to_string(g.ldc));
  }
  if (g.dtype == DType::f64) gemm_as<double>(g);
  else gemm_as<float>(g);
}

void stream_synchronize(void*) {}
void check_last_launch(const char*) {}

}  // namespace nabla::cuda_emulated
