// scatter_add_rows: out[rows, *rest] = 0; out[indices[p]] += values[p].
// The adjoint of get_rows; duplicate indices accumulate.
// add_rows: the same into base instead of zeros, in base's memory when base
// dies there: how autodiff adds an embedding's gradient to another
// contribution (a tied output head's) without a full-size zeroed tensor.
#include "backend/cpu/kernel.h"
#include "ops/internal_ops.h"
#include "ops/rows.h"

namespace nabla {
namespace ops {
namespace {

Meta scatter_add_rows_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &values = in[0], &idx = in[1];
  require_floating("scatter_add_rows", values, "values");
  if (idx.dtype() != DType::i32) {
    throw DTypeError(std::string("scatter_add_rows: indices must be i32, got ") + dtype_name(idx.dtype()));
  }
  bool prefix = values.rank() >= idx.rank();
  for (int d = 0; prefix && d < idx.rank(); ++d) prefix = values.shape()[d] == idx.shape()[d];
  if (!prefix) {
    throw ShapeError("scatter_add_rows: values " + to_string(values.shape()) + " must start with the indices' shape " +
                     to_string(idx.shape()));
  }
  Shape shape{attrs.ints[0]};
  shape.insert(shape.end(), values.shape().begin() + idx.rank(), values.shape().end());
  return {values.dtype(), shape};
}

// out[rows[p]] += values[p] for every index position p, over out's current
// values (zeros for scatter_add_rows, base for add_rows).
template <class T>
void accumulate_rows(const KernelArgs& a, const TensorView& values, const TensorView& idx, const char* op) {
  int64_t n_rows = a.out.shape[0];
  std::vector<int32_t> rows = read_row_indices(op, idx, n_rows);
  size_t k = idx.shape.size();
  Shape lead(values.shape.begin(), values.shape.begin() + k);
  Strides lead_strides(values.strides.begin(), values.strides.begin() + k);
  Shape rest(values.shape.begin() + k, values.shape.end());
  Strides rest_strides(values.strides.begin() + k, values.strides.end());
  Strides out_strides = contiguous_strides(rest);
  int64_t width = numel(rest);

  // Offset of each index position's slice in `values`.
  const std::vector<int64_t> base = cpu::position_offsets(lead, lead_strides);

  T* out = a.out.ptr<T>();
  const T* vp = values.ptr<T>();
  cpu::Walker<2> w(rest, {&out_strides, &rest_strides});
  // Split over columns, never over indices: each output element is summed by
  // one thread in index order, so duplicates add up identically every run.
  a.parallel_for(width, 1024, [&](int64_t cb, int64_t ce) {
    for (size_t q = 0; q < rows.size(); ++q) {
      T* orow = out + rows[q] * width;
      const T* vrow = vp + base[q];
      w.run(cb, ce, [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
        for (int64_t i = 0; i < n; ++i) orow[o[0] + i] += vrow[o[1] + i * s[1]];
      });
    }
  });
}

template <class T>
void scatter_add_rows_kernel(const KernelArgs& a) {
  T* out = a.out.ptr<T>();
  std::fill(out, out + a.out.numel(), T(0));
  accumulate_rows<T>(a, a.in[0], a.in[1], "scatter_add_rows");
}

void scatter_add_rows_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "scatter_add_rows", [&]<class T>() { scatter_add_rows_kernel<T>(a); });
}

Grads scatter_add_rows_backward(const BackwardArgs& g) { return {get_rows(g.dout, g.inputs[1]), Tensor()}; }

std::vector<GradCase> scatter_add_rows_cases() {
  return {
      {"repeated", {normal({6, 3}), integers({6}, 0, 4)},
       [](const std::vector<Tensor>& x) { return scatter_add_rows(x[0], x[1], 4); }},
      {"index_matrix", {normal({2, 3, 2}), integers({2, 3}, 0, 3)},
       [](const std::vector<Tensor>& x) { return scatter_add_rows(x[0], x[1], 3); }},
  };
}

// add_rows(base, values, indices): base [rows, ...], values [*indices, ...].
Meta add_rows_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor& base = in[0];
  require_floating("add_rows", base, "base");
  require_same_dtype("add_rows", base, in[1]);
  if (base.rank() < 1) throw ShapeError("add_rows: base needs at least 1 axis, got " + to_string(base.shape()));
  Meta m = scatter_add_rows_infer({in[1], in[2]}, Attrs{{base.dim(0)}, {}});
  if (m.shape != base.shape()) {
    throw ShapeError("add_rows: values " + to_string(in[1].shape()) + " with indices " + to_string(in[2].shape()) +
                     " give rows of " + to_string(m.shape) + ", base is " + to_string(base.shape()));
  }
  return {base.dtype(), base.shape()};
}

template <class T>
void add_rows_kernel(const KernelArgs& a) {
  if (a.in[0].data != a.out.data) copy_to_contiguous(a, a.in[0], a.out.data);  // not run in place: base first
  accumulate_rows<T>(a, a.in[1], a.in[2], "add_rows");
}

void add_rows_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "add_rows", [&]<class T>() { add_rows_kernel<T>(a); });
}

Tensor add_rows_composite(const std::vector<Tensor>& in, const Attrs&) {
  return in[0] + scatter_add_rows(in[1], in[2], in[0].dim(0));
}

Grads add_rows_backward(const BackwardArgs& g) { return {g.dout, get_rows(g.dout, g.inputs[2]), Tensor()}; }

std::vector<GradCase> add_rows_cases() {
  return {
      {"repeated", {normal({4, 3}), normal({6, 3}), integers({6}, 0, 4)},
       [](const std::vector<Tensor>& x) { return add_rows(x[0], x[1], x[2]); }},
      {"index_matrix", {normal({3, 2}), normal({2, 3, 2}), integers({2, 3}, 0, 3)},
       [](const std::vector<Tensor>& x) { return add_rows(x[0], x[1], x[2]); }},
  };
}

}  // namespace

extern const OpDef op_add_rows{
    .name = "add_rows",
    .summary = "base with values[p] added to row indices[p] (autodiff's sum of get_rows gradients); fused",
    .inputs = {{"base", Diff::yes}, {"values", Diff::yes}, {"indices", Diff::no}},
    .inplace_input = 0,
    .fused = true,
    .infer = add_rows_infer,
    .backward = add_rows_backward,
    .composite = add_rows_composite,
    .cases = add_rows_cases,
};
NABLA_CPU_KERNEL(op_add_rows, add_rows_forward);

extern const OpDef op_scatter_add_rows{
    .name = "scatter_add_rows",
    .summary = "out[indices[p]] += values[p] into zeros: the adjoint of get_rows",
    .inputs = {{"values", Diff::yes}, {"indices", Diff::no}},
    .infer = scatter_add_rows_infer,
    .backward = scatter_add_rows_backward,
    .cases = scatter_add_rows_cases,
};
NABLA_CPU_KERNEL(op_scatter_add_rows, scatter_add_rows_forward);

}  // namespace ops

Tensor scatter_add_rows(const Tensor& values, const Tensor& indices, int64_t rows) {
  if (rows < 0) throw ShapeError("scatter_add_rows: rows must be >= 0, got " + std::to_string(rows));
  return apply(ops::op_scatter_add_rows, {values, indices}, Attrs{{rows}, {}});
}

Tensor add_rows(const Tensor& base, const Tensor& values, const Tensor& indices) {
  return apply(ops::op_add_rows, {base, values, indices});
}

}  // namespace nabla
