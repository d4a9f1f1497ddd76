// Reference kernels of the indexing ops: rows picked, written or accumulated
// by i32 indices taken in row-major order of the index tensor.
#include <string>

#include "backend/reference/kernel.h"
#include "nabla/error.h"

namespace nabla {
namespace ops {
extern const OpDef op_get_rows, op_one_hot, op_scatter_add_rows, op_scatter_slice, op_set_rows;
}  // namespace ops

namespace reference {
namespace {

// The indices in row-major order, each checked against [0, rows): the CPU
// kernels' ShapeError, with the same message.
std::vector<int64_t> row_indices(const char* op, const TensorView& idx, int64_t rows) {
  std::vector<int64_t> v;
  for_each_index(idx.shape, [&](const Index& i) {
    const int64_t r = int64_t(get(idx, i));
    if (r < 0 || r >= rows) {
      throw ShapeError(std::string(op) + ": index " + std::to_string(r) + " at position " + std::to_string(v.size()) +
                       " is out of range for " + std::to_string(rows) + " rows");
    }
    v.push_back(r);
  });
  return v;
}

// `head` followed by `tail`: an index of a tensor [*head's axes, *tail's].
Index join(const Index& head, const Index& tail) {
  Index i = head;
  i.insert(i.end(), tail.begin(), tail.end());
  return i;
}

// table [R, *rest], indices [*I] -> out [*I, *rest]: out[p] = table[indices[p]].
void get_rows_kernel(const Operands& a) {
  const TensorView &table = a.in[0], &idx = a.in[1];
  const std::vector<int64_t> rows = row_indices("get_rows", idx, table.shape[0]);
  const Shape rest(table.shape.begin() + 1, table.shape.end());
  int64_t at = 0;  // out is row-major: position p's row, then its elements in order
  for (int64_t r : rows) {
    for_each_index(rest, [&](const Index& e) { set_at(a.out, at++, get(table, join({r}, e))); });
  }
}

// dst [R, *rest], indices [*I], values [*I, *rest]: dst with row indices[p]
// replaced by values[p], in index order, so the last write to a row wins.
void set_rows_kernel(const Operands& a) {
  const TensorView &dst = a.in[0], &idx = a.in[1], &values = a.in[2];
  const std::vector<int64_t> rows = row_indices("set_rows", idx, dst.shape[0]);
  for_each_index(dst.shape, [&](const Index& i) { set(a.out, i, get(dst, i)); });
  const Shape rest(dst.shape.begin() + 1, dst.shape.end());
  size_t q = 0;
  for_each_index(idx.shape, [&](const Index& p) {
    const int64_t r = rows[q++];
    for_each_index(rest, [&](const Index& e) { set(a.out, join({r}, e), get(values, join(p, e))); });
  });
}

// values [*I, *rest], indices [*I], attrs.ints = {R} -> [R, *rest] of zeros
// with values[p] added to row indices[p]; sums in double.
void scatter_add_rows_kernel(const Operands& a) {
  const TensorView &values = a.in[0], &idx = a.in[1];
  const std::vector<int64_t> rows = row_indices("scatter_add_rows", idx, a.out.shape[0]);
  const Shape rest(a.out.shape.begin() + 1, a.out.shape.end());
  const int64_t width = numel(rest);
  std::vector<double> acc(size_t(a.out.numel()), 0.0);
  size_t q = 0;
  for_each_index(idx.shape, [&](const Index& p) {
    int64_t at = rows[q++] * width;
    for_each_index(rest, [&](const Index& e) { acc[size_t(at++)] += get(values, join(p, e)); });
  });
  for (size_t j = 0; j < acc.size(); ++j) set_at(a.out, int64_t(j), acc[j]);
}

// attrs.ints = {axis, start, stop, step, full shape...}: zeros of the full
// shape with x at the positions start, start + step, ... of the axis.
void scatter_slice_kernel(const Operands& a) {
  const TensorView& x = a.in[0];
  const size_t axis = size_t(a.attrs->ints[0]);
  const int64_t start = a.attrs->ints[1], step = a.attrs->ints[3];
  for (int64_t j = 0; j < a.out.numel(); ++j) set_at(a.out, j, 0.0);
  for_each_index(x.shape, [&](const Index& i) {
    Index o = i;
    o[axis] = start + i[axis] * step;
    set(a.out, o, get(x, i));
  });
}

// indices [*I] -> [*I, classes]: 1 at the index, 0 elsewhere; an index out of
// [0, classes) gives a row of zeros (no error: cross_entropy's ignore_index).
void one_hot_kernel(const Operands& a) {
  const TensorView& idx = a.in[0];
  const int64_t classes = a.out.shape.back();
  int64_t row = 0;
  for_each_index(idx.shape, [&](const Index& p) {
    const int64_t v = int64_t(get(idx, p));
    for (int64_t k = 0; k < classes; ++k) set_at(a.out, row * classes + k, k == v ? 1.0 : 0.0);
    ++row;
  });
}

}  // namespace

void register_indexing_kernels() {
  register_kernel(ops::op_get_rows, get_rows_kernel);
  register_kernel(ops::op_set_rows, set_rows_kernel);
  register_kernel(ops::op_scatter_add_rows, scatter_add_rows_kernel);
  register_kernel(ops::op_scatter_slice, scatter_slice_kernel);
  register_kernel(ops::op_one_hot, one_hot_kernel);
}

}  // namespace reference
}  // namespace nabla
