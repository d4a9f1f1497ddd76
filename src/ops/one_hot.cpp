// one_hot: indices i32 [*I] -> [*I, classes] of a floating dtype, 1 at each
// index and 0 elsewhere. An index outside [0, classes) gives a row of zeros
// (as tf.one_hot does), which is how cross_entropy's composite drops rows
// labelled ignore_index. attrs: ints {classes, dtype}.
#include "backend/cpu/kernel.h"
#include "backend/cpu/thread_pool.h"
#include "backend/cpu/strided.h"
#include "core/op.h"

namespace nabla {
namespace ops {
namespace {

Meta one_hot_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& idx = in[0];
  if (idx.dtype() != DType::i32) {
    throw DTypeError(std::string("one_hot: indices must be i32, got ") + dtype_name(idx.dtype()));
  }
  Shape shape = idx.shape();
  shape.push_back(attrs.ints[0]);
  return {static_cast<DType>(attrs.ints[1]), shape};
}

template <class T>
void one_hot_kernel(const KernelArgs& a) {
  const TensorView& idx = a.in[0];
  int64_t classes = a.out.shape.back();
  std::vector<int32_t> v(static_cast<size_t>(idx.numel()));
  cpu::copy_strided(idx.data, idx.shape, idx.strides, sizeof(int32_t), v.data());
  T* out = a.out.ptr<T>();
  a.parallel_for(static_cast<int64_t>(v.size()),
                 cpu::grain_for(classes),
                 [&](int64_t b, int64_t e) {
                   for (int64_t p = b; p < e; ++p) {
                     T* row = out + p * classes;
                     std::fill(row, row + classes, T(0));
                     if (v[p] >= 0 && v[p] < classes) row[v[p]] = T(1);
                   }
                 });
}

void one_hot_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "one_hot", [&]<class T>() { one_hot_kernel<T>(a); });
}

// The output is f64 only through a floating operand, so each case scales it
// by one (which also carries the f32/f64 choice of the checker).
std::vector<GradCase> one_hot_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"vector",
       {integers({6}, 0, 4), normal({6, 4})},
       [](X x) { return one_hot(x[0], 4, x[1].dtype()) * x[1]; }},
      {"out_of_range_rows",
       {integers({2, 3}, -2, 5), normal({2, 3, 3})},
       [](X x) { return one_hot(x[0], 3, x[1].dtype()) * x[1]; }},
  };
}

}  // namespace

extern const OpDef op_one_hot{
    .name = "one_hot",
    .summary = "i32 indices -> one-hot rows (all 0 out of range); not differentiated",
    .inputs = {{"indices", Diff::no}},
    .infer = one_hot_infer,
    .cases = one_hot_cases,
};
NABLA_CPU_KERNEL(op_one_hot, one_hot_forward);

}  // namespace ops

Tensor one_hot(const Tensor& indices, int64_t classes, DType dtype) {
  if (classes < 0)
    throw ShapeError("one_hot: classes must be >= 0, got " + std::to_string(classes));
  if (!is_floating(dtype))
    throw DTypeError(std::string("one_hot: dtype must be f32 or f64, got ") + dtype_name(dtype));
  return apply(ops::op_one_hot, {indices}, Attrs{{classes, static_cast<int64_t>(dtype)}, {}});
}

}  // namespace nabla
