// Whole training steps (forward, loss, backward, AdamW) of nabla's models on
// synthetic batches, one configuration per process so peak resident memory
// is the configuration's own. Prints one JSON line; bench/train_step.sh runs
// it interleaved with the PyTorch peer (bench/peers/train_step.py) and makes
// the table.
//
//   nabla_bench_train --model vit-tiny|fmnist|gpt2-small-byte|gpt2|smollm2-135m --batch B
//                     [--context T] [--steps N] [--warmup W] [--threads N] [--bf16-matmul]
//                     [--low-memory | --no-low-memory] [--replicas R]
//   nabla_bench_train --machine [--threads N]   FMA peak, OpenBLAS sgemm and nabla gemm rates
//   nabla_bench_train --model M --config          the model's config JSON
//   nabla_bench_train --model M --save CKPT       its initial weights as a checkpoint (bench/sample.sh)
#include <fmt/format.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/thread_pool.h"
#include "core/node.h"
#include "core/op.h"
#include "nabla/checkpoint.h"
#include "nabla/gguf.h"
#include "nabla/models/gguf.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/models/vit.h"
#include "nabla/error.h"
#include "nabla/graph.h"
#include "nabla/ops.h"
#include "nabla/trainer.h"

namespace {

using namespace nabla;
using Clock = std::chrono::steady_clock;

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // Linux reports KiB
}

// 2*M*N*K over every matmul the step runs (forward and backward), from the
// same graph the trainer compiles. The fused attention ops count as the
// products of the composed form they replace (attention: q k^T and p v
// forward, dp, dq, dk, dv backward; attention_probs: q k^T, and dq, dk;
// attention_probs_values_back: dp, dq, dk),
// whole score matrices even when causal, and not the scores the backward
// recomputes: the same work figure either way.
double matmul_flops(const Tensor& loss, const nn::Params& params) {
  std::vector<Tensor> wrt;
  for (const auto& [name, p] : params.list()) wrt.push_back(p);
  Graph g({loss});
  for (const Tensor& t : grad(loss, wrt)) g.add_output(t);
  double flops = 0;
  for (Node* n : g.nodes()) {
    const std::string_view op = n->op->name;
    // matmul_add and matmul_heads are products of the same size (the sum
    // and the output layout are free); matmul_quantized too (the weight's
    // dequantization is overhead, not work). Recomputed nodes count again.
    if (op == "matmul" || op == "matmul_add" || op == "matmul_heads" || op == "matmul_quantized") {
      flops += 2.0 * double(n->numel()) * double(n->inputs.at(0).dim(-1));
    } else if (op.starts_with("attention")) {
      // Per score: a product of width D (attention_probs) or D + Dv
      // (attention, with v), once forward and twice backward.
      const Tensor &q = n->inputs.at(0), &k = n->inputs.at(1);
      const double scores = double(q.dim(0)) * double(q.dim(2)) * double(q.dim(1)) * double(k.dim(1));
      const bool with_v = !op.starts_with("attention_probs");
      const double width = double(q.dim(3)) + (with_v ? double(n->inputs.at(2).dim(3)) : 0.0);
      flops += (op.ends_with("_back") ? 4.0 : 2.0) * scores * width;
      if (op == "attention_probs_values_back") flops += 2.0 * scores * double(n->inputs.at(3).dim(3));  // dp = dO v^T
    }
  }
  return flops;
}

struct Workload {
  Tensor loss;
  std::vector<Tensor> inputs;  // leaves refilled with random data before timing
  int64_t items = 0;           // images or tokens per step
  std::string unit;
  double params = 0;
};

void fill_random(Tensor t, int64_t classes, std::mt19937& rng) {
  if (t.dtype() == DType::f32) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    float* p = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
  } else {
    std::uniform_int_distribution<int32_t> d(0, int32_t(classes - 1));
    int32_t* p = t.data_as<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
  }
}

struct Result {
  double step_ms = 0, items_per_s = 0, gflop_per_step = 0, achieved_gflops = 0, rss_mib = 0, params = 0;
  double arena_mib = 0;
  double device_mib = 0;  // peak memory of a backend's own (0 for the CPU's)
  int factored = 0;  // gradients kept as factors (--low-memory)
  float first_loss = 0, last_loss = 0;
};

// The training loss of a model on its (per-replica) input leaves: images
// and labels, or tokens [N, T + 1] predicting their next.
Tensor training_loss(const models::Vit& model, const Tensor& images, const Tensor& labels) {
  return cross_entropy(model.forward(images, /*train=*/true), labels);
}
Tensor training_loss(const models::Gpt2& model, const Tensor& tokens, const Tensor&) {
  const int64_t T = tokens.dim(1) - 1;
  return cross_entropy(model.forward(slice(tokens, 1, 0, T), true), slice(tokens, 1, 1, T + 1));
}
Tensor training_loss(const models::Llama& model, const Tensor& tokens, const Tensor&) {
  return model.next_token_loss(tokens, true);
}

