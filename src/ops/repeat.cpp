// repeat: x tiled `repeats[d]` times along each axis, as torch.Tensor.repeat
// (numpy.tile): out[i] = x[i mod x.shape]. More repeats than axes tile along
// new leading axes. attrs: ints {repeats...}.
#include "backend/cpu/kernel.h"
#include "ops/last_axis.h"

namespace nabla {
namespace ops {
namespace {

// x's shape padded with leading 1s to the rank of the repeats.
Shape tiled_shape(const Shape& x, size_t rank) {
  Shape s(rank - x.size(), 1);
  s.insert(s.end(), x.begin(), x.end());
  return s;
}

Meta repeat_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in[0];
  require_floating("repeat", x, "x");
  const auto& reps = attrs.ints;
  if (reps.size() < static_cast<size_t>(x.rank())) {
    throw ShapeError("repeat: need a repeat count for each axis of x " + to_string(x.shape()) +
                     ", got " + std::to_string(reps.size()));
  }
  Shape shape = tiled_shape(x.shape(), reps.size());
  for (size_t d = 0; d < reps.size(); ++d) {
    if (reps[d] < 0)
      throw ShapeError("repeat: repeat counts must be >= 0, got " + std::to_string(reps[d]));
    shape[d] *= reps[d];
  }
  return {x.dtype(), shape};
}

template <class T>
void repeat_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const Shape& oshape = a.out.shape;
  size_t rank = oshape.size();
  T* out = a.out.ptr<T>();
  const T* xp = x.ptr<T>();
  if (rank == 0) {
    out[0] = xp[0];
    return;
  }
  Shape xshape = tiled_shape(x.shape, rank);
  Strides xstrides(rank - x.shape.size(), 0);
  xstrides.insert(xstrides.end(), x.strides.begin(), x.strides.end());
  int64_t len = oshape.back(), w = xshape.back(), ws = xstrides.back();
  int64_t rows = len ? a.out.numel() / len : 0;
  a.parallel_for(rows, row_grain(len), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      // Source row: each outer index of the output taken modulo x's size.
      int64_t src = 0, rem = r;
      for (size_t d = rank - 1; d-- > 0;) {
        src += (rem % oshape[d]) % xshape[d] * xstrides[d];
        rem /= oshape[d];
      }
      T* y = out + r * len;
      for (int64_t j = 0; j < len; ++j) y[j] = xp[src + (j % w) * ws];
    }
  });
}

void repeat_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "repeat", [&]<class T>() { repeat_kernel<T>(a); });
}

// Each x element receives the gradient of all its copies: view dout as
// [r0, s0, r1, s1, ...] (repeated axes only) and sum the r axes.
Grads repeat_backward(const BackwardArgs& g) {
  const Tensor& x = g.inputs[0];
  const auto& reps = g.attrs.ints;
  Shape xshape = tiled_shape(x.shape(), reps.size());
  Shape split;
  std::vector<int64_t> axes;
  for (size_t d = 0; d < reps.size(); ++d) {
    if (reps[d] != 1) {
      axes.push_back(static_cast<int64_t>(split.size()));
      split.push_back(reps[d]);
    }
    split.push_back(xshape[d]);
  }
  Tensor dx = reshape(g.dout, split);
  if (!axes.empty()) dx = sum(dx, axes);
  return {reshape(dx, x.shape())};
}

std::vector<GradCase> repeat_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"matrix",
       {normal({2, 3})},
       [](X x) {
         return repeat(x[0], {2, 3});
       }},
      {"new_axis",
       {normal({3, 2})},
       [](X x) {
         return repeat(x[0], {2, 1, 2});
       }},
      {"rank3_unit_axis",
       {normal({2, 1, 3})},
       [](X x) {
         return repeat(x[0], {1, 3, 2});
       }},
  };
}

}  // namespace

extern const OpDef op_repeat{
    .name = "repeat",
    .summary = "tiles x repeats[d] times along each axis, as torch.Tensor.repeat",
    .inputs = {{"x", Diff::yes}},
    .infer = repeat_infer,
    .backward = repeat_backward,
    .cases = repeat_cases,
};
NABLA_CPU_KERNEL(op_repeat, repeat_forward);

}  // namespace ops

Tensor repeat(const Tensor& x, std::vector<int64_t> repeats) {
  return apply(ops::op_repeat, {x}, Attrs{std::move(repeats), {}});
}

}  // namespace nabla
