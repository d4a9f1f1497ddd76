// The reference backend: a plain implementation of every primitive op
// (src/backend/reference/*.cpp), no fusion rewrite, and memory of its own:
// guarded pages (src/backend/guarded_pages.h), so a code path that reads or
// writes a tensor's device memory directly, as if it were the host's,
// faults in tests instead of passing by luck, as it would fail on a GPU.
#include <cstring>

#include "backend/backend.h"
#include "backend/guarded_pages.h"
#include "backend/reference/kernel.h"
#include "nabla/error.h"
#include "nabla/executor.h"

namespace nabla {
namespace reference {

namespace {

KernelTable<Kernel>& kernels() {
  static KernelTable<Kernel> table("reference");
  return table;
}

class ReferenceProgram : public Program {
 public:
  explicit ReferenceProgram(std::vector<KernelCall> calls) : calls_(std::move(calls)) {}
  void run(size_t i) override {
    const KernelCall& c = calls_[i];
    std::vector<const void*> touched{c.operands.out.data};
    for (const TensorView& v : c.operands.in) touched.push_back(v.data);
    guarded_pages::Open open(touched);
    kernel_of(*c.op)(c.operands);
  }

 private:
  std::vector<KernelCall> calls_;
};

class ReferenceBackend : public Backend {
 public:
  ReferenceBackend() {
    register_elementwise_kernels();
    register_reduction_kernels();
    register_layout_kernels();
    register_indexing_kernels();
    register_matmul_kernels();
    register_image_kernels();
    register_random_kernels();
    register_optimizer_kernels();
  }
  const char* name() const override { return "reference"; }
  bool supports(DType) const override { return true; }
  bool has_bf16_matmul() const override { return false; }
  bool host_memory() const override { return false; }
  void* allocate(size_t bytes) const override { return guarded_pages::allocate(bytes, "reference"); }
  void release(void* data, size_t) const override { guarded_pages::release(data); }
  void copy_in(void* dst, const void* src, size_t bytes) const override {
    guarded_pages::Open open({dst});
    std::memcpy(dst, src, bytes);
  }
  void copy_out(void* dst, const void* src, size_t bytes) const override {
    guarded_pages::Open open({src});
    std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    guarded_pages::Open open({dst, src});
    std::memmove(dst, src, bytes);
  }
  bool has_kernel(const OpDef& op) const override { return kernel_of(op) != nullptr; }
  std::unique_ptr<Program> compile(std::vector<KernelCall> calls, const ExecOptions&) const override {
    return std::make_unique<ReferenceProgram>(std::move(calls));
  }
};

}  // namespace

void register_kernel(const OpDef& op, Kernel kernel) { kernels().add(op, kernel); }
Kernel kernel_of(const OpDef& op) { return kernels().find(op); }

int64_t offset_of(const TensorView& v, const Index& idx) {
  int64_t at = 0;
  for (size_t a = 0; a < idx.size(); ++a) at += idx[a] * v.strides[a];
  return at;
}

double get_at(const TensorView& v, int64_t at) {
  switch (v.dtype) {
    case DType::f32: return static_cast<const float*>(v.data)[at];
    case DType::f64: return static_cast<const double*>(v.data)[at];
    case DType::i32: return static_cast<const int32_t*>(v.data)[at];
    case DType::u8: return static_cast<const uint8_t*>(v.data)[at];
  }
  return 0;
}

void set_at(const TensorView& v, int64_t at, double x) {
  switch (v.dtype) {
    case DType::f32: static_cast<float*>(v.data)[at] = static_cast<float>(x); return;
    case DType::f64: static_cast<double*>(v.data)[at] = x; return;
    case DType::i32: static_cast<int32_t*>(v.data)[at] = static_cast<int32_t>(x); return;
    case DType::u8: static_cast<uint8_t*>(v.data)[at] = static_cast<uint8_t>(x); return;
  }
}

double get(const TensorView& v, const Index& idx) { return get_at(v, offset_of(v, idx)); }
void set(const TensorView& v, const Index& idx, double x) { set_at(v, offset_of(v, idx), x); }

Index broadcast_index(const TensorView& v, const Index& out_idx) {
  const size_t r = v.shape.size(), skip = out_idx.size() - r;
  Index idx(r);
  for (size_t a = 0; a < r; ++a) idx[a] = v.shape[a] == 1 ? 0 : out_idx[skip + a];
  return idx;
}

}  // namespace reference

const Backend& reference_backend() {
  static const reference::ReferenceBackend backend;
  return backend;
}

}  // namespace nabla
