// rope: rotary position embedding. x [..., T, D], positions i32 [T]; the
// first R = dims elements of each row rotate, the rest pass through.
// Pair i (0 <= i < R/2) of the row at position pos turns by
// theta = pos * base^(-2i/R) / factor_i, scaled by m:
//   (a, b) -> m (a cos - b sin, a sin + b cos)
// original (GPT-J, Meta "interleaved"): the pair is (x[2i], x[2i+1]);
// neox (GPT-NeoX, Hugging Face Llama):  the pair is (x[i], x[i + R/2]).
// attrs: ints {mode, inverse, R}, reals {base, m, factor_0, ...,
// factor_{R/2-1}} (no factors: all 1); inverse turns by -theta (m R(theta)'s
// transpose is m R(-theta)).
#include <cmath>

#include "backend/cpu/kernel.h"
#include "ops/last_axis.h"

namespace nabla {
namespace ops {

extern const OpDef op_rope;

namespace {

Meta rope_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &pos = in[1];
  require_floating("rope", x, "x");
  if (pos.dtype() != DType::i32) {
    throw DTypeError(std::string("rope: positions must be i32, got ") + dtype_name(pos.dtype()));
  }
  const int64_t dims = attrs.ints[2];
  if (x.rank() < 2 || dims % 2 != 0 || dims <= 0 || dims > x.dim(-1)) {
    throw ShapeError("rope: x must be [..., T, D] with an even number of rotary dimensions in (0, D] (" +
                     std::to_string(dims) + "), got " + to_string(x.shape()));
  }
  if (pos.shape() != Shape{x.dim(-2)}) {
    throw ShapeError("rope: positions must be [T] = [" + std::to_string(x.dim(-2)) + "] for x " +
                     to_string(x.shape()) + ", got " + to_string(pos.shape()));
  }
  const size_t factors = attrs.reals.size() - 2;
  if (factors != 0 && int64_t(factors) != dims / 2) {
    throw ShapeError("rope: " + std::to_string(factors) + " frequency factors for x " + to_string(x.shape()) +
                     " rotating " + std::to_string(dims) + " dimensions, expected none or " + std::to_string(dims / 2));
  }
  return {x.dtype(), x.shape()};
}

template <class T>
void rope_kernel(const KernelArgs& a) {
  const TensorView &x = a.in[0], &pv = a.in[1];
  bool neox = a.attrs->ints[0] == static_cast<int64_t>(RopeMode::neox);
  double sign = a.attrs->ints[1] ? -1.0 : 1.0;
  const std::vector<double>& reals = a.attrs->reals;
  const double base = reals[0], m = reals[1];
  const bool scaled = reals.size() > 2;
  const Shape& shape = a.out.shape;
  const int64_t t_len = shape[shape.size() - 2], d = shape.back(), rotated = a.attrs->ints[2], half = rotated / 2;
  std::vector<int32_t> pos(static_cast<size_t>(t_len));
  cpu::copy_strided(pv.data, pv.shape, pv.strides, sizeof(int32_t), pos.data());
  // cos/sin per (position, pair), in double for both dtypes: [T, D/2] each.
  std::vector<double> cs(static_cast<size_t>(t_len * half)), sn(cs.size());
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      double theta = double(pos[t]) * std::pow(base, -2.0 * double(i) / double(rotated));
      if (scaled) theta /= reals[2 + i];
      cs[t * half + i] = m * std::cos(theta);
      sn[t * half + i] = m * sign * std::sin(theta);
    }
  }
  RowWalker<1> rows(shape, {x.strides});
  int64_t xs = rows.inner(0);
  const T* xp = x.ptr<T>();
  T* out = a.out.ptr<T>();
  // Element offsets of pair i's two members within a row.
  int64_t step = neox ? 1 : 2, other = neox ? half : 1;
  a.parallel_for(rows.rows(), row_grain(d), [&](int64_t b, int64_t e) {
    rows.run(b, e, [&](int64_t r, const std::array<int64_t, 1>& o) {
      const T* xr = xp + o[0];
      T* y = out + r * d;
      const double *c = cs.data() + (r % t_len) * half, *s = sn.data() + (r % t_len) * half;
      for (int64_t i = 0; i < half; ++i) {
        int64_t ja = i * step, jb = ja + other;
        double va = xr[ja * xs], vb = xr[jb * xs];
        y[ja] = static_cast<T>(va * c[i] - vb * s[i]);
        y[jb] = static_cast<T>(va * s[i] + vb * c[i]);
      }
      for (int64_t j = rotated; j < d; ++j) y[j] = xr[j * xs];
    });
  });
}

void rope_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "rope", [&]<class T>() { rope_kernel<T>(a); });
}

