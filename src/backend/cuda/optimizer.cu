// A training step's optimizer ops on the GPU: the clip's scale and the
// updates, with the CPU's f32 arithmetic (src/optim/optim.cpp). The step's
// numbers (hyper, grad_scale) are read on the device, where the previous
// ops left them; a bad one is recorded (synchronize throws the CPU's words).
#include "backend/cuda/kernel.h"

namespace nabla {
namespace ops {
extern const OpDef op_accumulate_update, op_adamw_update, op_clip_scale, op_sgd_update;
}  // namespace ops

namespace NABLA_GPU {
namespace {

__device__ __forceinline__ double hyper_at(const View& h, int64_t k) {
  return static_cast<const double*>(h.data)[k * h.strides[0]];
}
__device__ __forceinline__ bool finite(double x) { return x - x == 0; }

// squared_norm (one element, f32 or f64), settings {average, clip} ->
// {norm, scale}.
template <class T>
__global__ void clip_scale_kernel(View sq, View settings, T* out) {
  const double average = load<double>(settings, 0), clip = load<double>(settings, settings.strides[0]);
  const double norm = gpu_math::sqrt(load<double>(sq, 0)) * average;
  const double scale = clip > 0 && norm > clip ? average * (clip / norm) : average;
  out[0] = T(norm);
  out[1] = T(scale);
}

void clip_scale(const Operands& a, const Context& ctx) {
  dispatch_real(a.out.dtype, ctx.op, [&]<class T>() {
    launch(ctx, Launch{dim3(1), dim3(1)}, clip_scale_kernel<T>, make_view(a.in[0]), make_view(a.in[1]), a.out.ptr<T>());
  });
}

// acc = g (restart) or acc + g.
__global__ void accumulate_kernel(int64_t n, float* acc, View g, const double* restart) {
  const bool first = *restart != 0;
  NABLA_GRID_STRIDE(i, n) {
    const float gi = static_cast<const float*>(g.data)[offset_of(g, i)];
    acc[i] = first ? gi : acc[i] + gi;
  }
}

void accumulate_update(const Operands& a, const Context& ctx) {
  const int64_t n = a.in[0].numel();
  if (n == 0) return;
  launch(ctx, elementwise_launch(n), accumulate_kernel, n, a.in[0].ptr<float>(), flat_view(a.in[1]),
         static_cast<const double*>(a.in[2].data));
}

// p, g, buf, hyper {lr, momentum, weight_decay}, grad_scale.
__global__ void sgd_kernel(int64_t n, float* p, View g, float* buf, View hyper, const double* grad_scale, DeviceError* e,
                           const char* op) {
  const double lr = hyper_at(hyper, 0), mu = hyper_at(hyper, 1), wd = hyper_at(hyper, 2);
  if (!(lr >= 0) || !finite(lr) || !finite(mu) || !(wd >= 0) || !finite(wd)) {
    report(e, op, kBadHyper, 0, kBadSgd, 0);
    return;
  }
  const float rate = float(lr), momentum = float(mu), decay = float(wd), gs = float(*grad_scale);
  NABLA_GRID_STRIDE(i, n) {
    const float gi = static_cast<const float*>(g.data)[offset_of(g, i)] * gs + decay * p[i];
    buf[i] = momentum * buf[i] + gi;
    p[i] -= rate * buf[i];
  }
}

void sgd_update(const Operands& a, const Context& ctx) {
  const int64_t n = a.in[0].numel();
  if (n == 0) return;
  launch(ctx, elementwise_launch(n), sgd_kernel, n, a.in[0].ptr<float>(), flat_view(a.in[1]), a.in[2].ptr<float>(),
         make_view(a.in[3]), static_cast<const double*>(a.in[4].data), ctx.error, ctx.op);
}

// p, g, m, v, hyper {lr, t, weight_decay}, grad_scale; betas and eps.
struct AdamW {
  double beta1, beta2, eps;
};

__global__ void adamw_kernel(int64_t n, float* p, View g, float* m, float* v, View hyper, const double* grad_scale,
                             AdamW c, DeviceError* e, const char* op) {
  const double lr = hyper_at(hyper, 0), t = hyper_at(hyper, 1), wd = hyper_at(hyper, 2);
  if (!(lr >= 0) || !finite(lr)) return report(e, op, kBadHyper, 0, kBadLearningRate, 0);
  if (!(t >= 1) || t != gpu_math::floor(t)) return report(e, op, kBadHyper, 0, kBadStep, 0);
  if (!(wd >= 0) || !finite(wd)) return report(e, op, kBadHyper, 0, kBadWeightDecay, 0);
  // optim::adamw_constants: the same roundings.
  const float b1 = float(c.beta1), b2 = float(c.beta2), eps = float(c.eps);
  const float c1 = float(1 - c.beta1), c2 = float(1 - c.beta2);
  const double bc1 = 1 - gpu_math::pow(c.beta1, t), bc2 = 1 - gpu_math::pow(c.beta2, t);
  const float step_size = float(lr / bc1), inv_sqrt_bc2 = float(1 / gpu_math::sqrt(bc2)), gs = float(*grad_scale);
  const float decay = float(1 - lr * wd);
  NABLA_GRID_STRIDE(i, n) {
    const float gi = static_cast<const float*>(g.data)[offset_of(g, i)] * gs;
    const float mi = b1 * m[i] + c1 * gi;
    const float vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (gpu_math::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

void adamw_update(const Operands& a, const Context& ctx) { adamw(ctx, a, 2, flat_view(a.in[1])); }

}  // namespace

void adamw(const Context& ctx, const Operands& a, size_t first, const View& g) {
  const int64_t n = a.in[0].numel();
  if (n == 0) return;
  const AdamW c{a.attrs->reals[0], a.attrs->reals[1], a.attrs->reals[2]};
  launch(ctx, elementwise_launch(n), adamw_kernel, n, a.in[0].ptr<float>(), g, a.in[first].ptr<float>(),
         a.in[first + 1].ptr<float>(), make_view(a.in[first + 2]), static_cast<const double*>(a.in[first + 3].data), c,
         ctx.error, ctx.op);
}

void register_optimizer_kernels() {
  register_kernel(ops::op_clip_scale, clip_scale);
  register_kernel(ops::op_accumulate_update, accumulate_update);
  register_kernel(ops::op_sgd_update, sgd_update);
  register_kernel(ops::op_adamw_update, adamw_update);
}

}  // namespace NABLA_GPU
}  // namespace nabla