// `trained`: the model's parameters, or its LoRA adapters on a frozen base.
template <class Model>
Result run_model(Model& model, const nn::Params& trained, const Tensor& input, const Tensor& target,
                 int64_t classes, int64_t items, int steps, int warmup, int threads, bool bf16_matmul,
                 bool low_memory, int replicas, const std::string& backend) {
  const Tensor loss = training_loss(model, input, target);
  Result r;
  r.gflop_per_step = matmul_flops(loss, trained) * 1e-9;
  r.params = double(trained.count());
  optim::AdamWConfig adamw;
  r.gflop_per_step *= replicas;
  TrainStep step(loss, trained, {}, adamw,
                 ExecOptions{.threads = threads, .bf16_matmul = bf16_matmul, .backend = backend},
                 {.low_memory = low_memory, .replicas = replicas});
  r.factored = step.factored_gradients();
  std::mt19937 rng(7);
  for (int k = 0; k < replicas; ++k) {
    r.arena_mib += double(step.executor(k).memory().arena_bytes) / 1048576.0;
    fill_random(step.in_replica(k, input), classes, rng);
    if (target.defined()) fill_random(step.in_replica(k, target), classes, rng);
  }
  std::vector<double> ms;
  for (int i = 0; i < warmup + steps; ++i) {
    auto t0 = Clock::now();
    step.run();
    step.update(1e-4, 1.0);
    double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (i == 0) r.first_loss = step.loss();
    if (i >= warmup) ms.push_back(dt);
    if (i + 1 == warmup) step.executor().reset_profile();
  }
  r.last_loss = step.loss();
  std::sort(ms.begin(), ms.end());
  r.step_ms = ms[ms.size() / 2];
  r.items_per_s = double(items) / (r.step_ms / 1e3);
  r.achieved_gflops = r.gflop_per_step / (r.step_ms / 1e3);
  r.rss_mib = peak_rss_mib();
  r.device_mib = double(find_backend(backend).peak_bytes()) / 1048576.0;
  // NABLA_PROFILE=1: kernel time per op, to stderr so the JSON line stays clean.
  if (std::string prof = step.executor().profile(); !prof.empty()) fmt::print(stderr, "{}", prof);
  return r;
}

// Peak FMA rate: each thread runs independent chains of vector FMAs (enough
// chains to cover the FMA latency), counted as 2 flops per lane.
#if defined(__AVX512F__)
using VecF = __m512;
constexpr int kLanes = 16;
inline VecF vset(float x) { return _mm512_set1_ps(x); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline float vfirst(VecF v) { return _mm512_cvtss_f32(v); }
#elif defined(__FMA__)
using VecF = __m256;
constexpr int kLanes = 8;
inline VecF vset(float x) { return _mm256_set1_ps(x); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline float vfirst(VecF v) { return _mm256_cvtss_f32(v); }
#else
using VecF = float;  // scalar fallback (other ISAs): a lower bound on the peak
constexpr int kLanes = 1;
inline VecF vset(float x) { return x; }
inline VecF vfma(VecF a, VecF b, VecF c) { return std::fma(a, b, c); }
inline float vfirst(VecF v) { return v; }
#endif

double fma_peak_gflops(int threads) {
  constexpr int kChains = 12;
  constexpr int64_t kIters = 20'000'000;
  auto worker = [] {
    VecF acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = vset(float(c));
    const VecF a = vset(0.999999f), b = vset(1e-7f);
    for (int64_t i = 0; i < kIters; ++i) {
      for (int c = 0; c < kChains; ++c) acc[c] = vfma(acc[c], a, b);
    }
    float s = 0;
    for (int c = 0; c < kChains; ++c) s += vfirst(acc[c]);
    volatile float sink = s;
    (void)sink;
  };
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
    for (auto& t : pool) t.join();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, double(threads) * kIters * kChains * kLanes * 2 / s * 1e-9);
  }
  return best;
}

using GemmFn = nabla::cpu::GemmFn<float>;

// An f32 GEMM's rate at a ViT-Tiny MLP shape (M=1576, K=192, N=768), rows
// split across `threads` threads each running `gemm` on its share: OpenBLAS's
// sgemm (the reference: the rate a matmul-bound step could reach with it), or
// nabla's own gemm.
double gemm_gflops(int threads, GemmFn gemm) {
  const int64_t M = 1576, K = 192, N = 768;
  std::vector<float> A(M * K, 0.5f), B(K * N, 0.25f), C(M * N);
  double best = 0;
  for (int rep = 0; rep < 20; ++rep) {
    auto t0 = Clock::now();
    // On the library's own pool, as matmul runs it. NOTE: a pool's first
    // jobs can run at one thread's rate while the VM keeps its fresh worker
    // on the caller's vCPU (main measures nabla's gemm last for that);
    // bench/train_step.sh keeps the best of three processes.
    cpu::parallel_for(threads, threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t lo = M * t / threads, hi = M * (t + 1) / threads;
        gemm(false, false, hi - lo, N, K, 1.0f, A.data() + lo * K, K, B.data(), N, 0.0f, C.data() + lo * N, N);
      }
    });
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * M * N * K / s * 1e-9);
  }
  return best;
}

