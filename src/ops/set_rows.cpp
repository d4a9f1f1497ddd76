// set_rows: dst with rows replaced, out[indices[p]] = values[p].
// dst [R, *rest], indices i32 [*I], values [*I, *rest] -> [R, *rest].
// With duplicate indices the last write (in row-major order of indices)
// wins, deterministically; only that write receives a gradient.
#include "backend/cpu/kernel.h"
#include "backend/cpu/thread_pool.h"
#include "ops/rows.h"

namespace nabla {
namespace ops {
namespace {

Meta set_rows_infer(const std::vector<Tensor>& in, const Attrs&) {
  const Tensor &dst = in[0], &idx = in[1], &values = in[2];
  require_floating("set_rows", dst, "dst");
  require_same_dtype("set_rows", dst, values);
  if (idx.dtype() != DType::i32) {
    throw DTypeError(std::string("set_rows: indices must be i32, got ") + dtype_name(idx.dtype()));
  }
  if (dst.rank() < 1) throw ShapeError("set_rows: dst must have at least 1 axis, got a scalar");
  Shape want = idx.shape();
  want.insert(want.end(), dst.shape().begin() + 1, dst.shape().end());
  if (values.shape() != want) {
    throw ShapeError("set_rows: values must be " + to_string(want) +
                     " (indices' shape, then dst's rows), got " + to_string(values.shape()));
  }
  return {dst.dtype(), dst.shape()};
}

template <class T>
void set_rows_kernel(const KernelArgs& a) {
  const TensorView &dst = a.in[0], &idx = a.in[1], &values = a.in[2];
  int64_t n_rows = dst.shape[0];
  std::vector<int32_t> rows = read_row_indices("set_rows", idx, n_rows);
  size_t k = idx.shape.size();
  Shape lead(values.shape.begin(), values.shape.begin() + k);
  Strides lead_strides(values.strides.begin(), values.strides.begin() + k);
  Shape rest(dst.shape.begin() + 1, dst.shape.end());
  Strides dst_rest(dst.strides.begin() + 1, dst.strides.end());
  Strides val_rest(values.strides.begin() + k, values.strides.end());
  Strides out_rest = contiguous_strides(rest);
  int64_t width = numel(rest);

  // The write that wins each row (the last one), or -1 to keep dst's row.
  std::vector<int64_t> winner(static_cast<size_t>(n_rows), -1);
  for (size_t q = 0; q < rows.size(); ++q) winner[rows[q]] = static_cast<int64_t>(q);
  // Offset of each index position's slice in `values`.
  std::vector<int64_t> base(rows.size());
  cpu::Walker<1> lw(lead, {&lead_strides});
  size_t p = 0;
  lw.run(0, numel(lead),
         [&](const std::array<int64_t, 1>& o, int64_t n, const std::array<int64_t, 1>& s) {
           for (int64_t i = 0; i < n; ++i) base[p++] = o[0] + i * s[0];
         });

  const T *dp = dst.ptr<T>(), *vp = values.ptr<T>();
  T* out = a.out.ptr<T>();
  cpu::Walker<2> from_dst(rest, {&out_rest, &dst_rest});
  cpu::Walker<2> from_val(rest, {&out_rest, &val_rest});
  // One output row per item: each is written once, whatever the duplicates.
  a.parallel_for(
      n_rows, cpu::grain_for(width), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          int64_t q = winner[r];
          const T* src = q >= 0 ? vp + base[q] : dp + r * dst.strides[0];
          const cpu::Walker<2>& w = q >= 0 ? from_val : from_dst;
          T* orow = out + r * width;
          w.run(0, width,
                [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
                  for (int64_t i = 0; i < n; ++i) orow[o[0] + i] = src[o[1] + i * s[1]];
                });
        }
      });
}

void set_rows_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "set_rows", [&]<class T>() { set_rows_kernel<T>(a); });
}

// ddst = dout with the written rows zeroed; dvalues[p] = dout[indices[p]]
// where write p won its row, else 0. The winners are found with the same op:
// writing each position's number p and reading it back gives p only there.
Grads set_rows_backward(const BackwardArgs& g) {
  const Tensor &dst = g.inputs[0], &idx = g.inputs[1], &values = g.inputs[2];
  Grads d(3);
  if (g.needs(0)) d[0] = set_rows(g.dout, idx, zeros_like(values));
  if (g.needs(2)) {
    std::vector<double> ids(static_cast<size_t>(idx.numel()));
    for (size_t p = 0; p < ids.size(); ++p) ids[p] = static_cast<double>(p);
    Tensor pos =
        dst.dtype() == DType::f32
            ? Tensor::from_vector<float>(idx.shape(), std::vector<float>(ids.begin(), ids.end()))
            : Tensor::from_vector<double>(idx.shape(), ids);
    Tensor owner = set_rows(Tensor::full(dst.dtype(), {dst.dim(0)}, -1.0), idx, pos);
    Tensor won = eq(get_rows(owner, idx), pos);
    Shape bshape = idx.shape();
    bshape.resize(values.shape().size(), 1);
    d[2] = get_rows(g.dout, idx) * reshape(won, bshape);
  }
  return d;
}

std::vector<GradCase> set_rows_cases() {
  using X = const std::vector<Tensor>&;
  return {
      // Fixed, distinct indices.
      {"unique",
       {normal({5, 3}), normal({3, 3})},
       [](X x) {
         return set_rows(x[0], Tensor::from_vector<int32_t>({3}, {4, 0, 2}), x[1]);
       }},
      {"index_matrix",
       {normal({6, 2}), normal({2, 2, 2})},
       [](X x) {
         return set_rows(x[0], Tensor::from_vector<int32_t>({2, 2}, {5, 1, 3, 0}), x[1]);
       }},
      // Random indices repeat: the last write wins and alone gets a gradient.
      {"duplicates",
       {normal({4, 2}), integers({5}, 0, 4), normal({5, 2})},
       [](X x) { return set_rows(x[0], x[1], x[2]); }},
      {"vector_rows",
       {normal({5}), integers({3}, 0, 5), normal({3})},
       [](X x) { return set_rows(x[0], x[1], x[2]); }},
  };
}

}  // namespace

extern const OpDef op_set_rows{
    .name = "set_rows",
    .summary = "dst with rows indices[p] replaced by values[p]; the last write wins",
    .inputs = {{"dst", Diff::yes}, {"indices", Diff::no}, {"values", Diff::yes}},
    .infer = set_rows_infer,
    .backward = set_rows_backward,
    .cases = set_rows_cases,
};
NABLA_CPU_KERNEL(op_set_rows, set_rows_forward);

}  // namespace ops

Tensor set_rows(const Tensor& dst, const Tensor& indices, const Tensor& values) {
  return apply(ops::op_set_rows, {dst, indices, values}, {});
}

}  // namespace nabla
