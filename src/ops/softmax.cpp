// softmax: softmax(scale * x + mask) over the last axis.
// x [..., Tq, Tk]; mask: additive, broadcastable to x (-inf hides a position);
// causal hides positions j > i + (Tk - Tq) of the last two axes, so the last
// query sees every key (the KV-cache convention).
// inputs: x, mask (a scalar 0 when the caller gives none); attrs: ints {causal},
// reals {scale}. A row with every position hidden gives NaN, as the composite
// (and PyTorch) does.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cpu/kernel.h"
#include "backend/cpu/simd.h"
#include "ops/internal_ops.h"
#include "ops/last_axis.h"

namespace nabla {
namespace ops {
namespace {

Meta softmax_infer(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &mask = in[1];
  require_floating("softmax", x, "x");
  require_same_dtype("softmax", x, mask);
  if (x.rank() < 1) throw ShapeError("softmax: x must have at least 1 axis, got a scalar");
  if (attrs.ints[0] && x.rank() < 2) {
    throw ShapeError("softmax: causal needs x of rank >= 2 ([..., Tq, Tk]), got " +
                     to_string(x.shape()));
  }
  if (broadcast_shapes(x.shape(), mask.shape(), "softmax") != x.shape()) {
    throw ShapeError("softmax: mask " + to_string(mask.shape()) + " does not broadcast to x " +
                     to_string(x.shape()));
  }
  return {x.dtype(), x.shape()};
}


// z = scale x + mask over a row's visible positions, written to y (then
// softmaxed in place), and its max, taken on the way: one pass fewer.
float scores_row_f32(const float* x, int64_t xs, const float* m, int64_t ms, float scale, int64_t visible,
                     float* y) {
  using cpu::VecF;
  constexpr int W = VecF::kWidth;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  VecF vmax = kNegInf;
  int64_t j = 0;
  if (xs == 1 && ms == 0) {  // the usual case: a contiguous row, a scalar (or no) mask
    const VecF mv = *m;
    for (; j + W <= visible; j += W) {
      const VecF z = cpu::fma(VecF::load(x + j), scale, mv);
      z.store(y + j);
      vmax = max(vmax, z);
    }
  }
  for (; j < visible; j += W) {
    const int64_t n = std::min<int64_t>(W, visible - j);
    const VecF z = cpu::fma(VecF::load(x + j * xs, xs, n), scale, VecF::load(m + j * ms, ms, n));
    z.store(y + j, n);
    vmax = max(vmax, cpu::select(cpu::first_lanes(n), z, kNegInf));
  }
  return cpu::reduce_max(vmax);
}

// f32 rows waiting to be softmaxed kRows at a time, their latency chains
// interleaved: rows of at most one vector (attention over up to 16 keys) as
// their z, for cpu::softmax_one_vector_rows; longer ones as z written to y
// and its max, for cpu::softmax_rows. Contiguous rows with a scalar mask
// that fit in registers do not wait: cpu::softmax_rows_held takes them at
// once.
class RowBlockF32 {
 public:
  static constexpr int kRows = 4;
  RowBlockF32(int64_t len, float scale) : len_(len), scale_(scale) {}
  // y = the softmax of scale x + m over the row's first `visible` positions
  // (x and m with strides xs and ms), once the block is full or flushed.
  void add(const float* x, int64_t xs, const float* m, int64_t ms, int64_t visible, float* y) {
    using cpu::VecF;
    if (len_ <= VecF::kWidth) {
      z_[n_] = cpu::fma(VecF::load(x, xs, visible), scale_, VecF::load(m, ms, visible));
    } else if (xs == 1 && ms == 0 && visible <= cpu::kSoftmaxHeldVectors * VecF::kWidth) {
      return cpu::softmax_rows_held<1, false>(&x, scale_, *m, &visible, len_, &y);  // rows that came by the walker
    } else {
      max_[n_] = scores_row_f32(x, xs, m, ms, scale_, visible, y);
    }
    visible_[n_] = visible;
    y_[n_] = y;
    if (++n_ == kRows) flush();
  }
  void flush() {
    if (n_ == 0) return;
    if (len_ <= cpu::VecF::kWidth) {
      cpu::softmax_one_vector_rows<kRows>(z_.data(), visible_.data(), y_.data(), n_, len_);
    } else {
      cpu::softmax_rows<kRows>(y_.data(), visible_.data(), n_, len_, 1.0f, max_.data());
    }
    n_ = 0;
  }

