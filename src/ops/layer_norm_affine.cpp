// layer_norm_affine: layer_norm(x) * gamma + beta in one pass over x (the
// form every transformer block uses), and its fused backward:
//
//   x, y, dy [..., C]; gamma, beta [C]; xhat = (x - mean) * rstd per row
//   layer_norm_affine_back: flat [dx (x's shape), dgamma [C], dbeta [C]]
//     dx = layer_norm_back(x, dy * gamma) = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma
//     dgamma = sum over rows of dy xhat, dbeta = sum over rows of dy
//   layer_norm_affine_back_add(x, dy, gamma, addend): the same with addend
//     (x's shape) added to dx: in a pre-norm block x also feeds the residual
//     sum, whose gradient the backward adds here, as it writes dx, instead
//     of in a pass of its own over both.
//
// Composed, the same step is eight passes over the activations (normalise,
// scale, shift; then dy * gamma, layer_norm_back, dy * xhat and two column
// sums) and keeps xhat alive for the backward; fused, x is read once
// forward, and x and dy once backward, where each row's mean and rstd are
// recomputed (a row's statistics are a chain of dependent reductions, the
// cost that dominates at widths of 96 to 384).
#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernel.h"
#include "backend/cpu/simd.h"
#include "nabla/graph.h"
#include "ops/internal_ops.h"
#include "ops/norm.h"

namespace nabla {
namespace ops {
namespace {

// A [C] parameter as a contiguous array (copied once when strided).
template <class T>
const T* param(const TensorView& p, std::vector<T>& buf) {
  const int64_t n = p.shape[0], s = p.strides[0];
  if (s == 1) return p.ptr<T>();
  buf.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) buf[i] = p.ptr<T>()[i * s];
  return buf.data();
}

// x [..., C] with gamma, beta [C] (dy, if any, x's shape).
Meta affine_infer(const char* op, const std::vector<Tensor>& in, const Attrs& attrs, size_t n_rows_inputs) {
  Meta m = infer_norm(op, std::vector<Tensor>(in.begin(), in.begin() + n_rows_inputs), attrs);
  for (size_t i = n_rows_inputs; i < in.size(); ++i) {
    check_norm_param(op, i == n_rows_inputs ? "gamma" : "beta", in[i], in[0]);
  }
  return m;
}

// ---- layer_norm_affine(x, gamma, beta)

template <class T>
void affine_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  std::vector<T> gbuf, bbuf;
  const T* gamma = param<T>(a.in[1], gbuf);
  const T* beta = param<T>(a.in[2], bbuf);
  const T* xp = x.ptr<T>();
  T* out = a.out.ptr<T>();
  const int64_t cols = a.out.shape.back(), sx = x.strides.back();
  const double eps = norm_eps(*a.attrs);
  if constexpr (std::is_same_v<T, float>) {
    using cpu::VecF;
    constexpr int64_t W = VecF::kWidth;
    for_each_row_stats_f32(a, eps, [&](int64_t row, const float* x, RowStats<float> st) {
      float* y = out + row * cols;
      const auto at = [&](int64_t j, int64_t n) {
        const VecF xhat = (VecF::load(x + j, 1, n) - st.mean) * st.rstd;
        cpu::fma(xhat, VecF::load(gamma + j, 1, n), VecF::load(beta + j, 1, n)).store(y + j, n);
      };
      // Whole vectors apart from the tail, so that no load or store asks
      // whether it is partial.
      int64_t j = 0;
      for (; j + W <= cols; j += W) at(j, W);
      if (j < cols) at(j, cols - j);
    });
  } else {
    for_each_row<1>(a, [&](int64_t row, const std::array<int64_t, 1>& off) {
      std::vector<T> x(static_cast<size_t>(cols));
      for (int64_t j = 0; j < cols; ++j) x[j] = xp[off[0] + j * sx];
      const RowStats<T> st = row_stats(x.data(), cols, eps);
      T* y = out + row * cols;
      for (int64_t j = 0; j < cols; ++j) y[j] = (x[j] - st.mean) * st.rstd * gamma[j] + beta[j];
    });
  }
}

void affine_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "layer_norm_affine", [&]<class T>() { affine_kernel<T>(a); });
}

