// Shared machinery of reductions over a set of axes (sum, mean, max).
// attrs.ints = {keepdim, axis...} with the axes sorted and non-negative.
#pragma once

#include <algorithm>

#include "backend/cpu/kernel.h"
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
    // Chunks of >= 64 outputs keep the row walk's overhead small. A long
    // reduction into few outputs (2048 tokens into 96 biases) also splits the
    // reduced positions into blocks of kBlock, so both threads get work; each
    // block folds in order into a partial, and the partials fold in block
    // order. Blocks come from the shape alone: the same bits at any thread count.
    constexpr int64_t kBlock = 256;
    const int64_t outs = a.out.numel();
    const int64_t grain = std::max<int64_t>(64, cpu::grain_for(count));
    const int64_t chunks = (outs + grain - 1) / grain;
    const int64_t blocks = chunks < 4 && count >= 2 * kBlock ? (count + kBlock - 1) / kBlock : 1;
    using Acc = decltype(r.init());
    // Folds reduced positions [r0, r1) of outputs [b, e) into acc.
    const auto fold = [&](int64_t b, int64_t e, int64_t r0, int64_t r1, Acc* acc) {
      struct Run {  // the chunk's runs of outputs, walked once rather than once per row
        int64_t offset, n, stride;
      };
      std::vector<Run> runs;
      kept.run(b, e, [&](const std::array<int64_t, 1>& o, int64_t n, const std::array<int64_t, 1>& s) {
        runs.push_back({o[0], n, s[0]});
      });
      Acc* q = acc;
      for (const Run& u : runs) {
        int64_t i = 0;
        if (u.stride == 1) {
          // kLanes outputs at a time down all the rows, their accumulators in
          // registers: a loop over rows that loads and stores its
          // accumulators in memory waits on store forwarding every row.
          constexpr int64_t kLanes = 32;
          for (; i + kLanes <= u.n; i += kLanes) {
            Acc lanes[kLanes];
            for (int64_t l = 0; l < kLanes; ++l) lanes[l] = q[i + l];
            red.run(r0, r1, [&](const std::array<int64_t, 1>& ro, int64_t rn, const std::array<int64_t, 1>& rs) {
              const T* p = xp + ro[0] + u.offset + i;
              for (int64_t k = 0; k < rn; ++k, p += rs[0]) {
                // Rows a page or more apart defeat the hardware prefetcher:
                // request the row kAhead below (the lines these lanes read).
                constexpr int64_t kAhead = 8;
                __builtin_prefetch(p + kAhead * rs[0]);
                __builtin_prefetch(p + kAhead * rs[0] + kLanes - 1);
                for (int64_t l = 0; l < kLanes; ++l) lanes[l] = r.step(lanes[l], p[l]);
              }
            });
            for (int64_t l = 0; l < kLanes; ++l) q[i + l] = lanes[l];
          }
        }
        if (i < u.n) {
          red.run(r0, r1, [&](const std::array<int64_t, 1>& ro, int64_t rn, const std::array<int64_t, 1>& rs) {
            for (int64_t k = 0; k < rn; ++k) {
              const T* p = xp + ro[0] + k * rs[0] + u.offset;
              for (int64_t j = i; j < u.n; ++j) q[j] = r.step(q[j], p[j * u.stride]);
            }
          });
        }
        q += u.n;
      }
    };
    if (blocks == 1) {
      a.parallel_for(outs, grain, [&](int64_t b, int64_t e) {
        std::vector<Acc> acc(size_t(e - b), r.init());
        fold(b, e, 0, count, acc.data());
        for (int64_t j = b; j < e; ++j) out[j] = static_cast<T>(r.finish(acc[j - b], count));
      });
      return;
    }
    std::vector<Acc> partial(size_t(blocks * outs), r.init());
    a.parallel_for(blocks * chunks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t blk = t / chunks, b = (t % chunks) * grain, e = std::min(outs, b + grain);
        // A private accumulator: tasks writing partial directly would share
        // cache lines at chunk edges and bounce them between cores every row.
        std::vector<Acc> acc(size_t(e - b), r.init());
        fold(b, e, blk * kBlock, std::min(count, (blk + 1) * kBlock), acc.data());
        std::copy(acc.begin(), acc.end(), partial.begin() + blk * outs + b);
      }
    });
    for (int64_t j = 0; j < outs; ++j) {
      Acc acc = partial[j];
      for (int64_t blk = 1; blk < blocks; ++blk) acc = r.step(acc, partial[blk * outs + j]);
      out[j] = static_cast<T>(r.finish(acc, count));
    }
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
