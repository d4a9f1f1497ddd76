// Shared machinery of reductions over a set of axes (sum, mean, max).
// attrs.ints = {keepdim, axis...} with the axes sorted and non-negative.
#pragma once

#include <algorithm>

#include "backend/cpu/strided.h"
#include "backend/cpu/thread_pool.h"
#include "core/op.h"

namespace nabla::ops {

Attrs reduce_attrs(const char* op, const Tensor& x, std::vector<int64_t> axes, bool keepdim);
Meta infer_reduce(const char* op, const std::vector<Tensor>& in, const Attrs& attrs);
std::vector<int64_t> reduce_axes(const Attrs& attrs);
bool reduce_keepdim(const Attrs& attrs);
// The reduced result's shape with the reduced axes kept as 1, e.g. to expand
// a gradient back over them.
Shape keepdim_shape(const Shape& in, const Attrs& attrs);

// out[j] = R::finish(fold of R::step over the reduced elements of j, count).
// Each output element is reduced by one thread, in a fixed order.
template <class T, class R>
void reduce_kernel(const KernelArgs& a, R r) {
  const TensorView& x = a.in[0];
  std::vector<int64_t> axes = reduce_axes(*a.attrs);
  std::vector<bool> reduced(x.shape.size(), false);
  for (int64_t ax : axes) reduced[ax] = true;
  Shape kept_shape, red_shape;
  Strides kept_strides, red_strides;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    (reduced[d] ? red_shape : kept_shape).push_back(x.shape[d]);
    (reduced[d] ? red_strides : kept_strides).push_back(x.strides[d]);
  }
  int64_t count = numel(red_shape);
  cpu::Walker<1> kept(kept_shape, {&kept_strides});
  cpu::Walker<1> red(red_shape, {&red_strides});
  const T* xp = x.ptr<T>();
  T* out = a.out.ptr<T>();
  if (!x.shape.empty() && !reduced.back() && count > 1) {
    // The innermost axis is kept (a bias gradient: sum over rows): walk the
    // reduced positions outermost and add whole rows of outputs at a time.
    // Every output still folds its elements in the same order as below.
    // Chunks of >= 64 outputs keep the row walk's overhead small.
    const int64_t grain = std::max<int64_t>(64, cpu::grain_for(count));
    a.parallel_for(a.out.numel(), grain, [&](int64_t b, int64_t e) {
      std::vector<decltype(r.init())> acc(size_t(e - b), r.init());
      // The chunk's runs of outputs, walked once rather than once per row.
      struct Run {
        int64_t offset, n, stride;
      };
      std::vector<Run> runs;
      kept.run(b, e, [&](const std::array<int64_t, 1>& o, int64_t n, const std::array<int64_t, 1>& s) {
        runs.push_back({o[0], n, s[0]});
      });
      red.run(0, count, [&](const std::array<int64_t, 1>& ro, int64_t rn, const std::array<int64_t, 1>& rs) {
        for (int64_t k = 0; k < rn; ++k) {
          const T* base = xp + ro[0] + k * rs[0];
          auto* q = acc.data();
          for (const Run& u : runs) {
            const T* p = base + u.offset;
            if (u.stride == 1) {  // a plain loop the compiler vectorises
              for (int64_t i = 0; i < u.n; ++i) q[i] = r.step(q[i], p[i]);
            } else {
              for (int64_t i = 0; i < u.n; ++i) q[i] = r.step(q[i], p[i * u.stride]);
            }
            q += u.n;
          }
        }
      });
      for (int64_t j = b; j < e; ++j) out[j] = static_cast<T>(r.finish(acc[j - b], count));
    });
    return;
  }
  int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, count));
  a.parallel_for(a.out.numel(), grain, [&](int64_t b, int64_t e) {
    int64_t j = b;  // runs arrive in row-major order of the output
    kept.run(b, e, [&](const std::array<int64_t, 1>& o, int64_t n, const std::array<int64_t, 1>& s) {
      for (int64_t i = 0; i < n; ++i) {
        const T* base = xp + o[0] + i * s[0];
        auto acc = r.init();
        red.run(0, count, [&](const std::array<int64_t, 1>& ro, int64_t rn, const std::array<int64_t, 1>& rs) {
          const T* p = base + ro[0];
          for (int64_t k = 0; k < rn; ++k) acc = r.step(acc, p[k * rs[0]]);
        });
        out[j++] = static_cast<T>(r.finish(acc, count));
      }
    });
  });
}

}  // namespace nabla::ops
