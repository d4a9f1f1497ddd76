// The CUDA backend's attention (src/backend/cuda/attention.cu) where the
// op-by-op comparisons (CudaEmulated_attention.*, small shapes) do not
// reach: model shapes spanning several tiles, the bf16 matmul option (the
// tiles' products on tensor cores), and heads too wide for the tiles (the
// warp-per-row kernels). Values and gradients against the CPU's, under the
// emulator and on a GPU where this machine has one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backends.h"
#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"

using namespace nabla;
using testing_backends::random_tensor;

namespace {

struct Case {
  int64_t b, tq, tk, h, hk, d;
  bool causal, probs;  // probs: attention_probs then matmul_heads (no grouped heads)
  int64_t window = 0;  // a sliding window (attention, causal)
  double softcap = 0;  // scores capped (attention)
};

std::string describe(const Case& c) {
  return std::to_string(c.b) + "x" + std::to_string(c.tq) + " queries, " + std::to_string(c.tk) + " keys, " +
         std::to_string(c.h) + "/" + std::to_string(c.hk) + " heads of " + std::to_string(c.d) +
         (c.causal ? ", causal" : "") + (c.probs ? ", attention_probs" : "") +
         (c.window > 0 ? ", window " + std::to_string(c.window) : "") +
         (c.softcap > 0 ? ", scores capped at " + std::to_string(c.softcap) : "");
}

// The output and the gradients of sum(o * dout) for q, k and v.
std::vector<Tensor> attention_outputs(const Case& c, DType dtype) {
  Tensor q = random_tensor(dtype, {c.b, c.tq, c.h, c.d}, 1);
  Tensor k = random_tensor(dtype, {c.b, c.tk, c.hk, c.d}, 2);
  Tensor v = random_tensor(dtype, {c.b, c.tk, c.hk, c.d}, 3);
  Tensor dout = random_tensor(dtype, {c.b, c.tq, c.h, c.d}, 4);
  Tensor o = c.probs ? matmul_heads(attention_probs(q, k, c.causal), permute(v, {0, 2, 1, 3}))
                     : attention(q, k, v, c.causal, std::nullopt, Tensor(), c.window, c.softcap);
  std::vector<Tensor> outs = grad(sum(o * dout), {q, k, v});
  outs.insert(outs.begin(), o);
  return outs;
}

std::vector<std::vector<double>> values(const std::vector<Tensor>& outs, const ExecOptions& options) {
  std::vector<std::vector<double>> v;
  for (const Tensor& t : eval(outs, options)) {
    if (t.dtype() == DType::f64) {
      v.push_back(t.to_vector<double>());
    } else {
      const std::vector<float> f = t.to_vector<float>();
      v.emplace_back(f.begin(), f.end());
    }
  }
  return v;
}

const char* kNames[] = {"output", "dq", "dk", "dv"};

// Each of got's tensors within tolerance x the largest value of want's.
void expect_close(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want,
                  double tolerance) {
  for (size_t n = 0; n < want.size(); ++n) {
    double scale = 0;
    for (double x : want[n]) scale = std::max(scale, std::abs(x));
    for (size_t i = 0; i < want[n].size(); ++i) {
      ASSERT_NEAR(got[n][i], want[n][i], tolerance * scale) << kNames[n] << " entry " << i;
    }
  }
}

class CudaAttention : public ::testing::TestWithParam<std::string> {};

// f32 across many tiles (partial last tiles, causal key skipping, grouped
// heads, more keys than queries, sliding windows starting within a tile and
// keys no query sees, soft-capped scores), and under the bf16 option: within bf16's
// precision of the CPU's bf16 products (the same operands rounded, other
// sums and rescalings), moved from f32 (the option is in effect), and the
// same bits run to run.
TEST_P(CudaAttention, MatchesTheCpuAcrossTilesInF32AndBf16) {
  for (const Case& c : {Case{1, 197, 197, 3, 3, 64, false, false}, Case{2, 130, 130, 4, 2, 32, true, false},
                        Case{1, 40, 70, 2, 1, 24, true, false}, Case{1, 197, 197, 3, 3, 64, false, true},
                        Case{2, 150, 150, 4, 2, 32, true, false, 40}, Case{1, 40, 90, 2, 1, 24, true, false, 17},
                        Case{2, 130, 130, 4, 2, 32, true, false, 50, 0.7}}) {
    SCOPED_TRACE(describe(c));
    const std::vector<Tensor> outs = attention_outputs(c, DType::f32);
    const auto cpu = values(outs, {.threads = 2});
    const auto device = values(outs, {.backend = GetParam()});
    expect_close(device, cpu, 2e-5);
    const auto cpu_bf16 = values(outs, {.threads = 2, .bf16_matmul = true});
    const auto device_bf16 = values(outs, {.bf16_matmul = true, .backend = GetParam()});
    expect_close(device_bf16, cpu_bf16, 2e-2);
    EXPECT_EQ(values(outs, {.bf16_matmul = true, .backend = GetParam()}), device_bf16);
    for (size_t n = 0; n < device.size(); ++n) {
      double scale = 0, moved = 0;
      for (size_t i = 0; i < device[n].size(); ++i) {
        scale = std::max(scale, std::abs(device[n][i]));
        moved = std::max(moved, std::abs(device_bf16[n][i] - device[n][i]));
      }
      EXPECT_GT(moved, 1e-4 * scale) << kNames[n] << ": the bf16 option had no effect";
    }
  }
}

// Heads wider than any tile's shared memory holds (on the emulator's 99
// KiB, f64: attention's 300 wide forward and backward, 130 its backward
// alone; attention_probs' 400) take the per-row kernels, to f64's precision.
TEST_P(CudaAttention, WideHeadsMatchTheCpu) {
  for (const Case& c : {Case{1, 20, 20, 2, 1, 300, true, false}, Case{2, 17, 23, 2, 2, 130, false, false},
                        Case{1, 18, 21, 2, 2, 400, true, true}, Case{1, 40, 45, 2, 1, 300, true, false, 7},
                        Case{1, 30, 30, 2, 1, 300, true, false, 0, 0.6}}) {
    SCOPED_TRACE(describe(c));
    const std::vector<Tensor> outs = attention_outputs(c, DType::f64);
    expect_close(values(outs, {.backend = GetParam()}), values(outs, {.threads = 2}), 1e-10);
  }
}

INSTANTIATE_TEST_SUITE_P(, CudaAttention, ::testing::ValuesIn(testing_backends::cuda_backends()),
                         [](const auto& info) { return testing_backends::test_name(info.param); });

}  // namespace
