// get_rows: table[indices], the embedding lookup.
// table [R, *rest], indices i32 [*I] -> [*I, *rest].
#include "backend/cpu/kernel.h"
#include "backend/cpu/thread_pool.h"
#include "ops/internal_ops.h"
#include "ops/rows.h"

namespace nabla {
namespace ops {
namespace {

Meta get_rows_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &table = in[0], &idx = in[1];
  if (idx.dtype() != DType::i32) {
    throw DTypeError(std::string("get_rows: indices must be i32, got ") + dtype_name(idx.dtype()));
  }
  if (table.rank() < 1) throw ShapeError("get_rows: table must have at least 1 axis, got a scalar");
  Shape shape = idx.shape();
  shape.insert(shape.end(), table.shape().begin() + 1, table.shape().end());
  return {table.dtype(), shape};
}

void get_rows_forward(const KernelArgs& a) {
  const TensorView &table = a.in[0], &idx = a.in[1];
  std::vector<int32_t> rows = read_row_indices("get_rows", idx, table.shape[0]);
  Shape rest(table.shape.begin() + 1, table.shape.end());
  Strides rest_strides(table.strides.begin() + 1, table.strides.end());
  Strides out_strides = contiguous_strides(rest);
  int64_t width = numel(rest);
  size_t elem = dtype_size(table.dtype);
  cpu::Walker<2> w(rest, {&out_strides, &rest_strides});
  auto* src = static_cast<const char*>(table.data);
  auto* dst = static_cast<char*>(a.out.data);
  a.parallel_for(static_cast<int64_t>(rows.size()), cpu::grain_for(width),
                 [&](int64_t b, int64_t e) {
                   for (int64_t p = b; p < e; ++p) {
                     const char* row = src + rows[p] * table.strides[0] * elem;
                     char* out = dst + p * width * elem;
                     w.run(0, width, [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
                       cpu::copy_run(out + o[0] * elem, row + o[1] * elem, n, s[1], elem);
                     });
                   }
                 });
}

// Each looked-up row sends its gradient back to its table row; repeated
// indices accumulate.
Grads get_rows_backward(const BackwardArgs& g) {
  return {scatter_add_rows(g.dout, g.inputs[1], g.inputs[0].shape()[0]), Tensor()};
}

std::vector<GradCase> get_rows_cases() {
  return {
      {"repeated", {normal({5, 3}), integers({6}, 0, 5)},
       [](const std::vector<Tensor>& x) { return get_rows(x[0], x[1]); }},
      {"index_matrix", {normal({4, 2, 3}), integers({2, 3}, 0, 4)},
       [](const std::vector<Tensor>& x) { return get_rows(x[0], x[1]); }},
  };
}

}  // namespace

extern const OpDef op_get_rows{
    .name = "get_rows",
    .summary = "table[indices] (embedding lookup); indices i32, not differentiated",
    .inputs = {{"table", Diff::yes}, {"indices", Diff::no}},
    .infer = get_rows_infer,
    .backward = get_rows_backward,
    .cases = get_rows_cases,
};
NABLA_CPU_KERNEL(op_get_rows, get_rows_forward);

}  // namespace ops

Tensor get_rows(const Tensor& table, const Tensor& indices) { return apply(ops::op_get_rows, {table, indices}); }

}  // namespace nabla
