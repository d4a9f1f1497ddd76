// Reference kernels of the layout ops: each output element is read from the
// one input element it copies (or is a constant). Values pass through double,
// which holds f32, f64 and i32 exactly.
#include "backend/reference/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_concat, op_contiguous, op_pad, op_repeat;
}  // namespace ops

namespace reference {
namespace {

// attrs.ints = {axis}: input k fills the band of the axis after inputs 0..k-1.
void concat_kernel(const Operands& a) {
  const size_t axis = size_t(a.attrs->ints[0]);
  int64_t start = 0;
  for (const TensorView& x : a.in) {
    for_each_index(x.shape, [&](const Index& i) {
      Index o = i;
      o[axis] += start;
      set(a.out, o, get(x, i));
    });
    start += x.shape[axis];
  }
}

void contiguous_kernel(const Operands& a) {
  for_each_index(a.out.shape, [&](const Index& i) { set(a.out, i, get(a.in[0], i)); });
}

// attrs.ints = {before0, after0, before1, ...}, reals = {value}: the value
// everywhere, then x shifted by the `before` paddings.
void pad_kernel(const Operands& a) {
  const TensorView& x = a.in[0];
  for (int64_t j = 0; j < a.out.numel(); ++j) set_at(a.out, j, a.attrs->reals[0]);
  for_each_index(x.shape, [&](const Index& i) {
    Index o = i;
    for (size_t d = 0; d < o.size(); ++d) o[d] += a.attrs->ints[2 * d];
    set(a.out, o, get(x, i));
  });
}

// attrs.ints = {repeats...}, possibly more than x's axes (new leading ones):
// out[i] = x[i mod x.shape], x's axes aligned to the right.
void repeat_kernel(const Operands& a) {
  const TensorView& x = a.in[0];
  const size_t skip = a.out.shape.size() - x.shape.size();
  for_each_index(a.out.shape, [&](const Index& o) {
    Index i(x.shape.size());
    for (size_t d = 0; d < i.size(); ++d) i[d] = o[skip + d] % x.shape[d];
    set(a.out, o, get(x, i));
  });
}

}  // namespace

void register_layout_kernels() {
  register_kernel(ops::op_concat, concat_kernel);
  register_kernel(ops::op_contiguous, contiguous_kernel);
  register_kernel(ops::op_pad, pad_kernel);
  register_kernel(ops::op_repeat, repeat_kernel);
}

}  // namespace reference
}  // namespace nabla
