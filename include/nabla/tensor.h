// Tensor: a handle to one node of a define-then-run graph.
//
// Building an expression (`a + b`, `matmul(x, w)`) only records a node with
// its op, inputs, dtype and shape; nothing is computed until an Executor runs
// a Graph. Leaves (constants, inputs, parameters) own host memory that the
// caller may rewrite between runs; every other node's memory is planned.
// Views (reshape, permute, slice, expand) share their base's memory through
// strides and an offset.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "nabla/dtype.h"
#include "nabla/shape.h"

namespace nabla {

struct Node;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<Node> node) : node_(std::move(node)) {}

  // ---- Leaves: host memory owned by the tensor, copied in on creation.
  static Tensor from_data(DType dtype, Shape shape, const void* data);
  template <class T>
  static Tensor from_vector(Shape shape, const std::vector<T>& values) {
    check_leaf_size(shape, values.size());
    return from_data(dtype_of<T>(), std::move(shape), values.data());
  }
  static Tensor zeros(DType dtype, Shape shape);
  // A leaf whose values are unspecified until written: nothing touches its
  // pages, so a large one costs no resident memory until it is written (a
  // placeholder about to be replaced, a buffer read into whole).
  static Tensor empty(DType dtype, Shape shape);
  static Tensor full(DType dtype, Shape shape, double value);
  static Tensor scalar(double value, DType dtype = DType::f32);

  bool defined() const { return node_ != nullptr; }
  DType dtype() const;
  const Shape& shape() const;
  int rank() const;
  int64_t numel() const;
  // Size of one axis; negative axes count from the end.
  int64_t dim(int64_t axis) const;
  const Strides& strides() const;
  int64_t offset() const;
  bool is_contiguous() const;
  bool is_leaf() const;
  bool is_view() const;
  const char* op_name() const;
  const std::string& name() const;
  Tensor& set_name(std::string name);

  // Marks a leaf as a parameter: backward() produces its gradient.
  Tensor& requires_grad(bool on = true);
  bool is_parameter() const;

  // ---- Leaf memory (leaves only; UsageError otherwise). Contiguous host
  // memory of a leaf on the host.
  void* data();
  const void* data() const;
  template <class T>
  T* data_as() {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(data());
  }
  void copy_from(const void* src, size_t bytes);
  template <class T>
  void assign(const std::vector<T>& values) {
    check_dtype(dtype_of<T>());
    copy_from(values.data(), values.size() * sizeof(T));
  }
  // A host copy of the leaf's values, wherever they live.
  void copy_to(void* dst, size_t bytes) const;
  template <class T>
  std::vector<T> to_vector() const {
    check_dtype(dtype_of<T>());
    std::vector<T> out(static_cast<size_t>(numel()));
    copy_to(out.data(), out.size() * sizeof(T));
    return out;
  }
  // ---- Devices. A leaf lives in host memory ("cpu") unless moved to a
  // backend with memory of its own ("reference"); data() of such a leaf is
  // a UsageError: its values are read through copies (to_vector, copy_to,
  // to("cpu")) and written through copy_from/assign.
  std::string device() const;
  // A new leaf with the same values (name, parameter flag) on `device`.
  Tensor to(const std::string& device) const;
  // Reads element `flat` (row-major position) of a leaf as double.
  double item(int64_t flat = 0) const;

  Node* node() const { return node_.get(); }
  const std::shared_ptr<Node>& node_ptr() const { return node_; }
  bool same(const Tensor& other) const { return node_ == other.node_; }

 private:
  static void check_leaf_size(const Shape& shape, size_t count);
  void check_dtype(DType expected) const;
  std::shared_ptr<Node> node_;
};

std::string to_string(const Tensor& t);  // "f32[4, 5] (matmul)"

}  // namespace nabla
