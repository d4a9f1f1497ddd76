#include "nabla/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "core/node.h"
#include "core/op.h"
#include "nabla/error.h"

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace nabla {

namespace {

// Leaves have no kernel: their memory is filled by the caller.
Meta infer_leaf(const std::vector<Tensor>&, const Attrs&) {
  throw UsageError("leaf: leaves are created with Tensor::from_data, not applied");
}

}  // namespace

const OpDef op_leaf{
    .name = "leaf",
    .summary = "A constant, input or parameter: host memory owned by the tensor.",
    .inputs = {},
    .infer = infer_leaf,
};

namespace {

void* host_allocate(size_t n, bool huge_pages) {
  // 64-byte alignment suits every SIMD width; never a null pointer, even for 0 bytes.
  size_t alignment = 64;
#ifdef __linux__
  // A training step streams its whole arena, far more 4 KiB pages than the TLB
  // holds: 2 MiB pages where the system grants them on request
  // (transparent_hugepage "madvise"; docs/performance.md). Only for buffers of
  // several huge pages: the last one is rounded up whole.
  constexpr size_t kHugePage = size_t{2} << 20;
  if (huge_pages && n >= 4 * kHugePage) alignment = kHugePage;
#else
  (void)huge_pages;
#endif
  const size_t rounded = n == 0 ? alignment : (n + alignment - 1) / alignment * alignment;
  void* data = std::aligned_alloc(alignment, rounded);
  if (!data) throw Error("out of memory allocating " + std::to_string(n) + " bytes");
#ifdef __linux__
  // Advice only: where huge pages are off or unavailable, the buffer is as usual.
  if (alignment > 64) madvise(data, rounded, MADV_HUGEPAGE);
#endif
  return data;
}

}  // namespace

Buffer::Buffer(size_t n, bool huge_pages) : data(host_allocate(n, huge_pages)), bytes(n) {}

Buffer::Buffer(const Backend& backend, size_t n) : bytes(n), device(backend.host_memory() ? nullptr : &backend) {
  data = device ? device->allocate(n) : host_allocate(n, /*huge_pages=*/true);
}

void Buffer::sync_host() {
  if (host_current) return;
  if (mirror && mirror_current) mirror->device->copy_out(data, mirror->data, bytes);
  host_current = true;
}

Buffer::~Buffer() {
  if (device) {
    device->release(data, bytes);
  } else {
    std::free(data);
  }
}

bool Node::is_leaf() const { return op == &op_leaf; }
bool Node::is_view() const { return op->is_view; }
const Node* Node::root() const {
  const Node* n = this;
  while (n->op->is_view) n = n->inputs[0].node();
  return n;
}

bool covers_root(const Tensor& t) {
  const Node* n = t.node();
  return !n->is_view() || (t.offset() == 0 && t.is_contiguous() && t.numel() == n->root()->numel());
}

uint64_t next_node_id() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

namespace {

// A leaf node of dtype and shape holding `buffer`.
Tensor leaf_of(DType dtype, Shape shape, std::shared_ptr<Buffer> buffer) {
  auto node = std::make_shared<Node>();
  node->op = &op_leaf;
  node->dtype = dtype;
  node->strides = contiguous_strides(shape);
  node->shape = std::move(shape);
  node->id = next_node_id();
  node->buffer = std::move(buffer);
  return Tensor(std::move(node));
}

}  // namespace

Tensor Tensor::empty(DType dtype, Shape shape) {
  check_shape(shape, dtype_size(dtype), "tensor");
  const size_t bytes = static_cast<size_t>(nabla::numel(shape)) * dtype_size(dtype);
  return leaf_of(dtype, std::move(shape), std::make_shared<Buffer>(bytes));
}

Tensor Tensor::from_data(DType dtype, Shape shape, const void* data) {
  Tensor t = empty(dtype, std::move(shape));
  Buffer& b = *t.node()->buffer;
  if (data) {
    std::memcpy(b.data, data, b.bytes);
  } else {
    std::memset(b.data, 0, b.bytes);
  }
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) { return from_data(dtype, std::move(shape), nullptr); }

Tensor Tensor::full(DType dtype, Shape shape, double value) {
  Tensor t = zeros(dtype, std::move(shape));
  int64_t n = t.numel();
  switch (dtype) {
    case DType::f32: std::fill_n(static_cast<float*>(t.data()), n, static_cast<float>(value)); break;
    case DType::f64: std::fill_n(static_cast<double*>(t.data()), n, value); break;
    case DType::i32: std::fill_n(static_cast<int32_t*>(t.data()), n, static_cast<int32_t>(value)); break;
    case DType::u8: std::fill_n(static_cast<uint8_t*>(t.data()), n, static_cast<uint8_t>(value)); break;
  }
  return t;
}

Tensor Tensor::scalar(double value, DType dtype) { return full(dtype, {}, value); }

void Tensor::check_leaf_size(const Shape& shape, size_t count) {
  if (static_cast<int64_t>(count) != nabla::numel(shape)) {
    throw ShapeError("tensor: shape " + to_string(shape) + " needs " + std::to_string(nabla::numel(shape)) +
                     " values, got " + std::to_string(count));
  }
}

static Node& deref(const Tensor& t) {
  if (!t.defined()) throw UsageError("tensor: use of an undefined (empty) tensor");
  return *t.node();
}

DType Tensor::dtype() const { return deref(*this).dtype; }
const Shape& Tensor::shape() const { return deref(*this).shape; }
int Tensor::rank() const { return static_cast<int>(shape().size()); }
int64_t Tensor::numel() const { return nabla::numel(shape()); }
int64_t Tensor::dim(int64_t axis) const { return shape()[normalize_axis(axis, rank(), "dim")]; }
const Strides& Tensor::strides() const { return deref(*this).strides; }
int64_t Tensor::offset() const { return deref(*this).offset; }
bool Tensor::is_contiguous() const {
  const Node& n = deref(*this);
  // Strides of size-1 dimensions do not matter.
  int64_t expect = 1;
  for (size_t i = n.shape.size(); i-- > 0;) {
    if (n.shape[i] != 1 && n.strides[i] != expect) return false;
    expect *= n.shape[i];
  }
  return true;
}
bool Tensor::is_leaf() const { return deref(*this).is_leaf(); }
bool Tensor::is_view() const { return deref(*this).is_view(); }
const char* Tensor::op_name() const { return deref(*this).op->name; }
const std::string& Tensor::name() const { return deref(*this).name; }
Tensor& Tensor::set_name(std::string name) {
  deref(*this).name = std::move(name);
  return *this;
}

Tensor& Tensor::requires_grad(bool on) {
  Node& n = deref(*this);
  if (!n.is_leaf()) {
    throw UsageError("requires_grad: only leaves can be parameters; got the result of '" +
                     std::string(n.op->name) + "'");
  }
  if (on && !is_floating(n.dtype)) {
    throw DTypeError(std::string("requires_grad: parameters must be f32 or f64, got ") + dtype_name(n.dtype));
  }
  n.is_param = on;
  return *this;
}
bool Tensor::is_parameter() const { return deref(*this).is_param; }

static Node& leaf(const Tensor& t, const char* what) {
  Node& n = deref(t);
  if (!n.is_leaf()) {
    throw UsageError(std::string("tensor: ") + what + " is for leaves; '" + n.op->name +
                     "' results are read through an Executor");
  }
  return n;
}

namespace {

// The host memory of a leaf on the host; UsageError for one on a backend.
Buffer& host_buffer(const Tensor& t, Node& n) {
  if (n.buffer->device) {
    throw UsageError("tensor: data() of a " + to_string(t) + " on '" + n.buffer->device->name() +
                     "', whose memory is that backend's: copy it with to(\"cpu\") or to_vector()");
  }
  return *n.buffer;
}

}  // namespace

// The caller may write: the backend's mirror, if any, is stale from now on.
void* Tensor::data() {
  Buffer& b = host_buffer(*this, leaf(*this, "data()"));
  b.host_writes();
  return b.data;
}

const void* Tensor::data() const {
  Buffer& b = host_buffer(*this, leaf(*this, "data()"));
  b.sync_host();
  return b.data;
}

std::string Tensor::device() const {
  const Node& n = leaf(*this, "device()");
  return n.buffer->device ? n.buffer->device->name() : "cpu";
}

void Tensor::copy_to(void* dst, size_t bytes) const {
  const Node& n = leaf(*this, "copy_to()");
  if (bytes != n.buffer->bytes) {
    throw ShapeError("tensor: copy of a " + to_string(*this) + " leaf of " + std::to_string(n.buffer->bytes) +
                     " bytes into " + std::to_string(bytes));
  }
  if (n.buffer->device) {
    n.buffer->device->copy_out(dst, n.buffer->data, bytes);
  } else {
    n.buffer->sync_host();
    std::memcpy(dst, n.buffer->data, bytes);
  }
}

Tensor Tensor::to(const std::string& device) const {
  const Node& n = leaf(*this, "to()");
  const Backend& target = find_backend(device);
  const size_t bytes = n.buffer->bytes;
  Tensor out = leaf_of(n.dtype, n.shape,
                       target.host_memory() ? std::make_shared<Buffer>(bytes) : std::make_shared<Buffer>(target, bytes));
  if (!n.buffer->device && !out.node()->buffer->device) {
    n.buffer->sync_host();
    std::memcpy(out.node()->buffer->data, n.buffer->data, bytes);
  } else {
    std::vector<char> host(bytes);
    copy_to(host.data(), bytes);
    out.copy_from(host.data(), bytes);
  }
  out.node()->name = n.name;
  out.node()->is_param = n.is_param;
  return out;
}


void Tensor::copy_from(const void* src, size_t bytes) {
  Node& n = leaf(*this, "copy_from()");
  size_t have = n.buffer->bytes;
  if (bytes != have) {
    throw ShapeError("tensor: copy of " + std::to_string(bytes) + " bytes into a " + to_string(*this) +
                     " leaf of " + std::to_string(have) + " bytes");
  }
  if (n.buffer->device) {
    n.buffer->device->copy_in(n.buffer->data, src, bytes);
  } else {
    n.buffer->host_writes();
    std::memcpy(n.buffer->data, src, bytes);
  }
}

void Tensor::check_dtype(DType expected) const {
  if (dtype() != expected) {
    throw DTypeError(std::string("tensor: expected ") + dtype_name(expected) + ", got " +
                     dtype_name(dtype()));
  }
}

double Tensor::item(int64_t flat) const {
  if (flat < 0 || flat >= numel()) {
    throw ShapeError("item: index " + std::to_string(flat) + " out of range for " + to_string(*this));
  }
  if (deref(*this).is_leaf() && node()->buffer->device) return to("cpu").item(flat);
  const void* p = data();
  switch (dtype()) {
    case DType::f32: return static_cast<const float*>(p)[flat];
    case DType::f64: return static_cast<const double*>(p)[flat];
    case DType::i32: return static_cast<const int32_t*>(p)[flat];
    case DType::u8: return static_cast<const uint8_t*>(p)[flat];
  }
  return 0;
}

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return std::string(dtype_name(t.dtype())) + to_string(t.shape()) + " (" + t.op_name() + ")";
}

