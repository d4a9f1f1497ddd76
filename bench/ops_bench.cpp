// Op kernels as the models run them: each benchmark builds a one-op nabla
// graph (leaf inputs, the op, an Executor) at ViT shapes and times run().
// Threads: NABLA_THREADS (default: every core). NABLA_BENCH_BF16=1 runs
// every graph with the bf16 matmul option (ExecOptions::bf16_matmul).
// NABLA_PROFILE=1 prints each benchmark's time per node to stderr.
//
// Counters: bytes_per_second counts the bytes the op must move at least (each
// input read once, the output written once); copy_GB/s is a parallel memcpy
// of the same bytes (half read, half written) on the same threads, measured
// just before the op in the same run, and of_copy the op's rate as a fraction
// of it: near 1 a bandwidth-bound op is as fast as memory lets it be. matmul
// also reports GFLOP/s (2 M N K per call). Rates use wall time, so run on an
// idle machine (on a busy one, compare the CPU column at NABLA_THREADS=1).
//
// The row kernels and matmuls run twice: mem:0 with their inputs in cache
// (each run reads what the run before left there; the copy reference likewise
// moves cached bytes), and mem:1 with every run, and
// every reference copy, starting after a 96 MiB eviction (evict_caches), as
// in a training step, whose arena (60-300 MB) is far larger than L3: the
// fraction of the memory copy rate a kernel reaches there.
//
// Presets: fmnist (batch 128, 16 tokens, width 96, MLP 192, 4 heads) and
// vit-tiny at batch 8 (197 tokens, width 192, MLP 768, 3 heads).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "nabla/executor.h"
#include "nabla/graph.h"
#include "nabla/ops.h"
#include "nabla/optim.h"
#include "nabla/tensor.h"
#include "ops/internal_ops.h"

namespace {

using nabla::Shape;
using nabla::Tensor;

int threads() { return nabla::cpu::default_threads(); }
// NABLA_BENCH_BF16=1: every graph runs with the bf16 matmul option.
bool bf16_matmul() {
  const char* v = std::getenv("NABLA_BENCH_BF16");
  return v && *v && std::strcmp(v, "0") != 0;
}

Tensor random_leaf(const Shape& shape, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(nabla::numel(shape)));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_vector<float>(shape, v);
}

Tensor label_leaf(int64_t rows, int64_t classes) {
  std::vector<int32_t> v(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) v[i] = static_cast<int32_t>((i * 7919) % classes);
  return Tensor::from_vector<int32_t>({rows}, v);
}

int64_t bytes_of(const Tensor& t) {
  return t.numel() * static_cast<int64_t>(nabla::dtype_size(t.dtype()));
}

// Bytes per second of a parallel memcpy moving `bytes` in all (bytes / 2
// copied), split into 64 KiB chunks over the same threads as the ops; the
// best of several ~10 ms rounds.
double copy_rate(int64_t bytes) {
  const int64_t half = std::max<int64_t>(bytes / 2, 64);
  std::vector<char> src(static_cast<size_t>(half), 1), dst(static_cast<size_t>(half), 0);
  const int64_t grain = 1 << 16;
  auto copy = [&] {
    nabla::cpu::parallel_for(threads(), half, grain, [&](int64_t b, int64_t e) {
      std::memcpy(dst.data() + b, src.data() + b, static_cast<size_t>(e - b));
    });
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  };
  copy();
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    int64_t reps = 0;
    const auto t0 = std::chrono::steady_clock::now();
    std::chrono::duration<double> dt{};
    do {
      copy();
      ++reps;
      dt = std::chrono::steady_clock::now() - t0;
    } while (dt.count() < 0.01);
    best = std::max(best, 2.0 * double(half) * double(reps) / dt.count());
  }
  return best;
}

// Streams a buffer larger than L2 and L3 together through the caches, so that
// what runs next reads its inputs from memory, as a training step's kernels
// mostly do (its arena is 60-300 MB, this machine's L3 32 MB).
void evict_caches() {
  static std::vector<char> junk(size_t(96) << 20, 1);
  nabla::cpu::parallel_for(threads(), int64_t(junk.size()) / 64, 1 << 12, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) junk[size_t(i) * 64] += 1;
  });
  benchmark::ClobberMemory();
}

