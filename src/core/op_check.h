// Runs an op's registered gradient cases on every input layout: the engine of
// the gradient-check test suite and of `nabla gradcheck`.
#pragma once

#include <string>
#include <vector>

#include "core/op.h"
#include "nabla/gradcheck.h"

namespace nabla {

// How a case's inputs are laid out in memory. Each non-contiguous layout is a
// view of a differently shaped leaf, so kernels and backward rules meet
// strided operands (and, for transposed and broadcast, strided gradients).
enum class Layout { contiguous, transposed, strided, broadcast, offset };
inline constexpr Layout kAllLayouts[] = {Layout::contiguous, Layout::transposed, Layout::strided,
                                         Layout::broadcast, Layout::offset};
const char* layout_name(Layout l);

// Whether any input of the case can take this layout (e.g. transposed needs
// an input of rank >= 2). Inputs that cannot keep the contiguous layout.
bool layout_applies(const GradCase& c, Layout l);

GradcheckResult check_op_case(const OpDef& op, const GradCase& c, Layout l, int threads, uint64_t seed = 1,
                              const std::string& backend = "cpu");

// The case's output and its inputs' gradients (for a random cotangent) on
// `backend` against the CPU's, in f64 and in f32: within kBackendF64 and
// kBackendF32 of the values' scale (max |value|, at least 1) plus the same
// relative to each value. ok=false with the first difference otherwise.
// Set before any backend ran, not widened since: f64 kernels differ only in
// summation order (~1e-15 a term), f32 ones also in rounding once per op
// (the reference rounds its double result, the CPU each f32 step): a few
// ulps (1.2e-7 each) through a case's handful of ops.
inline constexpr double kBackendF64 = 1e-10, kBackendF32 = 2e-5;
GradcheckResult check_backend(const OpDef& op, const GradCase& c, Layout l, const std::string& backend,
                              uint64_t seed = 1);

// For a fused op: the case built with the fused kernel and with its
// composite agree in f64, in value and in gradient. ok=false with a message
// otherwise; max error relative to the values' scale.
GradcheckResult check_composite(const OpDef& op, const GradCase& c, Layout l, int threads, uint64_t seed = 1);

// Problems with the registry itself: ops without gradient cases, without a
// case that can be strided, or with a differentiable input but no backward.
std::vector<std::string> registry_problems();

}  // namespace nabla
