// OpDef: what an op means, on every backend: its inputs, shape rule, backward
// rule, composite and gradient cases. Each src/ops/<name>.cpp defines one (or
// a small family of) OpDef and lists it in src/ops/op_list.h; kernels
// register per backend (the CPU's beside the op: src/backend/cpu/kernel.h).
//
// An op must say, for every input, whether it is differentiated (and then
// provide `backward`) or not. There is no other way to define an input, and
// the registry test rejects an op without gradient cases or a strided case.
#pragma once

#include <functional>
#include <string>
#include <initializer_list>
#include <vector>

#include "core/node.h"
#include "nabla/error.h"
#include "nabla/ops.h"

namespace nabla {

enum class Diff : uint8_t { yes, no };

// Both fields are required: an input cannot be left undeclared.
struct InputSpec {
  constexpr InputSpec(const char* name, Diff diff) : name(name), diff(diff) {}
  const char* name;
  Diff diff;
};

// The result of a shape rule. strides/offset are set by view ops only (in the
// root's storage); compute ops leave them empty and get a contiguous output.
struct Meta {
  DType dtype;
  Shape shape;
  Strides strides;
  int64_t offset = 0;
};

// What a kernel sees of one operand: any strides, including 0 and negative
// never (slices with step > 0 only).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  Strides strides;
  bool contiguous = false;
  int64_t numel() const { return nabla::numel(shape); }
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// A kernel's operands on any backend: views of its inputs and its output in
// that backend's memory, and the op's attributes.
struct Operands {
  std::vector<TensorView> in;
  TensorView out;  // always contiguous
  const Attrs* attrs = nullptr;
};

struct BackwardArgs {
  const std::vector<Tensor>& inputs;
  const Tensor& out;   // the forward result, for rules that reuse it
  const Tensor& dout;  // incoming gradient; may have any layout
  const Attrs& attrs;
  const std::vector<bool>& needed;  // which inputs need a gradient
  bool needs(size_t i) const { return i < needed.size() && needed[i]; }
};
using Grads = std::vector<Tensor>;  // one per input; undefined where not needed

// One gradient-check case: input generators and how to build the op from them.
enum class Init : uint8_t {
  normal,    // N(0, 1)
  uniform,   // U(lo, hi)
  integers,  // i32, uniform in [lo, hi)
};
struct CaseInput {
  Shape shape;
  Init init = Init::normal;
  double lo = 0, hi = 1;
  bool checked = true;  // compared against finite differences (floating inputs only)
};
inline CaseInput normal(Shape s) { return {std::move(s), Init::normal}; }
inline CaseInput uniform(Shape s, double lo, double hi) { return {std::move(s), Init::uniform, lo, hi}; }
inline CaseInput integers(Shape s, int64_t lo, int64_t hi) {
  return {std::move(s), Init::integers, double(lo), double(hi), false};
}
// A floating input the case does not differentiate (e.g. a mask's operands,
// where finite differences would jump).
inline CaseInput constant(CaseInput in) {
  in.checked = false;
  return in;
}
struct GradCase {
  std::string name;
  std::vector<CaseInput> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> build;
};

struct OpDef {
  const char* name;
  const char* summary;  // one line for `nabla ops` and docs/ops.md
  std::vector<InputSpec> inputs;
  bool variadic = false;  // the last input spec repeats (concat)
  bool is_view = false;   // output aliases input 0's memory; no kernel
  bool elementwise = false;  // out[i] depends on each input's element i only: may run in place
  // out[i] depends on this input's element i only (the others may be read
  // anywhere): the output may take over this input's memory. -1: none.
  int inplace_input = -1;
  // A fused op: one kernel for what `composite` computes from primitives. The
  // composite is its test oracle, its fallback, and (when `backward` is null)
  // its backward.
  bool fused = false;
  // Inputs the kernel writes in place: state kept in leaves (parameters,
  // optimizer moments) that an update op (adamw_update) changes. None is
  // differentiated; the executor runs the node after every other reader of
  // those leaves, and nothing may read its output, a token of no elements.
  // Such an op has no gradient cases.
  std::vector<int> mutates;
  Meta (*infer)(const std::vector<Tensor>& in, const Attrs& attrs) = nullptr;
  Grads (*backward)(const BackwardArgs& args) = nullptr;
  // A fused op's definition in primitive ops: its test oracle and fallback.
  Tensor (*composite)(const std::vector<Tensor>& in, const Attrs& attrs) = nullptr;
  std::vector<GradCase> (*cases)() = nullptr;

  const InputSpec& input(size_t i) const { return inputs[variadic && i >= inputs.size() ? inputs.size() - 1 : i]; }
  bool differentiable(size_t i) const { return input(i).diff == Diff::yes; }
};

// Records a node applying `op` to `inputs`; runs the shape rule now, so a bad
// shape throws here, naming the op. In composite mode a fused op is replaced
// by its composite.
Tensor apply(const OpDef& op, std::vector<Tensor> inputs, Attrs attrs = {});

// While alive, fused ops build their composites instead (this thread only).
class CompositeMode {
 public:
  CompositeMode();
  ~CompositeMode();
  CompositeMode(const CompositeMode&) = delete;
  CompositeMode& operator=(const CompositeMode&) = delete;
  static bool active();

 private:
  bool previous_;
};

// All registered ops (src/ops/op_list.h), and lookup by name.
const std::vector<const OpDef*>& all_ops();
const OpDef* find_op(const std::string& name);
// An op only autodiff (and library code) emits, declared in
// src/ops/internal_ops.h instead of include/nabla/ops.h: NABLA_INTERNAL_OP in
// src/ops/op_list.h.
bool is_internal(const OpDef& op);

// Shape-rule helpers shared by ops.
void require_floating(const char* op, const Tensor& t, const char* what);
void require_same_dtype(const char* op, const Tensor& a, const Tensor& b);
// An f64 operand of a given shape (an update op's settings): "op: what must
// be f64 <expected>, got ...", a DTypeError for another dtype, else a
// ShapeError where !shape_ok.
void require_f64(const char* op, const Tensor& t, const char* what, const char* expected, bool shape_ok);
// An update op's state: in[0], in[1], ... (named `names`) f32 of in[0]'s
// shape, else "op: name must be f32, got ..." or "op: name is [..], p is [..]".
void require_f32_like_first(const char* op, const std::vector<Tensor>& in, std::initializer_list<const char*> names);

// Calls fn.template operator()<T>() with T = float or double per dtype.
template <class F>
void dispatch_floating(DType dtype, const char* op, F&& fn) {
  switch (dtype) {
    case DType::f32: fn.template operator()<float>(); return;
    case DType::f64: fn.template operator()<double>(); return;
    default: throw DTypeError(std::string(op) + ": expected f32 or f64, got " + dtype_name(dtype));
  }
}

}  // namespace nabla