// copy_rate with every copy starting from memory (evict_caches before each).
double copy_rate_from_memory(int64_t bytes) {
  const int64_t half = std::max<int64_t>(bytes / 2, 64);
  std::vector<char> src(static_cast<size_t>(half), 1), dst(static_cast<size_t>(half), 0);
  std::chrono::duration<double> total{};
  constexpr int kRuns = 100;
  for (int run = 0; run < kRuns; ++run) {
    evict_caches();
    const auto t0 = std::chrono::steady_clock::now();
    nabla::cpu::parallel_for(threads(), half, 1 << 16, [&](int64_t b, int64_t e) {
      std::memcpy(dst.data() + b, src.data() + b, static_cast<size_t>(e - b));
    });
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
    total += std::chrono::steady_clock::now() - t0;
  }
  return 2.0 * double(half) * kRuns / total.count();
}

// Sets the counters from the loop's wall time `seconds`.
void report(benchmark::State& state, int64_t bytes, double copy, double seconds, double flops = 0) {
  const double runs = static_cast<double>(state.iterations());
  const double rate = runs * double(bytes) / seconds;
  state.SetBytesProcessed(static_cast<int64_t>(runs * double(bytes)));
  state.counters["copy_GB/s"] = copy * 1e-9;
  state.counters["of_copy"] = rate / copy;
  if (flops > 0) state.counters["GFLOP/s"] = runs * flops * 1e-9 / seconds;
}

// Where a benchmark's inputs start each run: in cache (the run before left
// them there) or in memory (evicted before each run; the copy reference too).
enum class Inputs { cached, from_memory };

// Times the graph of outs; `bytes`: the traffic per run (0: inputs +
// outputs); `flops`: per run, for a GFLOP/s counter (0: none).
void run_graph(benchmark::State& state, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outs,
               int64_t bytes = 0, double flops = 0, Inputs where = Inputs::cached) {
  if (bytes == 0) {
    for (const Tensor& t : outs) bytes += bytes_of(t);
    for (const Tensor& t : inputs) bytes += bytes_of(t);
  }
  const bool cold = where == Inputs::from_memory;
  const double copy = cold ? copy_rate_from_memory(bytes) : copy_rate(bytes);
  nabla::ExecOptions options;
  options.threads = threads();
  options.bf16_matmul = bf16_matmul();
  nabla::Executor ex(nabla::Graph(outs), options);
  ex.run();  // warm-up: first touch of the arena
  std::chrono::duration<double> dt{};
  if (cold) {
    for (auto _ : state) {
      evict_caches();
      const auto t0 = std::chrono::steady_clock::now();
      ex.run();
      const std::chrono::duration<double> one = std::chrono::steady_clock::now() - t0;
      state.SetIterationTime(one.count());
      dt += one;
    }
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    for (auto _ : state) ex.run();
    dt = std::chrono::steady_clock::now() - t0;
  }
  report(state, bytes, copy, dt.count(), flops);
  state.counters["arena_MiB"] = double(ex.memory().arena_bytes) / double(1 << 20);
  // NABLA_PROFILE=1: where a graph of several nodes spent its time.
  if (const std::string where = ex.profile(); !where.empty()) {
    std::fprintf(stderr, "%s", where.c_str());
  }
  state.SetLabel(std::to_string(ex.threads()) + " threads" + (cold ? ", from memory" : "") +
                 (options.bf16_matmul ? ", bf16 matmul" : ""));
}

// The last argument of a row benchmark: 1 for inputs from memory.
Inputs inputs_arg(const benchmark::State& state, int index) {
  return state.range(index) != 0 ? Inputs::from_memory : Inputs::cached;
}

void run_graph(benchmark::State& state, const std::vector<Tensor>& inputs, const Tensor& out, int64_t bytes = 0,
               double flops = 0, Inputs where = Inputs::cached) {
  run_graph(state, inputs, std::vector<Tensor>{out}, bytes, flops, where);
}