void check_replicas(int64_t batch, int replicas) {
  if (batch % replicas != 0) {
    throw UsageError(fmt::format("nabla_bench_train: --replicas {} does not divide the batch of {}", replicas, batch));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nabla training-step benchmark"};
  std::string model_name;
  int64_t batch = 0, context = 0;
  int steps = 10, warmup = 2, threads = 2, replicas = 0;
  bool machine = false, config_only = false, bf16_matmul = false, low_memory = false;
  bool low_memory_on = false, low_memory_off = false;
  app.add_option("--model", model_name, "vit-tiny, fmnist, gpt2-small-byte, gpt2 or smollm2-135m");
  app.add_option("--batch", batch, "Batch size (default: the configuration's)");
  app.add_option("--context", context, "Tokens per sequence (GPT-2, Llama)");
  app.add_option("--steps", steps, "Timed steps")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "Untimed steps first")->check(CLI::Range(0, 100000));
  app.add_option("--threads", threads, "Threads")->check(CLI::Range(1, 256));
  app.add_flag("--bf16-matmul", bf16_matmul, "Matmul operands rounded to bf16, f32 accumulation");
  app.add_option("--replicas", replicas, "Data-parallel replicas, each a share of the batch (0: the trainers' default)")
      ->check(CLI::Range(0, 256));
  auto* on = app.add_flag("--low-memory", low_memory_on,
                          "Keep small-factored weight gradients factored (TrainStep low_memory; default: "
                          "default_low_memory, as the trainers)");
  app.add_flag("--no-low-memory", low_memory_off, "Hold every weight gradient whole")->excludes(on);
  app.add_flag("--config", config_only, "Print the model's config JSON (for the PyTorch peer) and exit");
  int lora = 0;
  app.add_option("--lora", lora,
                 "Llama presets: train LoRA adapters of this rank (alpha 2r, no dropout) on all seven projections "
                 "of a frozen base instead of every weight")
      ->check(CLI::Range(0, 4096));
  std::string save, base;
  app.add_option("--save", save, "Llama presets: write the initial weights to this checkpoint and exit");
  app.add_option("--base", base,
                 "Llama presets: the weights from this checkpoint or GGUF file (of the preset's shape); with --lora, "
                 "a GGUF's F16/BF16/quantized projections stay so (QLoRA)");
  bool checkpointing = false;
  app.add_flag("--gradient-checkpointing", checkpointing,
               "Llama presets: recompute each block's activations and the head's logits in the backward");
  app.add_flag("--machine", machine, "Measure the FMA peak, OpenBLAS sgemm and nabla gemm rates instead");
  std::string backend = "cpu";
  app.add_option("--backend", backend, "Backend that runs the step (cpu, cuda, ...)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const bool replicas_given = replicas > 0, low_memory_given = low_memory_on || low_memory_off;
  // The trainers' choices where not told; replicas given rule out low memory.
  const auto choose_defaults = [&](int64_t parameters) {
    // A backend with memory of its own runs one replica, gradients whole.
    if (backend != "cpu" && replicas == 0) replicas = 1;
    low_memory = low_memory_given ? low_memory_on : backend == "cpu" && replicas <= 1 && default_low_memory(parameters);
    if (replicas == 0) replicas = low_memory ? 1 : default_replicas(threads, batch, parameters);
    check_replicas(batch, replicas);
  };
  try {
    if (machine) {
      const double fma = fma_peak_gflops(threads);
      const double sgemm = gemm_gflops(threads, &cpu::gemm_blas<float>);
      const double gemm = gemm_gflops(threads, &cpu::gemm<float>);
      fmt::print(
          "{{\"kind\": \"machine\", \"fma_gflops\": {:.1f}, \"sgemm_gflops\": {:.1f}, \"gemm_gflops\": {:.1f}, "
          "\"threads\": {}, \"gemm\": \"{}\", \"gemm_bf16\": \"{}\"}}\n",
          fma, sgemm, gemm, threads, cpu::gemm_backend(), cpu::gemm_bf16_backend());
      return 0;
    }
    Result r;
    std::string unit;
    if (lora > 0 && model_name != "smollm2-135m" && model_name != "llama-tiny-byte") {
      throw UsageError("nabla_bench_train: --lora takes a Llama preset (smollm2-135m, llama-tiny-byte)");
    }
    if (model_name == "vit-tiny" || model_name == "fmnist") {
      models::VitConfig c = models::vit_preset(model_name);
      if (batch == 0) batch = model_name == "fmnist" ? 128 : 8;
      if (config_only) return fmt::print("{}\n", c.to_json()), 0;
      models::Vit model(c, 1);
      choose_defaults(model.params().count());
      Tensor images = Tensor::zeros(DType::f32, {batch / replicas, c.in_chans, c.img_size, c.img_size});
      Tensor labels = Tensor::zeros(DType::i32, {batch / replicas});
      r = run_model(model, model.params(), images, labels, c.num_classes, batch, steps, warmup, threads, bf16_matmul,
                    low_memory, replicas, backend);
      unit = "images";
    } else if (model_name == "gpt2-small-byte" || model_name == "gpt2") {
      models::Gpt2Config c = models::gpt2_preset(model_name);
      if (batch == 0) batch = model_name == "gpt2" ? 4 : 8;
      if (context == 0) context = model_name == "gpt2" ? 64 : 256;
      if (config_only) return fmt::print("{}\n", c.to_json()), 0;
      models::Gpt2 model(c, 1);
      choose_defaults(model.params().count());
      Tensor tokens = Tensor::zeros(DType::i32, {batch / replicas, context + 1});
      r = run_model(model, model.params(), tokens, Tensor(), c.vocab_size, batch * context, steps, warmup, threads,
                    bf16_matmul, low_memory, replicas, backend);
      unit = "tokens";
    } else if (model_name == "smollm2-135m" || model_name == "llama-tiny-byte") {
      models::LlamaConfig c = models::llama_preset(model_name);
      if (batch == 0) batch = 4;
      if (context == 0) context = 256;
      if (config_only) return fmt::print("{}\n", c.to_json()), 0;
      std::unique_ptr<models::Llama> built =
          base.empty() ? std::make_unique<models::Llama>(c, 1)
                       : std::make_unique<models::Llama>(models::load_any_checkpoint(base, /*keep_stored=*/lora > 0));
      models::Llama& model = *built;
      if (model.config().parameter_count() != c.parameter_count()) {
        throw UsageError("nabla_bench_train: " + base + " is not of " + model_name + "'s shape");
      }
      if (!save.empty()) return save_checkpoint(save, c.to_json(), model.params()), 0;
      model.set_gradient_checkpointing(checkpointing);
      if (checkpointing) model_name += "-ckpt";
      if (const nn::StoredFormat* f = model.params().format("model.layers.0.mlp.up_proj.weight")) {
        model_name += std::string("-") + ggml_type_name(f->type);
      }
      if (lora > 0) {
        model.add_lora({.r = lora, .alpha = 2.0 * lora}, 2);
        model_name += "-lora" + std::to_string(lora);
      }
      const nn::Params& trained = lora > 0 ? model.adapter() : model.params();
      choose_defaults(trained.count());
      Tensor tokens = Tensor::zeros(DType::i32, {batch / replicas, context + 1});
      r = run_model(model, trained, tokens, Tensor(), c.vocab_size, batch * context, steps, warmup, threads,
                    bf16_matmul, low_memory, replicas, backend);
      unit = "tokens";
    } else {
      throw UsageError("nabla_bench_train: unknown --model '" + model_name +
                       "' (vit-tiny, fmnist, gpt2-small-byte, gpt2, smollm2-135m)");
    }
    fmt::print(
        "{{\"framework\": \"nabla\", \"model\": \"{}\", \"bf16_matmul\": {}, \"low_memory\": {}, \"low_memory_given\": {}, \"factored\": {}, \"replicas\": {}, \"replicas_given\": {}, \"batch\": {}, \"context\": {}, \"threads\": {}, "
        "\"unit\": \"{}\", \"step_ms\": {:.2f}, \"per_s\": {:.1f}, \"matmul_gflop_per_step\": {:.3f}, "
        "\"gflops\": {:.1f}, \"peak_rss_mib\": {:.1f}, \"arena_mib\": {:.1f}, \"params\": {:.0f}, "
        "\"first_loss\": {:.4f}, \"last_loss\": {:.4f}, \"backend\": \"{}\", \"peak_device_mib\": {:.1f}}}\n",
        model_name, bf16_matmul, low_memory, low_memory_given, r.factored, replicas, replicas_given, batch, context, threads, unit, r.step_ms, r.items_per_s, r.gflop_per_step,
        r.achieved_gflops, r.rss_mib, r.arena_mib, r.params, r.first_loss, r.last_loss, backend, r.device_mib);
    return 0;
  } catch (const UsageError& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "nabla_bench_train: {}\n", e.what());
    return 1;
  }
}