Tensor rope_apply(const Tensor& x, const Tensor& positions, int64_t mode, bool inverse, int64_t dims,
                  std::vector<double> reals) {
  return apply(op_rope, {x, positions}, Attrs{{mode, inverse ? 1 : 0, dims}, std::move(reals)});
}

// A rotation's transpose is the rotation by the opposite angle: dx = R(-theta) dy.
Grads rope_backward(const BackwardArgs& g) {
  const auto& a = g.attrs;
  return {rope_apply(g.dout, g.inputs[1], a.ints[0], a.ints[1] == 0, a.ints[2], a.reals), Tensor()};
}

std::vector<GradCase> rope_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"neox", {normal({2, 3, 4}), integers({3}, 0, 20)}, [](X x) { return rope(x[0], x[1]); }},
      {"original",
       {normal({2, 3, 4}), integers({3}, 0, 20)},
       [](X x) { return rope(x[0], x[1], 10000.0, RopeMode::original); }},
      {"heads_neox_base100",
       {normal({1, 2, 3, 6}), integers({3}, 0, 50)},
       [](X x) { return rope(x[0], x[1], 100.0, RopeMode::neox); }},
      {"heads_original_base100",
       {normal({1, 2, 3, 6}), integers({3}, 0, 50)},
       [](X x) { return rope(x[0], x[1], 100.0, RopeMode::original); }},
      {"offset",
       {normal({4, 2})},
       [](X x) { return rope(x[0], int64_t{7}, 10.0, RopeMode::original); }},
      {"heads_neox_freq_factors",
       {normal({1, 2, 3, 6}), integers({3}, 0, 50)},
       [](X x) { return rope(x[0], x[1], 100.0, RopeMode::neox, {1.0, 2.5, 8.0}); }},
      // Phi-3's and Phi-4-mini's: the first part of each head rotated, scaled
      // (longrope's attention factor), the rest passed through.
      {"heads_neox_partial_scaled",
       {normal({1, 2, 3, 10}), integers({3}, 0, 50)},
       [](X x) { return rope(x[0], x[1], 100.0, RopeMode::neox, {1.5, 4.0, 0.5}, 6, 1.25); }},
      {"original_partial",
       {normal({2, 3, 6}), integers({3}, 0, 20)},
       [](X x) { return rope(x[0], x[1], 10000.0, RopeMode::original, {}, 4); }},
  };
}

}  // namespace

extern const OpDef op_rope{
    .name = "rope",
    .summary = "rotary position embedding of [..., T, D] at i32 positions [T]; neox or original; optional frequency "
               "factors, a part of each row, a scale",
    .inputs = {{"x", Diff::yes}, {"positions", Diff::no}},
    .infer = rope_infer,
    .backward = rope_backward,
    .cases = rope_cases,
};
NABLA_CPU_KERNEL(op_rope, rope_forward);

}  // namespace ops

Tensor rope(const Tensor& x, const Tensor& positions, double base, RopeMode mode,
            const std::vector<double>& freq_factors, int64_t dims, double scale) {
  if (!(base > 0)) throw UsageError("rope: base must be positive, got " + std::to_string(base));
  if (!(scale > 0) || !std::isfinite(scale)) throw UsageError("rope: scale must be positive, got " + std::to_string(scale));
  if (dims < 0) throw UsageError("rope: dims must be 0 (every dimension) or positive, got " + std::to_string(dims));
  if (!x.defined()) throw UsageError("rope: x is an undefined tensor");
  if (dims == 0 && x.rank() > 0) dims = x.dim(-1);
  std::vector<double> reals{base, scale};
  for (double f : freq_factors) {
    if (!(f > 0) || !std::isfinite(f)) throw UsageError("rope: frequency factors must be positive, got " + std::to_string(f));
    reals.push_back(f);
  }
  return ops::rope_apply(x, positions, static_cast<int64_t>(mode), false, dims, std::move(reals));
}

Tensor rope(const Tensor& x, int64_t offset, double base, RopeMode mode, const std::vector<double>& freq_factors,
            int64_t dims, double scale) {
  if (!x.defined()) throw UsageError("rope: x is an undefined tensor");
  if (x.rank() < 2)
    throw ShapeError("rope: x must be [..., T, D] with D even, got " + to_string(x.shape()));
  std::vector<int32_t> pos(static_cast<size_t>(x.dim(-2)));
  for (size_t t = 0; t < pos.size(); ++t)
    pos[t] = static_cast<int32_t>(offset + static_cast<int64_t>(t));
  return rope(x, Tensor::from_vector<int32_t>({x.dim(-2)}, pos), base, mode, freq_factors, dims, scale);
}

}  // namespace nabla