// ---- matmul: {M, K, N, trans_a, trans_b, batch, bias, mem}. A transposed
// operand is a transposed view of a row-major leaf, as the models pass weights
// (Linear's x W^T) and activations (the weight gradient's x^T dy); bias 1 adds
// a bias row in the product (matmul_add, what a linear layer runs).
void BM_matmul(benchmark::State& state) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  const bool ta = state.range(3) != 0, tb = state.range(4) != 0;
  const int64_t batch = state.range(5);
  Shape sa = ta ? Shape{K, M} : Shape{M, K};
  Shape sb = tb ? Shape{N, K} : Shape{K, N};
  if (batch > 1) {
    sa.insert(sa.begin(), batch);
    sb.insert(sb.begin(), batch);
  }
  Tensor a = random_leaf(sa, 1), b = random_leaf(sb, 2);
  Tensor av = ta ? nabla::transpose(a) : a, bv = tb ? nabla::transpose(b) : b;
  Tensor bias = random_leaf({N}, 5);
  Tensor out = state.range(6) != 0 ? nabla::matmul_add(av, bv, bias) : nabla::matmul(av, bv);
  run_graph(state, {a, b}, out, 0, 2.0 * double(batch * M * N * K), inputs_arg(state, 7));
}

void matmul_shapes(benchmark::internal::Benchmark* b, int64_t mem) {
  b->ArgNames({"M", "K", "N", "ta", "tb", "batch", "bias", "mem"});
  // fmnist, 2048 token rows. Forward x W^T + bias: qkv/proj, fc1, fc2.
  b->Args({2048, 96, 96, 0, 1, 1, 1, mem});
  b->Args({2048, 96, 192, 0, 1, 1, 1, mem});
  b->Args({2048, 192, 96, 0, 1, 1, 1, mem});
  // Input gradients dy W.
  b->Args({2048, 192, 96, 0, 0, 1, 0, mem});
  b->Args({2048, 96, 192, 0, 0, 1, 0, mem});
  // Weight gradients dy^T x (weights stored [out, in]): K-heavy, small M and N.
  b->Args({96, 2048, 96, 1, 0, 1, 0, mem});
  b->Args({192, 2048, 96, 1, 0, 1, 0, mem});
  b->Args({96, 2048, 192, 1, 0, 1, 0, mem});
  // Attention scores q k^T per (image, head): 512 x [16, 24] x [24, 16].
  b->Args({16, 24, 16, 0, 1, 512, 0, mem});
  // vit-tiny at batch 8, 1576 token rows: qkv/proj, fc1, fc2, input and weight gradients.
  b->Args({1576, 192, 192, 0, 1, 1, 1, mem});
  b->Args({1576, 192, 768, 0, 1, 1, 1, mem});
  b->Args({1576, 768, 192, 0, 1, 1, 1, mem});
  b->Args({1576, 768, 192, 0, 0, 1, 0, mem});
  b->Args({1576, 192, 768, 0, 0, 1, 0, mem});
  b->Args({192, 1576, 192, 1, 0, 1, 0, mem});
  b->Args({192, 1576, 768, 1, 0, 1, 0, mem});
  b->Args({768, 1576, 192, 1, 0, 1, 0, mem});
  b->Args({197, 64, 197, 0, 1, 24, 0, mem});
  // GPT-2 124M's output head at 4 x 64 tokens (weights tied to wte [50257,
  // 768]): the logits, then their input gradient, a reduction over the vocabulary.
  b->Args({256, 768, 50257, 0, 1, 1, 0, mem});
  b->Args({256, 50257, 768, 0, 0, 1, 0, mem});
  b->Unit(benchmark::kMicrosecond);
}

// Registers fn twice: args(b, 0) with inputs in cache, and args(b, 1) with
// inputs from memory, a fixed number of runs each after evict_caches (whose
// time is not counted: manual timing).
constexpr int64_t kFromMemoryRuns = 100;
#define NABLA_BENCH_BOTH_WAYS(fn, args)                                                                       \
  BENCHMARK(fn)->Apply([](benchmark::internal::Benchmark* b) { args(b, 0); })->UseRealTime();                \
  BENCHMARK(fn)->Apply([](benchmark::internal::Benchmark* b) { args(b, 1); })->Iterations(kFromMemoryRuns)->UseManualTime()

NABLA_BENCH_BOTH_WAYS(BM_matmul, matmul_shapes);

