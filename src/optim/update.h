// The per-element optimizer updates and a step's clipping, shared by the
// optimizer classes and the ops a training graph runs (sgd_update,
// adamw_update, clip_scale): one definition of the arithmetic, so both give
// the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "nabla/optim.h"

namespace nabla::optim {

// One AdamW step's constants for one parameter: step t (from 1), learning
// rate lr, gradients scaled by grad_scale, weight decay where `decay`.
struct AdamWConstants {
  float b1, b2, c1, c2, eps, step_size, inv_sqrt_bc2, grad_scale, decay;
};
AdamWConstants adamw_constants(const AdamWConfig& config, int64_t t, double lr, double grad_scale, bool decay);

// Elements [0, n) of a parameter p and its moments m, v, updated in place
// from its gradient g.
void adamw_update(float* p, float* m, float* v, const float* g, int64_t n, const AdamWConstants& k);

// One SGD step's constants (optim::Sgd's: f32): learning rate lr, momentum,
// weight decay (0 where the parameter takes none), gradient scale.
struct SgdConstants {
  float lr, momentum, weight_decay, grad_scale;
};
SgdConstants sgd_constants(double lr, double momentum, double weight_decay, double grad_scale);

// Elements [0, n) of a parameter p and its momentum buffer buf, updated in
// place from its gradient g: g' = g grad_scale + weight_decay p,
// buf = momentum buf + g', p -= lr buf.
void sgd_update(float* p, float* buf, const float* g, int64_t n, const SgdConstants& k);

// A step's gradient norm and the factor its gradients are scaled by, from
// their summed squares: the gradients averaged over runs and replicas
// (average = 1 / (runs * replicas)), then clipped to norm `clip` (0: none).
struct ClipScale {
  double norm, scale;
};
ClipScale clip_scale(double squared_norm, double average, double clip);

// Gradients seen as one concatenation (offsets[i] where gradient i starts,
// then the total) are squared and summed in fixed chunks of kNormChunk
// elements, the chunks' sums added in order: the same at any thread count.
constexpr int64_t kNormChunk = int64_t{1} << 15;
double squared_norm_chunk(const std::vector<const float*>& grads, const std::vector<int64_t>& offsets,
                          int64_t chunk);
// The same over f64 tensors (the squared_norm op's f64 kernel).
double squared_norm_chunk(const std::vector<const double*>& xs, const std::vector<int64_t>& offsets,
                          int64_t chunk);

}  // namespace nabla::optim
