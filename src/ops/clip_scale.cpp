// clip_scale: a training step's gradient norm and the factor every gradient
// is multiplied by (averaging over runs and replicas, then clipping), from
// the summed squares of the gradients, as a node of the training graph.
//
//   inputs: squared_norm f64, one element (any shape); settings f64 [2] =
//           {average = 1 / (runs * replicas), clip (0: none)}
//   output: f64 [2] = {norm, scale}: optim::clip_scale (src/optim/update.h),
//           TrainStep's arithmetic, in double.
#include "backend/cpu/kernel.h"
#include "core/op.h"
#include "ops/internal_ops.h"
#include "optim/update.h"

namespace nabla {
namespace ops {
namespace {

Meta clip_scale_infer(const std::vector<Tensor>& in, const Attrs&) {
  require_f64("clip_scale", in[0], "squared_norm", "one element", in[0].numel() == 1);
  require_f64("clip_scale", in[1], "settings", "[2] {average, clip}", in[1].shape() == Shape{2});
  return {DType::f64, {2}};
}

void clip_scale_forward(const KernelArgs& a) {
  const double* settings = a.in[1].ptr<double>();
  const optim::ClipScale c =
      optim::clip_scale(a.in[0].ptr<double>()[0], settings[0], settings[a.in[1].strides[0]]);
  a.out.ptr<double>()[0] = c.norm;
  a.out.ptr<double>()[1] = c.scale;
}

// The op takes f64 only (the step's arithmetic is double): each case casts
// its inputs in and the result back, as the f32 gradient check reads it.
// The squares are drawn so that the norm is over the clip (norm >= 2 average,
// clip <= average), under it (norm <= 0.45 average, clip >= average), or
// the clip is 0.
Tensor clipped(const Tensor& sq, const Tensor& settings) {
  return cast(clip_scale(cast(sq, DType::f64), cast(settings, DType::f64)), sq.dtype());
}

std::vector<GradCase> clip_scale_cases() {
  return {
      {"clipped", {constant(uniform({1}, 4, 9)), constant(uniform({2}, 0.5, 1))},
       [](const std::vector<Tensor>& x) { return clipped(x[0], x[1]); }},
      {"not_clipped", {constant(uniform({}, 0.01, 0.2)), constant(uniform({2}, 0.5, 1))},
       [](const std::vector<Tensor>& x) { return clipped(x[0], x[1]); }},
      {"no_clip", {constant(uniform({1, 1}, 4, 9)), constant(uniform({2}, 0.5, 1))},
       [](const std::vector<Tensor>& x) {
         return clipped(x[0], concat({slice(x[1], 0, 0, 1), scale(slice(x[1], 0, 1, 2), 0.0)}, 0));
       }},
  };
}

}  // namespace

extern const OpDef op_clip_scale{
    .name = "clip_scale",
    .summary = "{norm, scale} of a step's gradients from their squared norm and {average, clip}; piecewise, "
               "not differentiated",
    .inputs = {{"squared_norm", Diff::no}, {"settings", Diff::no}},
    .infer = clip_scale_infer,
    .cases = clip_scale_cases,
};
NABLA_CPU_KERNEL(op_clip_scale, clip_scale_forward);

}  // namespace ops

Tensor clip_scale(const Tensor& squared_norm, const Tensor& settings) {
  return apply(ops::op_clip_scale, {squared_norm, settings});
}

}  // namespace nabla