Tensor affine_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  return layer_norm(in[0], norm_eps(attrs)) * in[1] + in[2];
}

// dx, dgamma and dbeta from one kernel, as slices of its flat result. (The
// CPU backend's rewrite adds a residual branch's gradient of x in the same
// kernel: layer_norm_affine_back_add.)
Grads affine_backward(const BackwardArgs& g) {
  const Tensor &x = g.inputs[0], &gamma = g.inputs[1];
  Tensor flat = layer_norm_affine_back(x, g.dout, gamma, norm_eps(g.attrs));
  const int64_t n = x.numel(), c = x.dim(-1);
  return {reshape(slice(flat, 0, 0, n), x.shape()), slice(flat, 0, n, n + c), slice(flat, 0, n + c, n + 2 * c)};
}

std::vector<GradCase> affine_cases() {
  using V = std::vector<Tensor>;
  return {
      {"rank3", {normal({2, 3, 4}), normal({4}), normal({4})},
       [](const V& x) { return layer_norm(x[0], x[1], x[2], 1e-5); }},
      // A large common offset: the two-pass variance must not cancel. gamma
      // gets a fixed ramp so that the broadcast layout (x's rows alike, gamma
      // and dy constant along C) does not make every x gradient exactly 0,
      // which finite differences at offset 100 resolve only to ~1e-7.
      {"offset_rows", {normal({3, 5}), normal({5}), normal({5})},
       [](const V& x) {
         const std::vector<double> r{0.5, 0.75, 1.0, 1.25, 1.5};
         Tensor ramp = x[1].dtype() == DType::f64 ? Tensor::from_vector<double>({5}, r)
                                                  : Tensor::from_vector<float>({5}, {r.begin(), r.end()});
         return layer_norm(x[0] + 100.0, x[1] + ramp, x[2], 1e-5);
       }},
      {"large_eps", {normal({4, 6}), normal({6}), normal({6})},
       [](const V& x) { return layer_norm(x[0], x[1], x[2], 0.5); }},
      // x also feeds a residual sum, whose gradient reaches x first: the
      // backward adds it in layer_norm_affine_back_add.
      {"residual", {normal({2, 3, 4}), normal({4}), normal({4})},
       [](const V& x) { return x[0] + layer_norm(x[0], x[1], x[2], 1e-5); }},
  };
}

// ---- layer_norm_affine_back(x, dy, gamma[, addend]) -> [dx..., dgamma..., dbeta...]

// Rows per task, each with its own partial sums of dgamma and dbeta: fixed,
// so the order of those sums never depends on the threads.
constexpr int64_t kRowsPerTask = 64;

