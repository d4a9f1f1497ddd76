// The CUDA backend (named "cuda" on a GPU, "cuda-emulated" under the
// emulator): memory through runtime.h, a program that launches each call's
// kernels on one stream, the error record kernels write and synchronize
// throws, and the kernel table the files' register_*_kernels() fill.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernel.h"
#include "backend/cuda/runtime.h"
#include "nabla/error.h"
#include "nabla/executor.h"

#if defined(NABLA_CUDA_EMULATED)
#include "backend/guarded_pages.h"
#endif

namespace nabla {
namespace NABLA_GPU {

namespace {

#if defined(NABLA_CUDA_EMULATED)
constexpr const char* kName = "cuda-emulated";
#else
constexpr const char* kName = "cuda";
#endif

KernelTable<Kernel>& kernels() {
  static KernelTable<Kernel> table(kName);
  return table;
}

}  // namespace

// The backend's memory now and at most (allocations and scratch).
struct Usage {
  std::atomic<size_t> now{0}, peak{0};
  void add(size_t bytes) {
    const size_t n = now += bytes;
    size_t p = peak.load();
    while (n > p && !peak.compare_exchange_weak(p, n)) {
    }
  }
  void remove(size_t bytes) { now -= bytes; }
};
Usage& usage() {
  static Usage u;
  return u;
}

// A program's scratch buffers, shared by its calls and kept from run to
// run: the k-th request of a call gets the k-th buffer, grown when a call
// asks for more. The calls run in order on one stream, so one call's
// kernels are done with a buffer before the next call's touch it; scratch
// costs the largest call's, not the sum of all (a QLoRA step dequantizes
// every frozen weight into it in turn).
struct ScratchList {
  struct Piece {
    void* data = nullptr;
    size_t bytes = 0;
  };
  std::vector<Piece> pieces;
  size_t next = 0;
  ~ScratchList() {
    for (Piece& p : pieces) {
      if (!p.data) continue;
      scratch_release(p.data);
      usage().remove(p.bytes);
    }
  }
};

void* scratch(const Context& ctx, size_t bytes) {
  ScratchList& s = *ctx.scratch;
  if (s.next == s.pieces.size()) s.pieces.emplace_back();
  ScratchList::Piece& p = s.pieces[s.next++];
  if (p.bytes < bytes) {
    if (p.data) {
      scratch_release(p.data);
      usage().remove(p.bytes);
    }
    p.data = nullptr;
    p.bytes = 0;
    p.data = scratch_allocate(bytes);
    p.bytes = bytes;
    usage().add(bytes);
  }
  return p.data;
}

void check_launch(const Context& ctx) { check_last_launch(ctx.op); }

View make_view(const TensorView& v) {
  if (v.shape.size() > size_t(kMaxRank)) {
    throw ShapeError(std::string(kName) + ": a view of rank " + std::to_string(v.shape.size()) + " (at most " +
                     std::to_string(kMaxRank) + ")");
  }
  View d{};
  d.data = v.data;
  d.dtype = v.dtype;
  d.rank = int32_t(v.shape.size());
  for (size_t a = 0; a < v.shape.size(); ++a) {
    d.shape[a] = v.shape[a];
    d.strides[a] = v.strides[a];
  }
  return d;
}

View broadcast_view(const TensorView& v, const Shape& to) {
  View d = make_view(v);
  const size_t r = to.size(), skip = r - v.shape.size();
  d.rank = int32_t(r);
  for (size_t a = 0; a < r; ++a) {
    d.shape[a] = to[a];
    d.strides[a] = a < skip || v.shape[a - skip] == 1 ? 0 : v.strides[a - skip];
  }
  return d;
}

void coalesce(View* const* views, int count) {
  if (count == 0) return;
  const int rank = views[0]->rank;
  int kept = 0;
  for (int d = 0; d < rank; ++d) {
    if (views[0]->shape[d] == 1) continue;
    bool merge = kept > 0;
    for (int k = 0; k < count && merge; ++k) {
      const View& v = *views[k];
      merge = v.strides[kept - 1] == v.strides[d] * v.shape[d];
    }
    for (int k = 0; k < count; ++k) {
      View& v = *views[k];
      if (merge) {
        v.shape[kept - 1] *= v.shape[d];
        v.strides[kept - 1] = v.strides[d];
      } else {
        v.shape[kept] = v.shape[d];
        v.strides[kept] = v.strides[d];
      }
    }
    if (!merge) ++kept;
  }
  for (int k = 0; k < count; ++k) views[k]->rank = kept;
}

View flat_view(const TensorView& v) {
  View d = make_view(v);
  View* views[] = {&d};
  coalesce(views, 1);
  return d;
}

Rows rows_of(const TensorView& v) {
  Rows r{make_view(v), v.shape.empty() ? 1 : v.strides.back(), v.shape.empty() ? 1 : v.shape.back(), 1};
  if (!v.shape.empty()) r.rows.rank -= 1;
  for (int d = 0; d < r.rows.rank; ++d) r.count *= r.rows.shape[d];
  return r;
}

void register_kernel(const OpDef& op, Kernel kernel) { kernels().add(op, kernel); }
Kernel kernel_of(const OpDef& op) { return kernels().find(op); }

namespace {

class GpuProgram : public Program {
 public:
  GpuProgram(std::vector<KernelCall> calls, const ExecOptions& options, void* stream, void* blas, DeviceError* error)
      : calls_(calls.size()) {
    for (size_t i = 0; i < calls.size(); ++i) {
      Call& c = calls_[i];
      c.kernel = kernel_of(*calls[i].op);
      c.operands = std::move(calls[i].operands);
      c.context = {stream, blas, error, calls[i].op->name, options.bf16_matmul, &scratch_};
    }
  }
  void run(size_t i) override {
    Call& c = calls_[i];
    scratch_.next = 0;
    use_device();  // the thread running the graph may not be the one that made it
#if defined(NABLA_CUDA_EMULATED)
    std::vector<const void*> touched{c.operands.out.data};
    for (const TensorView& v : c.operands.in) touched.push_back(v.data);
    guarded_pages::Open open(touched);
#endif
    c.kernel(c.operands, c.context);
  }

