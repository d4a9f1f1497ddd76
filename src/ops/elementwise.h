// Shared machinery of elementwise ops: shape rules and kernels written once
// over a functor, so an elementwise op file holds only its math.
#pragma once

#include <cmath>
#include <concepts>
#include <type_traits>

#include "backend/cpu/kernel.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/strided.h"
#include "backend/cpu/thread_pool.h"
#include "core/op.h"

namespace nabla::ops {

// Elements per parallel chunk: fixed, so results never depend on threads;
// an op smaller than one chunk runs inline.
inline constexpr int64_t kElementwiseGrain = cpu::kMinChunkWork;

// A functor may add a SIMD form of its f32 math, `cpu::VecF vec(cpu::VecF)`
// (unary) or `vec(cpu::VecF, cpu::VecF)` (binary); the f32 kernel then runs
// it on every layout (strided operands are gathered into vectors), and f64,
// the gradient checks' reference, keeps the scalar operator().
template <class F>
concept VecUnary = requires(const F& f, cpu::VecF v) {
  { f.vec(v) } -> std::convertible_to<cpu::VecF>;
};
template <class F>
concept VecBinary = requires(const F& f, cpu::VecF v) {
  { f.vec(v, v) } -> std::convertible_to<cpu::VecF>;
};

Meta infer_unary(const char* op, const std::vector<Tensor>& in);
Meta infer_binary(const char* op, const std::vector<Tensor>& in);

// out[i] = f(x[i])
template <class T, class F>
void unary_kernel(const KernelArgs& a, F f) {
  const TensorView& x = a.in[0];
  T* out = a.out.ptr<T>();
  const T* xp = x.ptr<T>();
  int64_t n = a.out.numel();
  constexpr bool simd = std::is_same_v<T, float> && VecUnary<F>;
  // out[0, len) = f(in[i * stride]).
  const auto run = [&](T* op, const T* ip, int64_t stride, int64_t len) {
    if constexpr (simd) {
      cpu::map(op, ip, stride, len, [&](cpu::VecF v) { return f.vec(v); });
    } else {
      for (int64_t i = 0; i < len; ++i) op[i] = f(ip[i * stride]);
    }
  };
  if (x.contiguous) {
    a.parallel_for(n, kElementwiseGrain,
                   [&](int64_t b, int64_t e) { run(out + b, xp + b, 1, e - b); });
    return;
  }
  Strides os = contiguous_strides(a.out.shape);
  cpu::Walker<2> w(a.out.shape, {&os, &x.strides});
  a.parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 2>& o, int64_t len, const std::array<int64_t, 2>& s) {
      run(out + o[0], xp + o[1], s[1], len);
    });
  });
}

// out[i] = f(a[i], b[i]) with a and b broadcast to out's shape.
template <class T, class F>
void binary_kernel(const KernelArgs& a, F f) {
  const TensorView& x = a.in[0];
  const TensorView& y = a.in[1];
  T* out = a.out.ptr<T>();
  const T* xp = x.ptr<T>();
  const T* yp = y.ptr<T>();
  int64_t n = a.out.numel();
  if constexpr (std::is_same_v<T, float> && VecBinary<F>) {
    const auto vf = [&](cpu::VecF u, cpu::VecF v) { return f.vec(u, v); };
    if (x.contiguous && y.contiguous && x.shape == a.out.shape && y.shape == a.out.shape) {
      a.parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
        cpu::map(out + b, xp + b, 1, yp + b, 1, e - b, vf);
      });
      return;
    }
    Strides os = contiguous_strides(a.out.shape);
    Strides xs = cpu::broadcast_strides(x.shape, x.strides, a.out.shape);
    Strides ys = cpu::broadcast_strides(y.shape, y.strides, a.out.shape);
    cpu::Walker<3> w(a.out.shape, {&os, &xs, &ys});
    a.parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      w.run(b, e,
            [&](const std::array<int64_t, 3>& o, int64_t len, const std::array<int64_t, 3>& s) {
              cpu::map(out + o[0], xp + o[1], s[1], yp + o[2], s[2], len, vf);
            });
    });
    return;
  }
  if (x.contiguous && y.contiguous && x.shape == a.out.shape && y.shape == a.out.shape) {
    a.parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = f(xp[i], yp[i]);
    });
    return;
  }
  Strides os = contiguous_strides(a.out.shape);
  Strides xs = cpu::broadcast_strides(x.shape, x.strides, a.out.shape);
  Strides ys = cpu::broadcast_strides(y.shape, y.strides, a.out.shape);
  cpu::Walker<3> w(a.out.shape, {&os, &xs, &ys});
  a.parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 3>& o, int64_t len, const std::array<int64_t, 3>& s) {
      T* op = out + o[0];
      const T* ap = xp + o[1];
      const T* bp = yp + o[2];
      if (s[1] == 1 && s[2] == 1) {
        for (int64_t i = 0; i < len; ++i) op[i] = f(ap[i], bp[i]);
      } else if (s[1] == 1 && s[2] == 0) {
        const T bv = *bp;
        for (int64_t i = 0; i < len; ++i) op[i] = f(ap[i], bv);
      } else {
        for (int64_t i = 0; i < len; ++i) op[i] = f(ap[i * s[1]], bp[i * s[2]]);
      }
    });
  });
}

// Forward entry points for an OpDef: F is a functor with a templated call.
template <class F>
void unary_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "unary", [&]<class T>() { unary_kernel<T>(a, F{}); });
}
template <class F>
void binary_forward(const KernelArgs& a) {
  dispatch_floating(a.out.dtype, "binary", [&]<class T>() { binary_kernel<T>(a, F{}); });
}

// Cases every unary op shares: plain, 3-d, scalar. `lo`/`hi` bound the inputs
// (uniform) where the op's domain needs it; otherwise normal.
std::vector<GradCase> unary_cases(Tensor (*f)(const Tensor&), double lo = 0, double hi = 0);
// Cases every binary op shares: equal shapes, a row broadcast, both operands
// broadcast, a scalar operand. b is drawn from U(b_lo, b_hi) when b_lo < b_hi.
std::vector<GradCase> binary_cases(Tensor (*f)(const Tensor&, const Tensor&), double b_lo = 0,
                                   double b_hi = 0);

}  // namespace nabla::ops