 private:
  int64_t len_;
  float scale_;
  int n_ = 0;
  std::array<cpu::VecF, kRows> z_;
  std::array<int64_t, kRows> visible_;
  std::array<float*, kRows> y_;
  std::array<float, kRows> max_;
};

template <class T>
void softmax_kernel(const KernelArgs& a) {
  const TensorView &x = a.in[0], &m = a.in[1];
  const Shape& shape = a.out.shape;
  bool causal = a.attrs->ints[0] != 0;
  double scale = a.attrs->reals[0];
  int64_t tq = shape.size() >= 2 ? shape[shape.size() - 2] : 1;
  if constexpr (std::is_same_v<T, float>) {
    // Contiguous rows and a scalar (or no) mask: rows taken in memory order,
    // in RowBlockF32's blocks, without the row walker. Rows of one vector
    // (attention over up to 16 keys) with no causal window go 16 at a time,
    // transposed, where the vectors are 16 wide.
    const int64_t n_len = shape.empty() ? 1 : shape.back();
    if (x.contiguous && m.numel() == 1 && n_len > 0) {
      using cpu::VecF;
      const float* xp = x.ptr<float>();
      float* out = a.out.ptr<float>();
      const float mask = *m.ptr<float>(), s = float(scale);
      const int64_t n_rows = a.out.numel() / n_len;
      a.parallel_for(n_rows, row_grain(n_len), [&](int64_t b, int64_t e) {
        int64_t r = b;
#if defined(__AVX512F__)
        if (!causal && n_len <= VecF::kWidth) {
          std::array<VecF, 16> z;
          std::array<int64_t, 16> visible;
          std::array<float*, 16> y;
          visible.fill(n_len);
          for (; r + 16 <= e; r += 16) {
            for (int i = 0; i < 16; ++i) {
              z[i] = cpu::fma(VecF::load(xp + (r + i) * n_len, 1, n_len), s, mask);
              y[i] = out + (r + i) * n_len;
            }
            cpu::softmax_one_vector_16_rows(z.data(), visible.data(), y.data(), n_len);
          }
        }
#endif
        // The rows two blocks ahead, x for reading and y for writing: the
        // hardware prefetcher alone falls behind on rows from memory
        // (docs/performance.md). Rows that fit in registers go two at a time
        // where they take the same number of vectors.
        constexpr int64_t kRows = RowBlockF32::kRows, kAheadRows = 2 * kRows;
        const auto visible = [&](int64_t i) { return causal ? causal_visible(i % tq, tq, n_len) : n_len; };
        RowBlockF32 block(n_len, s);
        for (; r < e; r += kRows) {
          if (r + kAheadRows < e) {
            const int64_t end = std::min(e, r + kAheadRows + kRows) * n_len;
            for (int64_t o = (r + kAheadRows) * n_len; o < end; o += 16) {
              __builtin_prefetch(xp + o);
              __builtin_prefetch(out + o, 1);
            }
          }
          const int64_t stop = std::min(e, r + kRows);
          for (int64_t i = r; i < stop; ++i) {
            if (n_len > VecF::kWidth) {
              i = cpu::softmax_held_rows<false>(xp, out, n_len, i, stop, n_len, s, mask, visible);
            }
            if (i < stop) block.add(xp + i * n_len, 1, &mask, 0, visible(i), out + i * n_len);
          }
        }
        block.flush();
      });
      return;
    }
  }
  RowWalker<2> rows(shape, {x.strides, cpu::broadcast_strides(m.shape, m.strides, shape)});
  int64_t len = rows.len(), xs = rows.inner(0), ms = rows.inner(1);
  const T *xp = x.ptr<T>(), *mp = m.ptr<T>();
  T* out = a.out.ptr<T>();
  a.parallel_for(rows.rows(), row_grain(len), [&](int64_t b, int64_t e) {
    RowBlockF32 block(len, float(scale));  // f32 rows
    rows.run(b, e, [&](int64_t r, const std::array<int64_t, 2>& o) {
      const T *xr = xp + o[0], *mr = mp + o[1];
      T* y = out + r * len;
      int64_t visible = causal ? causal_visible(r % tq, tq, len) : len;
      if constexpr (std::is_same_v<T, float>) {
        return block.add(xr, xs, mr, ms, visible, y);
      }
      auto z = [&](int64_t j) { return double(xr[j * xs]) * scale + double(mr[j * ms]); };
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        double v = z(j);
        mx = (v > mx || v != v) ? v : mx;
      }
      if (mx == -std::numeric_limits<double>::infinity()) {
        // Every position hidden: 0/0, NaN as in the composite.
        std::fill(y, y + len, std::numeric_limits<T>::quiet_NaN());
        return;
      }
      // Subtracting the row max keeps exp() in range.
      double total = 0;
      for (int64_t j = 0; j < visible; ++j) {
        double ej = std::exp(z(j) - mx);
        y[j] = static_cast<T>(ej);
        total += ej;
      }
      for (int64_t j = 0; j < visible; ++j) y[j] = static_cast<T>(double(y[j]) / total);
      for (int64_t j = visible; j < len; ++j) y[j] = T(0);
    });
    block.flush();
  });
}

void softmax_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "softmax", [&]<class T>() { softmax_kernel<T>(a); });
}

