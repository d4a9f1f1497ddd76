// Shared machinery of elementwise ops: shape rules and kernels written once
// over a functor, so an elementwise op file holds only its math.
#pragma once

#include <cmath>

#include "backend/cpu/strided.h"
#include "core/op.h"

namespace nabla::ops {

// Elements per parallel chunk: fixed, so results never depend on threads.
inline constexpr int64_t kElementwiseGrain = 1 << 14;

Meta infer_unary(const char* op, const std::vector<Tensor>& in);
Meta infer_binary(const char* op, const std::vector<Tensor>& in);

// out[i] = f(x[i])
template <class T, class F>
void unary_kernel(const KernelArgs& a, F f) {
  const TensorView& x = a.in[0];
  T* out = a.out.ptr<T>();
  const T* xp = x.ptr<T>();
  int64_t n = a.out.numel();
  if (x.contiguous) {
    a.parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = f(xp[i]);
    });
    return;
  }
  Strides os = contiguous_strides(a.out.shape);
  cpu::Walker<2> w(a.out.shape, {&os, &x.strides});
  a.parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    w.run(b, e, [&](const std::array<int64_t, 2>& o, int64_t len, const std::array<int64_t, 2>& s) {
      T* op = out + o[0];
      const T* ip = xp + o[1];
      for (int64_t i = 0; i < len; ++i) op[i] = f(ip[i * s[1]]);
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