 private:
  struct Call {
    Kernel kernel = nullptr;
    Operands operands;
    Context context;
  };
  ScratchList scratch_;
  std::vector<Call> calls_;
};

// A fence on the stream: an event recorded there.
class EventFence : public Fence {
 public:
  explicit EventFence(void* event) : event_(event) {}
  ~EventFence() override { event_release(event_); }
  void wait() override { event_wait(event_); }

 private:
  void* event_;
};

class GpuBackend : public Backend {
 public:
  GpuBackend() {
    register_elementwise_kernels();
    register_reduction_kernels();
    register_layout_kernels();
    register_indexing_kernels();
    register_matmul_kernels();
    register_image_kernels();
    register_random_kernels();
    register_optimizer_kernels();
    register_factored_kernels();
    register_norm_kernels();
    register_softmax_kernels();
    register_attention_kernels();
  }
  const char* name() const override { return kName; }
  std::string unavailable() const override { return NABLA_GPU::unavailable(); }
  bool supports(DType) const override { return true; }
  // Products round their operands to bf16 (cuBLAS's tensor cores); attention
  // stays f32.
  bool has_bf16_matmul() const override { return true; }
  bool host_memory() const override { return false; }
  void* allocate(size_t bytes) const override {
    void* p = device_allocate(bytes);
    usage().add(bytes);
    return p;
  }
  void release(void* data, size_t bytes) const override {
    device_release(data);
    usage().remove(bytes);
  }
  size_t peak_bytes() const override { return usage().peak.load(); }
  void copy_in(void* dst, const void* src, size_t bytes) const override {
    copy_to_device(dst, src, bytes, device().stream);
  }
  void copy_out(void* dst, const void* src, size_t bytes) const override {
    copy_to_host(dst, src, bytes, device().stream);
  }
  void copy(void* dst, const void* src, size_t bytes) const override { copy_device(dst, src, bytes, device().stream); }
  void* allocate_host(size_t bytes) const override {
    device();
    return host_allocate(bytes);
  }
  void release_host(void* host) const override { host_release(host); }
  std::unique_ptr<Fence> copy_out_queued(void* host_dst, const void* src, size_t bytes) const override {
    return std::make_unique<EventFence>(copy_to_host_queued(host_dst, src, bytes, device().stream));
  }
  void synchronize() const override {
    const Device& d = device();
    stream_synchronize(d.stream);
    DeviceError e{};
    copy_to_host(&e, d.error, sizeof e, d.stream);
    if (e.code == kNoError) return;
    fill_zero(d.error, sizeof e, d.stream);
    const std::string op = e.op ? e.op : "?";
    if (e.code == kLabelOutOfRange) {
      throw ShapeError(op + ": label " + std::to_string(e.value) + " at row " + std::to_string(e.position) +
                       " is out of range for " + std::to_string(e.limit) + " classes (ignore_index is " +
                       std::to_string(e.extra) + ")");
    }
    if (e.code == kIndexOutOfRange) {
      throw ShapeError(op + ": index " + std::to_string(e.value) + " at position " + std::to_string(e.position) +
                       " is out of range for " + std::to_string(e.limit) + " rows");
    }
    throw UsageError(op + ": " + hyper_message(e.value));
  }
  bool has_kernel(const OpDef& op) const override { return kernel_of(op) != nullptr; }
  std::unique_ptr<Program> compile(std::vector<KernelCall> calls, const ExecOptions& options) const override {
    const Device& d = device();
    return std::make_unique<GpuProgram>(std::move(calls), options, d.stream, d.blas, d.error);
  }

 private:
  // The stream, cuBLAS handle and error record, made on first use (a build
  // with CUDA on a machine without a GPU never touches the runtime).
  struct Device {
    void* stream = nullptr;
    void* blas = nullptr;
    DeviceError* error = nullptr;
  };
  const Device& device() const {
    std::call_once(once_, [&] {
      const std::string why = NABLA_GPU::unavailable();
      if (!why.empty()) throw UsageError(std::string(kName) + ": " + why);
      device_.stream = create_stream();
      device_.blas = create_blas(device_.stream);
      device_.error = static_cast<DeviceError*>(scratch_allocate(sizeof(DeviceError)));
      fill_zero(device_.error, sizeof(DeviceError), device_.stream);
      stream_synchronize(device_.stream);
    });
    return device_;
  }
  // The message of a kBadHyper error: the CPU kernels' words.
  static std::string hyper_message(int64_t which) {
    switch (which) {
      case kBadLearningRate: return "learning rate must be finite and >= 0";
      case kBadStep: return "step must be 1, 2, ...";
      case kBadWeightDecay: return "weight decay must be finite and >= 0";
      default: return "lr and weight decay must be finite and >= 0, momentum finite";
    }
  }
  mutable std::once_flag once_;
  mutable Device device_;
};

}  // namespace
}  // namespace NABLA_GPU

#if defined(NABLA_CUDA_EMULATED)
const Backend& cuda_emulated_backend() {
#else
const Backend& cuda_backend() {
#endif
  static const NABLA_GPU::GpuBackend backend;
  return backend;
}

}  // namespace nabla