// dx = scale * y * (dy - sum(dy * y)); the mask is a constant.
Grads softmax_backward(const BackwardArgs& g) {
  return {softmax_back(g.out, g.dout, g.attrs.reals[0]), Tensor()};
}

// i32 [tq, tk]: 1 where a query may see a key under the causal rule.
Tensor causal_keep(int64_t tq, int64_t tk) {
  std::vector<int32_t> keep(static_cast<size_t>(tq * tk));
  for (int64_t i = 0; i < tq; ++i) {
    for (int64_t j = 0; j < tk; ++j) keep[i * tk + j] = j < causal_visible(i, tq, tk) ? 1 : 0;
  }
  return Tensor::from_vector<int32_t>({tq, tk}, keep);
}

Tensor softmax_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  Tensor z = in[0] * attrs.reals[0] + in[1];
  if (attrs.ints[0]) {
    z = where(causal_keep(z.dim(-2), z.dim(-1)), z,
              scalar_like(-std::numeric_limits<double>::infinity(), z));
  }
  Tensor e = exp(z - max(z, {-1}, true));
  return e / sum(e, {-1}, true);
}

// A mask of 0 and -inf for x [2, 2, 3, 4], broadcast over axis 1; every row
// keeps at least one position.
Tensor inf_mask(const Tensor& like) {
  std::vector<int32_t> keep = {1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 1,  //
                               0, 0, 0, 1, 1, 1, 0, 1, 1, 0, 1, 0};
  Tensor cond = Tensor::from_vector<int32_t>({2, 1, 3, 4}, keep);
  return where(cond, scalar_like(0.0, like),
               scalar_like(-std::numeric_limits<double>::infinity(), like));
}

std::vector<GradCase> softmax_cases() {
  using X = const std::vector<Tensor>&;
  return {
      {"matrix", {normal({3, 5})}, [](X x) { return softmax(x[0]); }},
      {"vector", {normal({6})}, [](X x) { return softmax(x[0]); }},
      {"rank3_scaled", {normal({2, 3, 4})}, [](X x) { return softmax(x[0], 0.7); }},
      {"finite_mask",
       {normal({2, 3, 4}), constant(normal({3, 4}))},
       [](X x) { return softmax(x[0], 1.3, x[1]); }},
      {"inf_mask", {normal({2, 2, 3, 4})}, [](X x) { return softmax(x[0], 0.5, inf_mask(x[0])); }},
      {"causal", {normal({2, 3, 3})}, [](X x) { return softmax(x[0], 1.0, Tensor(), true); }},
      {"causal_more_keys_masked",
       {normal({2, 3, 5}), constant(normal({2, 1, 5}))},
       [](X x) { return softmax(x[0], 0.8, x[1], true); }},
  };
}

}  // namespace

extern const OpDef op_softmax{
    .name = "softmax",
    .summary = "softmax(scale * x + mask) over the last axis; additive and causal masks",
    .inputs = {{"x", Diff::yes}, {"mask", Diff::no}},
    .fused = true,
    .infer = softmax_infer,
    .backward = softmax_backward,
    .composite = softmax_composite,
    .cases = softmax_cases,
};
NABLA_CPU_KERNEL(op_softmax, softmax_forward);

}  // namespace ops

Tensor softmax(const Tensor& x, double scale, const Tensor& mask, bool causal) {
  if (!x.defined()) throw UsageError("softmax: x is an undefined tensor");
  Tensor m = mask.defined() ? mask : Tensor::scalar(0.0, x.dtype());
  return apply(ops::op_softmax, {x, m}, Attrs{{causal ? 1 : 0}, {scale}});
}

}  // namespace nabla
