// The CUDA backend's runtime under the emulator (runtime.h): device memory
// is guarded host pages (opened while a kernel or copy uses them), the
// stream runs everything at once, and there is no cuBLAS (matmul.cu has
// kernels of its own for the emulator).
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
void copy_device(void* dst, const void* src, size_t bytes, void*) {
  guarded_pages::Open open(guarded({dst, src}));
  std::memmove(dst, src, bytes);
}
void fill_zero(void* dst, size_t bytes, void*) {
  guarded_pages::Open open(guarded({dst}));
  std::memset(dst, 0, bytes);
}
void stream_synchronize(void*) {}
void check_last_launch(const char*) {}

}  // namespace nabla::cuda_emulated