template <class T>
void affine_back_kernel(const KernelArgs& a) {
  const TensorView &x = a.in[0], &dy = a.in[1];
  const TensorView* addend = a.in.size() > 3 ? &a.in[3] : nullptr;
  std::vector<T> gbuf;
  const T* gamma = param<T>(a.in[2], gbuf);
  const int64_t cols = x.shape.back();
  const Shape outer(x.shape.begin(), x.shape.end() - 1);
  const int64_t rows = numel(outer);
  // Each row's offset in x, dy and the addend.
  const std::vector<int64_t> xo = cpu::position_offsets(outer, Strides(x.strides.begin(), x.strides.end() - 1));
  const std::vector<int64_t> dyo = cpu::position_offsets(outer, Strides(dy.strides.begin(), dy.strides.end() - 1));
  const std::vector<int64_t> ado =
      addend ? cpu::position_offsets(outer, Strides(addend->strides.begin(), addend->strides.end() - 1))
             : std::vector<int64_t>();
  const int64_t sx = x.strides.back(), sd = dy.strides.back(), sa = addend ? addend->strides.back() : 1;
  const double eps = norm_eps(*a.attrs);
  T* dx = a.out.ptr<T>();
  T* dparams = dx + rows * cols;  // dgamma [C], then dbeta [C]
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  std::vector<T> partial(static_cast<size_t>(std::max<int64_t>(tasks, 1) * 2 * cols), T(0));
  a.parallel_for(tasks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> xbuf, dbuf, abuf;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * kRowsPerTask, n_rows = std::min(rows, r0 + kRowsPerTask) - r0;
      // The task's rows of x, dy and the addend, contiguous (gathered when strided).
      std::array<const T*, kRowsPerTask> xr{}, dr{}, ar{};
      // Row i of an operand at `base` (row offsets `off`, column stride s),
      // gathered into buf when s is not 1.
      const auto row = [&](const T* base, const std::vector<int64_t>& off, int64_t s, std::vector<T>& buf,
                           int64_t i) {
        const T* r = base + off[r0 + i];
        if (s == 1) return r;
        for (int64_t j = 0; j < cols; ++j) buf[i * cols + j] = r[j * s];
        return static_cast<const T*>(buf.data() + i * cols);
      };
      for (auto [s, buf] : {std::pair{sx, &xbuf}, std::pair{sd, &dbuf}, std::pair{sa, &abuf}}) {
        if (s != 1) buf->resize(static_cast<size_t>(n_rows * cols));
      }
      for (int64_t i = 0; i < n_rows; ++i) {
        xr[i] = row(x.ptr<T>(), xo, sx, xbuf, i);
        dr[i] = row(dy.ptr<T>(), dyo, sd, dbuf, i);
        if (addend) ar[i] = row(addend->ptr<T>(), ado, sa, abuf, i);
      }
      // The task's partial sums of dgamma and dbeta, in row order.
      T* pg = partial.data() + t * 2 * cols;
      T* pb = pg + cols;
      if constexpr (std::is_same_v<T, float>) {
        using cpu::VecF;
        // In a training step the task's rows come from memory: each block's
        // rows are requested two blocks ahead of its statistics, so that their
        // misses do not queue behind a whole task's (docs/performance.md).
        const auto fetch = [&](int64_t i) {
          for (int64_t j = 0; j < cols; j += 16) {
            __builtin_prefetch(xr[i] + j);
            __builtin_prefetch(dr[i] + j);
            if (addend) __builtin_prefetch(ar[i] + j);
          }
        };
        constexpr int64_t kAhead = 2 * kRowBlock;
        for (int64_t i = 0; i < std::min(n_rows, kAhead); ++i) fetch(i);
        // The block's dx while its rows are in L1, and its terms of dgamma and
        // dbeta added in row order.
        // N > 0: a full block of N rows, their count known to the compiler,
        // which then keeps the rows' pointers and statistics in registers
        // (with a run-time count g++ reloads them from the stack every vector).
        const auto block_dx = [&]<int N, bool Add>(std::integral_constant<int, N>, std::bool_constant<Add>, int64_t i0,
                                                   int n) {
          // Per row: mean, rstd, mean(g) and mean(g xhat), g = dy gamma.
          std::array<RowStats<float>, kRowBlock> st;
          std::array<float, kRowBlock> mean_g, mean_gx;
          backward_means_f32<true>(xr.data() + i0, dr.data() + i0, gamma, n, cols, eps, st.data(), mean_g.data(),
                                   mean_gx.data());
          std::array<const float*, kRowBlock> xb{}, db{}, ab{};
          std::array<float*, kRowBlock> out{};
          for (int i = 0; i < n; ++i) {
            xb[i] = xr[i0 + i], db[i] = dr[i0 + i], ab[i] = ar[i0 + i], out[i] = dx + (r0 + i0 + i) * cols;
          }
          for (int64_t j = 0; j < cols; j += VecF::kWidth) {
            const int64_t m = std::min<int64_t>(VecF::kWidth, cols - j);
            const VecF gam = VecF::load(gamma + j, 1, m);
            VecF sg = VecF::load(pg + j, 1, m), sb = VecF::load(pb + j, 1, m);
#pragma GCC unroll 4
            for (int i = 0; i < (N > 0 ? N : n); ++i) {
              const VecF xh = (VecF::load(xb[i] + j, 1, m) - st[i].mean) * st[i].rstd;
              const VecF d = VecF::load(db[i] + j, 1, m);
              const VecF dxi = st[i].rstd * (d * gam - mean_g[i] - xh * mean_gx[i]);
              if constexpr (Add) {
                (VecF::load(ab[i] + j, 1, m) + dxi).store(out[i] + j, m);
              } else {
                dxi.store(out[i] + j, m);
              }
              sg = cpu::fma(d, xh, sg);
              sb = sb + d;
            }
            sg.store(pg + j, m);
            sb.store(pb + j, m);
          }
        };
        for (int64_t i0 = 0; i0 < n_rows; i0 += kRowBlock) {
          const int n = int(std::min<int64_t>(kRowBlock, n_rows - i0));
          for (int64_t i = i0 + kAhead; i < std::min(n_rows, i0 + kAhead + kRowBlock); ++i) fetch(i);
          const auto run = [&](auto add) {
            if (n == kRowBlock) {
              block_dx(std::integral_constant<int, kRowBlock>{}, add, i0, n);
            } else {
              block_dx(std::integral_constant<int, 0>{}, add, i0, n);
            }
          };
          addend ? run(std::true_type{}) : run(std::false_type{});
        }
      } else {
        for (int64_t i = 0; i < n_rows; ++i) {
          const RowStats<T> st = row_stats(xr[i], cols, eps);
          double sg = 0, sgx = 0;
          for (int64_t j = 0; j < cols; ++j) {
            const double gj = double(dr[i][j]) * double(gamma[j]);
            sg += gj;
            sgx += gj * double((xr[i][j] - st.mean) * st.rstd);
          }
          const T mean_g = T(sg / double(cols)), mean_gx = T(sgx / double(cols));
          for (int64_t j = 0; j < cols; ++j) {
            const T xh = (xr[i][j] - st.mean) * st.rstd;
            const T dxj = T(double(st.rstd) *
                            (double(dr[i][j]) * double(gamma[j]) - double(mean_g) - double(xh) * double(mean_gx)));
            dx[(r0 + i) * cols + j] = addend ? ar[i][j] + dxj : dxj;
            pg[j] += dr[i][j] * xh;
            pb[j] += dr[i][j];
          }
        }
      }
    }
  });
  for (int64_t j = 0; j < 2 * cols; ++j) {
    T s = T(0);
    for (int64_t t = 0; t < tasks; ++t) s += partial[t * 2 * cols + j];
    dparams[j] = s;
  }
}