// ---- Building nodes.

Tensor apply(const OpDef& op, std::vector<Tensor> inputs, Attrs attrs) {
  size_t want = op.inputs.size();
  bool count_ok = op.variadic ? inputs.size() >= want : inputs.size() == want;
  if (!count_ok) {
    throw UsageError(std::string(op.name) + ": expected " + (op.variadic ? "at least " : "") +
                     std::to_string(want) + " inputs, got " + std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      throw UsageError(std::string(op.name) + ": input '" + op.input(i).name + "' is an undefined tensor");
    }
  }
  Meta meta = op.infer(inputs, attrs);
  check_shape(meta.shape, dtype_size(meta.dtype), op.name);
  if (op.fused && op.composite && CompositeMode::active()) return op.composite(inputs, attrs);
  auto node = std::make_shared<Node>();
  node->op = &op;
  node->dtype = meta.dtype;
  node->shape = std::move(meta.shape);
  if (op.is_view) {
    node->strides = std::move(meta.strides);
    node->offset = meta.offset;
  } else {
    node->strides = contiguous_strides(node->shape);
  }
  node->inputs = std::move(inputs);
  node->attrs = std::move(attrs);
  node->id = next_node_id();
  return Tensor(std::move(node));
}

namespace {
thread_local bool composite_mode = false;
}
CompositeMode::CompositeMode() : previous_(composite_mode) { composite_mode = true; }
CompositeMode::~CompositeMode() { composite_mode = previous_; }
bool CompositeMode::active() { return composite_mode; }

