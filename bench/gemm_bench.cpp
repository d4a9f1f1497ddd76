// sgemm throughput at the shapes nabla's models run, for gemm (OpenBLAS when
// the build has it, single-threaded) against the built-in kernel, plus a
// memory-copy reference that says what the machine's bandwidth allows.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"

namespace {

using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                        const float*, int64_t, float, float*, int64_t);

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// C[M, N] = A[M, K] * B[K, N], all contiguous. The GFLOP counter is a rate
// (2*M*N*K flops per call), so it prints as GFLOP/s.
void run_sgemm(benchmark::State& state, GemmFn fn, const char* label) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  const auto A = random_floats(M * K, 1);
  const auto B = random_floats(K * N, 2);
  std::vector<float> C(M * N);
  for (auto _ : state) {
    fn(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2e-9 * M * N * K, benchmark::Counter::kIsRate);
  state.SetLabel(label);
}

void BM_sgemm_gemm(benchmark::State& state) {
  run_sgemm(state, &nabla::cpu::gemm<float>, nabla::cpu::gemm_backend());
}

void BM_sgemm_builtin(benchmark::State& state) {
  run_sgemm(state, &nabla::cpu::gemm_builtin<float>, "builtin");
}

// {M, K, N}: ViT-Tiny (197 tokens x batch 8 = 1576 rows; width 192, MLP 768,
// fused qkv 576) and GPT-2 small (256 tokens, width 768, MLP 3072).
void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N"});
  b->Args({1576, 192, 768});
  b->Args({1576, 768, 192});
  b->Args({1576, 192, 576});
  b->Args({256, 768, 3072});
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_sgemm_gemm)->Apply(shapes);
BENCHMARK(BM_sgemm_builtin)->Apply(shapes);

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