void affine_back_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "layer_norm_affine_back", [&]<class T>() { affine_back_kernel<T>(a); });
}

// x, dy, gamma and (the _add form) an addend of x's shape.
Meta back_infer(const char* op, const std::vector<Tensor>& in, const Attrs& attrs) {
  Meta m = affine_infer(op, {in[0], in[1], in[2]}, attrs, 2);
  if (in.size() > 3) {
    require_same_dtype(op, in[0], in[3]);
    if (in[3].shape() != in[0].shape()) {
      throw ShapeError(std::string(op) + ": addend must have x's shape " + to_string(in[0].shape()) + ", got " +
                       to_string(in[3].shape()));
    }
  }
  return {m.dtype, {in[0].numel() + 2 * in[0].dim(-1)}};
}

Tensor affine_back_composite(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor &x = in[0], &dy = in[1], &gamma = in[2];
  std::vector<int64_t> rows;
  for (int64_t i = 0; i + 1 < x.rank(); ++i) rows.push_back(i);
  const double eps = norm_eps(attrs);
  Tensor dx = layer_norm_back(x, dy * gamma, eps);
  if (in.size() > 3) dx = in[3] + dx;
  return concat({reshape(dx, {-1}), reshape(sum(dy * layer_norm(x, eps), rows), {-1}), reshape(sum(dy, rows), {-1})},
                0);
}

