// GEMM throughput at the shapes nabla's models run, single-threaded: gemm
// (the AVX-512 kernel where the build has it), OpenBLAS's sgemm (gemm_blas:
// the peer), the built-in f32 kernel and gemm_bf16 (bf16 operands, f32
// accumulation) one after the other for each shape, plus a memory-copy
// reference that says what the machine's bandwidth allows.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"

namespace {

using GemmFn = nabla::cpu::GemmFn<float>;

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// C[M, N] = op(A) * B[K, N], op(A) = A[M, K] or, with ta, A[K, M]^T (the
// weight gradient's layout), all contiguous. The GFLOP counter is a rate
// (2*M*N*K flops per call), so it prints as GFLOP/s.
void run_gemm(benchmark::State& state, GemmFn fn, const char* label) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  const bool ta = state.range(3) != 0;
  const auto A = random_floats(M * K, 1);
  const auto B = random_floats(K * N, 2);
  std::vector<float> C(M * N);
  for (auto _ : state) {
    fn(ta, false, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), N, 0.0f, C.data(), N);
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2e-9 * M * N * K, benchmark::Counter::kIsRate);
  state.SetLabel(label);
}

// {M, K, N, trans_a}: ViT-Tiny (197 tokens x batch 8 = 1576 rows; width 192,
// MLP 768, fused qkv 576), small ViT/GPT blocks (2048 rows, width 128/256),
// a weight gradient (dW = X^T dY: K is the 2048 rows), GPT-2 small (256
// tokens, width 768, MLP 3072), one head of ViT-Tiny's attention (scores
// q k^T over 197 tokens of 64, then probabilities times values), and two
// narrow products whose A^T the f32 kernel reads in place: a ViT-Tiny weight
// gradient's K chunk (split K: 400 of the 1576 rows) and attention's
// dV = P^T dO.
constexpr int64_t kShapes[][4] = {{1576, 192, 768, 0}, {1576, 768, 192, 0}, {1576, 192, 576, 0},
                                  {2048, 128, 256, 0}, {2048, 256, 128, 0}, {128, 2048, 256, 1},
                                  {256, 768, 3072, 0},  {197, 64, 197, 0},   {197, 197, 64, 0},
                                  {192, 400, 192, 1},   {197, 197, 64, 1}};

// Registered shape by shape, so the f32 and bf16 rates of a shape print together.
const bool kRegistered = [] {
  const struct {
    const char* name;
    GemmFn fn;
    const char* label;
  } impls[] = {{"sgemm_gemm", &nabla::cpu::gemm<float>, nabla::cpu::gemm_backend()},
               {"sgemm_blas", &nabla::cpu::gemm_blas<float>, nabla::cpu::gemm_blas_backend()},
               {"sgemm_builtin", &nabla::cpu::gemm_builtin<float>, "builtin"},
               {"gemm_bf16", &nabla::cpu::gemm_bf16,
                nabla::cpu::gemm_bf16_backend()}};
  for (const auto& shape : kShapes) {
    for (const auto& impl : impls) {
      benchmark::RegisterBenchmark(impl.name, run_gemm, impl.fn, impl.label)
          ->ArgNames({"M", "K", "N", "ta"})
          ->Args({shape[0], shape[1], shape[2], shape[3]})
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}();

// Bandwidth reference: copies a 64 MiB float buffer; bytes/s counts the bytes
// read plus the bytes written.
void BM_copy_64mib(benchmark::State& state) {
  const size_t count = (size_t{64} << 20) / sizeof(float);
  std::vector<float> src(count, 1.0f), dst(count, 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), count * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 *
                          static_cast<int64_t>(count * sizeof(float)));
}
BENCHMARK(BM_copy_64mib)->Unit(benchmark::kMillisecond);

}  // namespace
