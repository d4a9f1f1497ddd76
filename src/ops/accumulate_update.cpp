// accumulate_update: a gradient summed over micro-batches in place, as a
// graph node on any backend (TrainStep's micro-batches): acc = g where
// `restart` is nonzero (the first micro-batch since an update), else acc + g.
// One f32 add per element and run, in run order, as the host sum did.
//
//   inputs: acc (f32 leaf, written: OpDef::mutates), g (f32, acc's shape,
//           any layout), restart (f64, one element, any shape)
//   output: a token of no elements.
#include <vector>

#include "backend/cpu/kernel.h"
#include "core/op.h"
#include "ops/internal_ops.h"

namespace nabla {
namespace ops {
namespace {

Meta accumulate_update_infer(const std::vector<Tensor>& in, const Attrs&) {
  require_f32_like_first("accumulate_update", in, {"acc", "g"});
  require_f64("accumulate_update", in[2], "restart", "with one element", in[2].numel() == 1);
  return {DType::f32, {0}};
}

void accumulate_update_forward(const KernelArgs& a) {
  const bool restart = a.in[2].ptr<double>()[0] != 0;
  std::vector<float> gathered;
  const float* g = contiguous_f32(a, a.in[1], gathered);
  float* acc = a.in[0].ptr<float>();
  a.parallel_for(a.in[0].numel(), int64_t{1} << 15, [&](int64_t b, int64_t e) {
    if (restart) {
      for (int64_t k = b; k < e; ++k) acc[k] = g[k];
    } else {
      for (int64_t k = b; k < e; ++k) acc[k] += g[k];
    }
  });
}

}  // namespace

extern const OpDef op_accumulate_update{
    .name = "accumulate_update",
    .summary = "acc = g (restart nonzero) or acc + g, in place: a gradient summed over micro-batches; a token out",
    .inputs = {{"acc", Diff::no}, {"g", Diff::no}, {"restart", Diff::no}},
    .mutates = {0},
    .infer = accumulate_update_infer,
};
NABLA_CPU_KERNEL(op_accumulate_update, accumulate_update_forward);

}  // namespace ops

Tensor accumulate_update(const Tensor& acc, const Tensor& g, const Tensor& restart) {
  return apply(ops::op_accumulate_update, {acc, g, restart});
}

}  // namespace nabla