void require_floating(const char* op, const Tensor& t, const char* what) {
  if (!is_floating(t.dtype())) {
    throw DTypeError(std::string(op) + ": " + what + " must be f32 or f64, got " + dtype_name(t.dtype()));
  }
}

void require_f64(const char* op, const Tensor& t, const char* what, const char* expected, bool shape_ok) {
  if (t.dtype() != DType::f64 || !shape_ok) {
    const std::string message = std::string(op) + ": " + what + " must be f64 " + expected + ", got " + to_string(t);
    if (t.dtype() != DType::f64) throw DTypeError(message);
    throw ShapeError(message);
  }
}

void require_f32_like_first(const char* op, const std::vector<Tensor>& in, std::initializer_list<const char*> names) {
  size_t i = 0;
  for (const char* name : names) {
    const Tensor& t = in[i++];
    if (t.dtype() != DType::f32) {
      throw DTypeError(std::string(op) + ": " + name + " must be f32, got " + dtype_name(t.dtype()));
    }
    if (t.shape() != in[0].shape()) {
      throw ShapeError(std::string(op) + ": " + name + " is " + to_string(t.shape()) + ", " + *names.begin() +
                       " is " + to_string(in[0].shape()));
    }
  }
}

void require_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    throw DTypeError(std::string(op) + ": operand dtypes differ: " + dtype_name(a.dtype()) + " and " +
                     dtype_name(b.dtype()));
  }
}

}  // namespace nabla
