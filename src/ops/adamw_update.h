// Shared by adamw_update and adamw_update_factored: the settings an AdamW
// node reads, checked, and the step's constants from them.
#pragma once

#include "core/op.h"
#include "optim/update.h"

namespace nabla::ops {

// attrs.reals {beta1, beta2, eps}: UsageError naming op unless the betas
// are in [0, 1) and eps finite and >= 0.
void check_adamw_settings(const char* op, const Attrs& attrs);

// hyper f64 [3] {lr, step t, weight_decay} (any stride) and grad_scale (one
// f64), checked (UsageError naming op), as optim::adamw_constants makes
// them. Decay always on: with weight decay 0 its factor float(1 - lr * 0)
// is the 1.0f that optim::AdamW uses for a parameter without decay.
optim::AdamWConstants adamw_node_constants(const char* op, const TensorView& hyper, const TensorView& grad_scale,
                                           const Attrs& attrs);

}  // namespace nabla::ops
