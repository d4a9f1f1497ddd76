// The node behind a Tensor handle. Internal: ops and the runtime use it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nabla/tensor.h"

namespace nabla {

struct OpDef;

// Parameters of an op (axes, eps, slice bounds...), interpreted by the op.
struct Attrs {
  std::vector<int64_t> ints;
  std::vector<double> reals;
  bool operator==(const Attrs&) const = default;
};

class Backend;
struct Node;

// The nodes one recompute() call built: in the backward they are computed
// again from the region's outside inputs, once the gradient reaches `output`.
struct RecomputeRegion {
  std::weak_ptr<Node> output;
};

// Memory owned by a leaf or an executor: aligned host memory, or a
// backend's own (src/backend/backend.h).
struct Buffer {
  // Host memory. huge_pages: ask the kernel for 2 MiB pages (Linux
  // transparent huge pages) when the buffer spans several; see Buffer::Buffer.
  explicit Buffer(size_t bytes, bool huge_pages = false);
  // Memory of `backend`: host memory (with huge pages) for a host-memory one.
  Buffer(const Backend& backend, size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data = nullptr;
  size_t bytes = 0;
  const Backend* device = nullptr;  // null: host memory

  // A host leaf's copy in the memory of a backend that runs it and keeps it
  // between runs (the executor's choice: parameters and what update ops
  // write), so a training step on a GPU sends them once and brings them back
  // only when the host reads them. Which copies hold the latest values:
  std::unique_ptr<Buffer> mirror;
  bool mirror_current = false;
  bool host_current = true;
  // Before the host reads `data`: the mirror's values, if newer.
  void sync_host();
  // Before the host writes `data` (or may): synced, then the mirror is stale.
  void host_writes() {
    sync_host();
    mirror_current = false;
  }
};

struct Node {
  const OpDef* op = nullptr;  // op_leaf for leaves
  std::vector<Tensor> inputs;
  Attrs attrs;

  DType dtype = DType::f32;
  Shape shape;
  // Layout in the storage of root(): compute nodes and leaves are contiguous
  // with offset 0; views may have any strides (0 for broadcast) and offset.
  Strides strides;
  int64_t offset = 0;

  std::shared_ptr<Buffer> buffer;  // leaves only
  bool is_param = false;
  std::string name;
  uint64_t id = 0;  // creation order, for stable sorting and names
  std::shared_ptr<const RecomputeRegion> region;  // set by recompute(): recomputed in the backward

  bool is_leaf() const;
  bool is_view() const;
  // The node that owns the memory this node's elements live in.
  const Node* root() const;
  int64_t numel() const { return nabla::numel(shape); }
};

uint64_t next_node_id();

// The tensor is its root's memory exactly, in the root's layout (a node, or
// a view such as a reshape or a transpose of a transpose): the planner lets
// an output of the same shape be written over it, and a reader may take it
// for the root's result.
bool covers_root(const Tensor& t);

}  // namespace nabla