// ---- Row ops over [rows, C]: {rows, C, mem}, fmnist's and vit-tiny's token
// rows at their width (norms) or MLP width (activations); mem 1: inputs from
// memory.
void row_shapes(benchmark::internal::Benchmark* b, int64_t fm_c, int64_t tiny_c, int64_t mem) {
  b->ArgNames({"rows", "C", "mem"});
  b->Args({2048, fm_c, mem});
  b->Args({1576, tiny_c, mem});
  b->Unit(benchmark::kMicrosecond);
}
void width_shapes(benchmark::internal::Benchmark* b, int64_t mem) { row_shapes(b, 96, 192, mem); }
void mlp_shapes(benchmark::internal::Benchmark* b, int64_t mem) { row_shapes(b, 192, 768, mem); }

// A plain streaming op (y = 2 x) at the norms' shapes: what a kernel that
// only reads and writes its rows reaches through the executor, the ceiling
// the row kernels are measured against besides the copy.
void BM_scale(benchmark::State& state) {
  Tensor x = random_leaf({state.range(0), state.range(1)}, 3);
  run_graph(state, {x}, nabla::scale(x, 2.0), 0, 0, inputs_arg(state, 2));
}
NABLA_BENCH_BOTH_WAYS(BM_scale, width_shapes);

void BM_layer_norm(benchmark::State& state) {
  Tensor x = random_leaf({state.range(0), state.range(1)}, 3);
  run_graph(state, {x}, nabla::layer_norm(x, 1e-6), 0, 0, inputs_arg(state, 2));
}
NABLA_BENCH_BOTH_WAYS(BM_layer_norm, width_shapes);

void BM_layer_norm_back(benchmark::State& state) {
  Tensor x = random_leaf({state.range(0), state.range(1)}, 3);
  Tensor dy = random_leaf({state.range(0), state.range(1)}, 4);
  run_graph(state, {x, dy}, nabla::layer_norm_back(x, dy, 1e-6), 0, 0, inputs_arg(state, 2));
}
NABLA_BENCH_BOTH_WAYS(BM_layer_norm_back, width_shapes);

// The affine form (what the models run): forward, and its backward (dx,
// dgamma and dbeta in one flat output).
void BM_layer_norm_affine(benchmark::State& state) {
  const int64_t c = state.range(1);
  Tensor x = random_leaf({state.range(0), c}, 3), gamma = random_leaf({c}, 4), beta = random_leaf({c}, 5);
  run_graph(state, {x, gamma, beta}, nabla::layer_norm(x, gamma, beta, 1e-6), 0, 0, inputs_arg(state, 2));
}
NABLA_BENCH_BOTH_WAYS(BM_layer_norm_affine, width_shapes);

void BM_layer_norm_affine_back(benchmark::State& state) {
  const int64_t c = state.range(1);
  Tensor x = random_leaf({state.range(0), c}, 3), dy = random_leaf({state.range(0), c}, 4);
  Tensor gamma = random_leaf({c}, 5);
  run_graph(state, {x, dy, gamma}, nabla::layer_norm_affine_back(x, dy, gamma, 1e-6), 0, 0, inputs_arg(state, 2));
}
NABLA_BENCH_BOTH_WAYS(BM_layer_norm_affine_back, width_shapes);

// With the residual branch's gradient added to dx (a pre-norm block's).
void BM_layer_norm_affine_back_add(benchmark::State& state) {
  const int64_t c = state.range(1);
  Tensor x = random_leaf({state.range(0), c}, 3), dy = random_leaf({state.range(0), c}, 4);
  Tensor gamma = random_leaf({c}, 5), addend = random_leaf({state.range(0), c}, 6);
  run_graph(state, {x, dy, gamma, addend}, nabla::layer_norm_affine_back(x, dy, gamma, 1e-6, addend), 0, 0,
            inputs_arg(state, 2));
}
NABLA_BENCH_BOTH_WAYS(BM_layer_norm_affine_back_add, width_shapes);

// ---- Activations on the MLP hidden layer.
void BM_gelu(benchmark::State& state) {
  Tensor x = random_leaf({state.range(0), state.range(1)}, 5);
  run_graph(state, {x}, nabla::gelu(x), 0, 0, inputs_arg(state, 2));
}
NABLA_BENCH_BOTH_WAYS(BM_gelu, mlp_shapes);

void BM_gelu_back(benchmark::State& state) {
  Tensor x = random_leaf({state.range(0), state.range(1)}, 5);
  Tensor dy = random_leaf({state.range(0), state.range(1)}, 6);
  run_graph(state, {x, dy}, nabla::gelu_back(x, dy), 0, 0, inputs_arg(state, 2));
}
NABLA_BENCH_BOTH_WAYS(BM_gelu_back, mlp_shapes);