std::vector<GradCase> affine_back_cases() {
  using V = std::vector<Tensor>;
  return {
      {"rank3", {normal({2, 3, 4}), normal({2, 3, 4}), normal({4})},
       [](const V& x) { return layer_norm_affine_back(x[0], x[1], x[2], 1e-5); }},
      {"large_eps", {normal({4, 6}), normal({4, 6}), normal({6})},
       [](const V& x) { return layer_norm_affine_back(x[0], x[1], x[2], 0.5); }},
      // More rows than one task's partial sums hold.
      {"many_rows", {normal({70, 3}), normal({70, 3}), normal({3})},
       [](const V& x) { return layer_norm_affine_back(x[0], x[1], x[2], 1e-5); }},
  };
}

std::vector<GradCase> affine_back_add_cases() {
  using V = std::vector<Tensor>;
  return {
      {"rank3", {normal({2, 3, 4}), normal({2, 3, 4}), normal({4}), normal({2, 3, 4})},
       [](const V& x) { return layer_norm_affine_back(x[0], x[1], x[2], 1e-5, x[3]); }},
      {"many_rows", {normal({70, 3}), normal({70, 3}), normal({3}), normal({70, 3})},
       [](const V& x) { return layer_norm_affine_back(x[0], x[1], x[2], 1e-5, x[3]); }},
  };
}

}  // namespace

extern const OpDef op_layer_norm_affine{
    .name = "layer_norm_affine",
    .summary = "layer_norm(x) * gamma + beta in one pass; fused",
    .inputs = {{"x", Diff::yes}, {"gamma", Diff::yes}, {"beta", Diff::yes}},
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs& at) { return affine_infer("layer_norm_affine", in, at, 1); },
    .backward = affine_backward,
    .composite = affine_composite,
    .cases = affine_cases,
};
NABLA_CPU_KERNEL(op_layer_norm_affine, affine_forward);

extern const OpDef op_layer_norm_affine_back{
    .name = "layer_norm_affine_back",
    .summary = "layer_norm_affine's gradients flat: dx = layer_norm_back(x, dy gamma), then sums of dy xhat and dy; fused",
    .inputs = {{"x", Diff::yes}, {"dy", Diff::yes}, {"gamma", Diff::yes}},
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs& at) { return back_infer("layer_norm_affine_back", in, at); },
    .composite = affine_back_composite,
    .cases = affine_back_cases,
};
NABLA_CPU_KERNEL(op_layer_norm_affine_back, affine_back_forward);

extern const OpDef op_layer_norm_affine_back_add{
    .name = "layer_norm_affine_back_add",
    .summary = "layer_norm_affine_back with addend (x's shape) added to dx as it is written: a residual's gradient; fused",
    .inputs = {{"x", Diff::yes}, {"dy", Diff::yes}, {"gamma", Diff::yes}, {"addend", Diff::yes}},
    .fused = true,
    .infer = [](const std::vector<Tensor>& in,
                const Attrs& at) { return back_infer("layer_norm_affine_back_add", in, at); },
    .composite = affine_back_composite,
    .cases = affine_back_add_cases,
};
NABLA_CPU_KERNEL(op_layer_norm_affine_back_add, affine_back_forward);

}  // namespace ops

// The fused op when both parameters are given, else a composition
// differentiated by mul/add.
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  if (x.defined()) {
    ops::check_norm_param("layer_norm", "gamma", gamma, x);
    ops::check_norm_param("layer_norm", "beta", beta, x);
  }
  if (gamma.defined() && beta.defined()) return apply(ops::op_layer_norm_affine, {x, gamma, beta}, ops::norm_attrs(eps));
  Tensor y = layer_norm(x, eps);
  if (gamma.defined()) y = y * gamma;
  if (beta.defined()) y = y + beta;
  return y;
}

Tensor layer_norm_affine_back(const Tensor& x, const Tensor& dy, const Tensor& gamma, double eps,
                              const Tensor& addend) {
  if (addend.defined()) return apply(ops::op_layer_norm_affine_back_add, {x, dy, gamma, addend}, ops::norm_attrs(eps));
  return apply(ops::op_layer_norm_affine_back, {x, dy, gamma}, ops::norm_attrs(eps));
}

}  // namespace nabla
