// concat: joins tensors along one axis.
#include "backend/cpu/kernel.h"
#include "core/op.h"

namespace nabla {
namespace ops {
namespace {

Meta concat_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  int64_t axis = attrs.ints[0];
  Shape shape = in[0].shape();
  shape[axis] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    require_same_dtype("concat", in[0], in[i]);
    bool ok = in[i].rank() == in[0].rank();
    for (int d = 0; ok && d < in[0].rank(); ++d) ok = d == axis || in[i].shape()[d] == in[0].shape()[d];
    if (!ok) {
      throw ShapeError("concat: input " + std::to_string(i) + " is " + to_string(in[i].shape()) +
                       ", expected " + to_string(in[0].shape()) + " except along axis " + std::to_string(axis));
    }
    shape[axis] += in[i].shape()[axis];
  }
  return {in[0].dtype(), shape};
}

// Each input is copied into its band of the output.
void concat_forward(const KernelArgs& a) {
  int64_t axis = a.attrs->ints[0];
  size_t elem = dtype_size(a.out.dtype);
  Strides os = contiguous_strides(a.out.shape);
  int64_t start = 0;
  for (const TensorView& x : a.in) {
    copy_into(a, x, static_cast<char*>(a.out.data) + start * os[axis] * elem, os);
    start += x.shape[axis];
  }
}

// Each input gets its band of the gradient.
Grads concat_backward(const BackwardArgs& g) {
  int64_t axis = g.attrs.ints[0];
  Grads d(g.inputs.size());
  int64_t start = 0;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    int64_t size = g.inputs[i].shape()[axis];
    if (g.needs(i)) d[i] = slice(g.dout, axis, start, start + size);
    start += size;
  }
  return d;
}

std::vector<GradCase> concat_cases() {
  return {
      {"rows", {normal({2, 3}), normal({1, 3}), normal({3, 3})},
       [](const std::vector<Tensor>& x) { return concat(x, 0); }},
      {"last_axis", {normal({2, 3, 2}), normal({2, 3, 1})},
       [](const std::vector<Tensor>& x) { return concat(x, -1); }},
  };
}

}  // namespace

extern const OpDef op_concat{
    .name = "concat",
    .summary = "joins tensors along an axis",
    .inputs = {{"xs", Diff::yes}},
    .variadic = true,
    .infer = concat_infer,
    .backward = concat_backward,
    .cases = concat_cases,
};
NABLA_CPU_KERNEL(op_concat, concat_forward);

}  // namespace ops

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  if (xs.empty()) throw ShapeError("concat: needs at least one tensor");
  if (xs[0].rank() == 0) throw ShapeError("concat: scalars have no axis to join along");
  int a = normalize_axis(axis, xs[0].rank(), "concat");
  if (xs.size() == 1) return xs[0];
  return apply(ops::op_concat, xs, Attrs{{a}, {}});
}

}  // namespace nabla