void BM_gelu_erf(benchmark::State& state) {
  Tensor x = random_leaf({state.range(0), state.range(1)}, 5);
  run_graph(state, {x}, nabla::gelu_erf(x), 0, 0, inputs_arg(state, 2));
}
NABLA_BENCH_BOTH_WAYS(BM_gelu_erf, mlp_shapes);

void BM_gelu_erf_back(benchmark::State& state) {
  Tensor x = random_leaf({state.range(0), state.range(1)}, 5);
  Tensor dy = random_leaf({state.range(0), state.range(1)}, 6);
  run_graph(state, {x, dy}, nabla::gelu_erf_back(x, dy), 0, 0, inputs_arg(state, 2));
}
NABLA_BENCH_BOTH_WAYS(BM_gelu_erf_back, mlp_shapes);

// ---- Elementwise add: a residual (same shape) and a bias (row broadcast).
void BM_add(benchmark::State& state) {
  Tensor x = random_leaf({state.range(0), state.range(1)}, 7);
  Tensor y = state.range(2) ? random_leaf({state.range(1)}, 8)
                            : random_leaf({state.range(0), state.range(1)}, 8);
  run_graph(state, {x, y}, nabla::add(x, y));
}
BENCHMARK(BM_add)
    ->ArgNames({"rows", "C", "bias"})
    ->Args({2048, 96, 0})
    ->Args({2048, 192, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- A bias gradient: the sum over every token row of [rows, C].
void BM_sum_rows(benchmark::State& state) {
  Tensor x = random_leaf({state.range(0), state.range(1)}, 10);
  run_graph(state, {x}, nabla::sum(x, {0}));
}
BENCHMARK(BM_sum_rows)
    ->ArgNames({"rows", "C"})
    ->Args({2048, 96})
    ->Args({2048, 192})
    ->Args({1576, 192})
    ->Args({1576, 768})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- contiguous: heads back to tokens, [N, H, T, D] -> [N, T, H, D].
void BM_contiguous(benchmark::State& state) {
  const int64_t n = state.range(0), h = state.range(1), t = state.range(2), d = state.range(3);
  Tensor x = random_leaf({n, h, t, d}, 9);
  run_graph(state, {x}, nabla::contiguous(nabla::permute(x, {0, 2, 1, 3})));
}
BENCHMARK(BM_contiguous)
    ->ArgNames({"N", "H", "T", "D"})
    ->Args({128, 4, 16, 24})
    ->Args({8, 3, 197, 64})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- Attention forward and backward, q, k, v [N, T, H, D] as the models'
// projections give them: {N, T, H, D, causal, fused}. fused 0 is the
// composed form ViT runs (batched matmuls and the fused softmax on
// [N, H, T, D] views, the output and the gradients written token-major by
// matmul_heads), fused 1 the attention op. GFLOP/s counts the six
// products of the composed form (the fused backward's recomputed scores are
// not counted).
void BM_attention(benchmark::State& state) {
  const int64_t n = state.range(0), t = state.range(1), h = state.range(2), d = state.range(3);
  // fused: 0 composed, 1 attention (scores recomputed backward), 2
  // attention_probs then matmul_heads (probabilities kept).
  const bool causal = state.range(4) != 0;
  const int64_t fused = state.range(5);
  Tensor q = random_leaf({n, t, h, d}, 13), k = random_leaf({n, t, h, d}, 14), v = random_leaf({n, t, h, d}, 15);
  Tensor dout = random_leaf({n, t, h, d}, 16);
  auto heads = [](const Tensor& x) { return nabla::permute(x, {0, 2, 1, 3}); };
  const double scale = 1.0 / std::sqrt(double(d));
  Tensor o = fused == 1 ? nabla::attention(q, k, v, causal)
             : fused == 2
                 ? nabla::matmul_heads(nabla::attention_probs(q, k, causal), heads(v))
                 : nabla::matmul_heads(nabla::softmax(nabla::matmul(heads(q), nabla::transpose(heads(k))), scale,
                                                      Tensor(), causal),
                                       heads(v));
  std::vector<Tensor> outs = nabla::grad(nabla::sum(o * dout), {q, k, v});
  for (Tensor& g : outs) g = nabla::contiguous(g);
  outs.push_back(o);
  run_graph(state, {q, k, v, dout}, outs, 0, 6 * 2.0 * double(n * h * t * t * d));
  state.SetLabel(std::string(fused == 1 ? "fused" : fused == 2 ? "probabilities fused" : "composed") + ", " +
                 std::to_string(threads()) + " threads");
}
BENCHMARK(BM_attention)
    ->ArgNames({"N", "T", "H", "D", "causal", "fused"})
    ->Args({128, 16, 4, 24, 0, 0})
    ->Args({128, 16, 4, 24, 0, 1})
    ->Args({128, 16, 4, 24, 0, 2})
    ->Args({8, 197, 3, 64, 0, 0})
    ->Args({8, 197, 3, 64, 0, 1})
    ->Args({8, 197, 3, 64, 0, 2})
    ->Args({8, 256, 6, 64, 1, 0})
    ->Args({8, 256, 6, 64, 1, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- Causal attention with a sliding window against the full causal op at
// the same shape, forward and backward: {N, T, H, D, window} (window 0: every
// earlier key). Gemma 3 1B's window of 512 at 2048 tokens sees 44% of the
// key pairs causal attention sees; GFLOP/s counts the full causal products.
void BM_attention_window(benchmark::State& state) {
  const int64_t n = state.range(0), t = state.range(1), h = state.range(2), d = state.range(3), w = state.range(4);
  Tensor q = random_leaf({n, t, h, d}, 13), k = random_leaf({n, t, h, d}, 14), v = random_leaf({n, t, h, d}, 15);
  Tensor dout = random_leaf({n, t, h, d}, 16);
  Tensor o = nabla::attention(q, k, v, true, std::nullopt, Tensor(), w);
  std::vector<Tensor> outs = nabla::grad(nabla::sum(o * dout), {q, k, v});
  for (Tensor& g : outs) g = nabla::contiguous(g);
  outs.push_back(o);
  run_graph(state, {q, k, v, dout}, outs, 0, 6 * 2.0 * double(n * h * t * t * d) / 2);
  state.SetLabel((w > 0 ? "window " + std::to_string(w) : std::string("full causal")) + ", " +
                 std::to_string(threads()) + " threads");
}
BENCHMARK(BM_attention_window)
    ->ArgNames({"N", "T", "H", "D", "window"})
    ->Args({1, 2048, 4, 64, 0})
    ->Args({1, 2048, 4, 64, 512})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- Gemma 2's soft-capped causal attention, forward and backward: {N, T,
// H, D, form}: form 0 the fused op uncapped, 1 the fused op capped (softcap
// 50, Gemma 2's), 2 capped and composed (scores, tanh, causal softmax,
// values: what Gemma 2 ran before the op took the cap). GFLOP/s counts the
// causal products; arena_MiB is the graph's planned intermediate memory.
void BM_attention_softcap(benchmark::State& state) {
  const int64_t n = state.range(0), t = state.range(1), h = state.range(2), d = state.range(3);
  const int64_t form = state.range(4);
  Tensor q = random_leaf({n, t, h, d}, 13), k = random_leaf({n, t, h, d}, 14), v = random_leaf({n, t, h, d}, 15);
  Tensor dout = random_leaf({n, t, h, d}, 16);
  auto heads = [](const Tensor& x) { return nabla::permute(x, {0, 2, 1, 3}); };
  const double scale = 1.0 / std::sqrt(double(d)), cap = 50;
  Tensor o;
  if (form == 2) {
    const Tensor s = nabla::matmul(heads(q), nabla::transpose(heads(k)));
    const Tensor capped = nabla::scale(nabla::tanh(nabla::scale(s, scale / cap)), cap);
    o = nabla::matmul_heads(nabla::softmax(capped, 1.0, Tensor(), true), heads(v));
  } else {
    o = nabla::attention(q, k, v, true, scale, Tensor(), 0, form == 1 ? cap : 0);
  }
  std::vector<Tensor> outs = nabla::grad(nabla::sum(o * dout), {q, k, v});
  for (Tensor& g : outs) g = nabla::contiguous(g);
  outs.push_back(o);
  run_graph(state, {q, k, v, dout}, outs, 0, 6 * 2.0 * double(n * h * t * t * d) / 2);
  state.SetLabel(std::string(form == 0 ? "fused, uncapped" : form == 1 ? "fused, capped" : "composed, capped") +
                 ", " + std::to_string(threads()) + " threads");
}
BENCHMARK(BM_attention_softcap)
    ->ArgNames({"N", "T", "H", "D", "form"})
    ->Args({1, 1024, 4, 256, 0})
    ->Args({1, 1024, 4, 256, 1})
    ->Args({1, 1024, 4, 256, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- Attention softmax over scores [N, H, T, T]: {N, H, T, causal}.
void softmax_shapes(benchmark::internal::Benchmark* b, int64_t mem) {
  b->ArgNames({"N", "H", "T", "causal", "mem"});
  b->Args({128, 4, 16, 0, mem});
  b->Args({8, 3, 197, 0, mem});
  b->Args({8, 3, 197, 1, mem});
  b->Unit(benchmark::kMicrosecond);
}

void BM_softmax(benchmark::State& state) {
  const int64_t t = state.range(2);
  Tensor x = random_leaf({state.range(0), state.range(1), t, t}, 10);
  run_graph(state, {x}, nabla::softmax(x, 0.125, Tensor(), state.range(3) != 0), 0, 0, inputs_arg(state, 4));
}
NABLA_BENCH_BOTH_WAYS(BM_softmax, softmax_shapes);

void BM_softmax_back(benchmark::State& state) {
  const int64_t t = state.range(2);
  Tensor y = random_leaf({state.range(0), state.range(1), t, t}, 10, 0.0f, 0.1f);
  Tensor dy = random_leaf({state.range(0), state.range(1), t, t}, 11);
  run_graph(state, {y, dy}, nabla::softmax_back(y, dy, 0.125), 0, 0, inputs_arg(state, 3));
}
void softmax_back_shapes(benchmark::internal::Benchmark* b, int64_t mem) {
  b->ArgNames({"N", "H", "T", "mem"});
  b->Args({128, 4, 16, mem});
  b->Args({8, 3, 197, mem});
  b->Unit(benchmark::kMicrosecond);
}
NABLA_BENCH_BOTH_WAYS(BM_softmax_back, softmax_back_shapes);

// ---- Cross-entropy: {rows, classes}; fmnist's head and a GPT-2 sized vocabulary.
void BM_cross_entropy(benchmark::State& state) {
  const int64_t rows = state.range(0), classes = state.range(1);
  Tensor logits = random_leaf({rows, classes}, 12);
  Tensor labels = label_leaf(rows, classes);
  run_graph(state, {logits, labels}, nabla::cross_entropy(logits, labels));
}
BENCHMARK(BM_cross_entropy)
    ->ArgNames({"rows", "classes"})
    ->Args({128, 10})
    ->Args({256, 50257})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- im2col for the patch embedding: {N, C, H, patch}.
void BM_im2col(benchmark::State& state) {
  const int64_t n = state.range(0), c = state.range(1), hw = state.range(2), p = state.range(3);
  Tensor x = random_leaf({n, c, hw, hw}, 13);
  run_graph(state, {x}, nabla::im2col(x, p, p));
}
BENCHMARK(BM_im2col)
    ->ArgNames({"N", "C", "HW", "patch"})
    ->Args({128, 1, 28, 7})
    ->Args({8, 3, 224, 16})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- AdamW over {params} f32 elements, one slot (the update is one fused
// pass over every parameter anyway). Reads p, m, v, g; writes p, m, v.
void BM_adamw(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor p = random_leaf({n}, 14);
  Tensor g = random_leaf({n}, 15);
  nabla::optim::AdamW opt({{"w", p, true}}, nabla::optim::AdamWConfig{}, threads());
  const std::vector<const float*> grads = {g.data_as<float>()};
  const int64_t bytes = 7 * n * static_cast<int64_t>(sizeof(float));
  const double copy = copy_rate(bytes);
  opt.step(grads, 1e-3);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) opt.step(grads, 1e-3);
  const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
  report(state, bytes, copy, dt.count());
  state.SetLabel(std::to_string(threads()) + " threads");
}
// fmnist's 0.54M parameters, vit-tiny's 5.7M.
BENCHMARK(BM_adamw)
    ->ArgNames({"params"})
    ->Arg(540000)
    ->Arg(5700000)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
