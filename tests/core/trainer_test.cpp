// TrainStep: what it compiles for the optimizer.
#include <gtest/gtest.h>

#include "backends.h"

#include <cmath>

#include "backend/cpu/gemm.h"
#include "core/node.h"
#include "nabla/nabla.hpp"
#include "nabla/trainer.h"
#include "ops/internal_ops.h"
#include "train/factored_gradient.h"
#include "tied_model.h"

using namespace nabla;

using testing_models::ramp;
using testing_models::TiedModel;

// layer_norm_affine's backward gives dx, dgamma and dbeta in one buffer; the
// step copies the parameters' gradients out, so that buffer is not held for
// the rest of the step, and they read as the gradients computed on their own.
TEST(TrainStep, ParameterGradientsHaveMemoryOfTheirOwn) {
  nn::Params params;
  Tensor gamma = params.add("gamma", ramp({16}, 0.3)), beta = params.add("beta", ramp({16}, 0.7));
  Tensor x = ramp({8, 16}, 1.1);
  Tensor loss = sum(square(layer_norm(x, gamma, beta, 1e-5) * ramp({8, 16}, 0.5)));
  std::vector<Tensor> expect = eval(grad(loss, {gamma, beta}), {.threads = 1});
  TrainStep step(loss, params, {}, optim::AdamWConfig{}, ExecOptions{.threads = 1});
  step.run();
  ASSERT_EQ(step.gradients().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Tensor& g = step.gradients()[i];
    EXPECT_FALSE(g.node()->is_view()) << params.list()[i].first;
    std::vector<float> got = step.executor().read<float>(g), want = expect[i].to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-4 * (1 + std::abs(want[j])));
  }
}

namespace {

// Trains `steps` steps and returns every parameter's values and each norm.
struct TiedShape {
  int64_t batch, seq, vocab, dim, hidden;
};

std::pair<std::vector<std::vector<float>>, std::vector<double>> train_tied(bool low_memory, bool bf16, double clip,
                                                                           int* factored = nullptr,
                                                                           TiedShape shape = {2, 8, 160, 128, 256},
                                                                           int steps = 3) {
  TiedModel m(shape.batch, shape.seq, shape.vocab, shape.dim, shape.hidden);
  TrainStep step(m.loss, m.params, {}, optim::AdamWConfig{}, ExecOptions{.threads = 2, .bf16_matmul = bf16},
                 {.low_memory = low_memory});
  if (factored) *factored = step.factored_gradients();
  std::vector<double> norms;
  for (int i = 0; i < steps; ++i) {
    step.run();
    norms.push_back(step.update(1e-2, clip));
  }
  std::vector<std::vector<float>> values;
  for (const auto& [name, p] : m.params.list()) values.push_back(p.to_vector<float>());
  return {values, norms};
}

}  // namespace

// low_memory keeps the weights' gradients as their factors and multiplies
// them out in update(): the same products and row additions as the graph's,
// so without clipping the parameters come out bit for bit the same. The
// clip's norm comes from the factors' Gram matrices: equal to rounding, and
// so are the clipped parameters after one step. Not after more: at this
// learning rate a clip 1e-8 smaller (what the two norms' rounding differs
// by) moved the whole-gradient run's second norm by 5e-6 of it at 198
// tokens, so with a clip the runs take one step, and the norms of later
// steps are compared unclipped, where the parameters stay the same. 16
// tokens make one tile of Gram rows; 198 make four rows of tiles (the last
// 6 rows, not a whole sub-tile of 4), so the tiles left of the diagonal,
// which count twice, are summed too.
TEST(TrainStep, LowMemoryTrainsTheSameParameters) {
  static_assert(train::GradientRows::kGramRows == 64, "198 tokens: tiles of 64, 64, 64 and 6 rows");
  for (const TiedShape shape : {TiedShape{2, 8, 160, 128, 256}, TiedShape{2, 99, 1024, 384, 1024}}) {
    for (bool bf16 : {false, true}) {
      for (double clip : {0.0, 0.05}) {
        SCOPED_TRACE(std::to_string(shape.batch * shape.seq) + " tokens, " + (bf16 ? "bf16" : "f32") + " clip " +
                     std::to_string(clip));
        int factored = -1;
        const int steps = clip > 0 ? 1 : 3;
        const auto [want, want_norms] = train_tied(false, bf16, clip, nullptr, shape, steps);
        const auto [got, got_norms] = train_tied(true, bf16, clip, &factored, shape, steps);
        EXPECT_EQ(factored, 4);  // wte (with its lookup's rows), fc, proj and qkv; not the bias
        if (clip > 0) {
          ASSERT_GT(want_norms[0], clip);  // the clip is exercised
        }
        ASSERT_EQ(got_norms.size(), want_norms.size());
        for (size_t i = 0; i < got_norms.size(); ++i) EXPECT_NEAR(got_norms[i], want_norms[i], 1e-6 * want_norms[i]);
        ASSERT_EQ(got.size(), want.size());
        // Bit for bit where both paths run nabla's own kernels (OpenBLAS's
        // order may depend on the rows it is given).
        const bool exact = clip == 0 && (bf16 || cpu::gemm_avx512_native());
        for (size_t i = 0; i < got.size(); ++i) {
          if (exact) {
            EXPECT_EQ(got[i], want[i]) << "parameter " << i;
            continue;
          }
          for (size_t j = 0; j < got[i].size(); ++j) EXPECT_NEAR(got[i][j], want[i][j], 1e-5) << "parameter " << i;
        }
      }
    }
  }
}

TEST(TrainStep, LowMemoryFactorsOnlyWhatItShrinks) {
  // 64 tokens: fc's factors [64, 256] and [64, 128] still hold less than its
  // [256, 128] (proj's and qkv's likewise), wte's [64, 160], [64, 128] and
  // the lookup's rows more than its [160, 128].
  TiedModel m(8, 8, 160, 128, 256);
  TrainStep step(m.loss, m.params, {}, optim::AdamWConfig{}, ExecOptions{.threads = 1}, {.low_memory = true});
  EXPECT_EQ(step.factored_gradients(), 3);
  EXPECT_TRUE(step.gradients()[0].defined());   // wte
  EXPECT_FALSE(step.gradients()[1].defined());  // fc.weight
  EXPECT_FALSE(step.gradients()[2].defined());  // proj.weight
  EXPECT_TRUE(step.gradients()[3].defined());   // fc.bias
  EXPECT_FALSE(step.gradients()[4].defined());  // qkv.weight
}

TEST(TrainStep, LowMemoryRefusesMicroBatches) {
  TiedModel m(2, 8, 160, 128, 256);
  EXPECT_THROW(TrainStep(m.loss, m.params, {}, optim::AdamWConfig{}, ExecOptions{.threads = 1},
                         {.micro_batches = 2, .low_memory = true}),
               UsageError);
}

// A factor that is a leaf (here the input x of a linear layer) is copied in
// the run: a caller that writes the next batch into x before update() still
// gets this run's gradient.
TEST(TrainStep, LowMemoryFactorsAreTheRunsValues) {
  const auto train = [](bool low_memory) {
    nn::Params params;
    Tensor w = params.add("w", ramp({256, 128}, 0.29));
    Tensor x = ramp({16, 128}, 0.61);
    Tensor loss = sum(square(matmul(x, transpose(w))));
    TrainStep step(loss, params, {}, optim::AdamWConfig{}, ExecOptions{.threads = 2}, {.low_memory = low_memory});
    EXPECT_EQ(step.factored_gradients(), low_memory ? 1 : 0);
    for (int i = 0; i < 2; ++i) {
      step.run();
      for (int64_t k = 0; k < x.numel(); ++k) x.data_as<float>()[k] = float(k % 7) - 3.0f;  // the next batch
      step.update(1e-2, 0.0);
    }
    return w.to_vector<float>();
  };
  const std::vector<float> want = train(false), got = train(true);
  ASSERT_EQ(got.size(), want.size());
  if (cpu::gemm_avx512_native()) {
    EXPECT_EQ(got, want);
  } else {
    for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-5);
  }
}

namespace {

struct Trained {
  std::vector<std::vector<float>> params;
  std::vector<float> losses;
  std::vector<double> norms;  // the batch gradient's, before clipping
};

// Trains TiedModel on a batch of 4 sequences as `replicas` replicas of
// 4 / (replicas * micro_batches) sequences each, over `micro_batches` runs
// per update.
Trained train_replicated(int replicas, int micro_batches, int threads, const std::string& backend = "cpu") {
  constexpr int64_t kBatch = 4, kSeq = 8;
  TiedModel whole(kBatch, kSeq, 160, 128, 256);  // the batch's tokens
  const int64_t share = kBatch / (replicas * micro_batches);
  TiedModel m(share, kSeq, 160, 128, 256);
  TrainStep step(m.loss, m.params, {}, optim::AdamWConfig{}, ExecOptions{.threads = threads, .backend = backend},
                 {.micro_batches = micro_batches, .replicas = replicas});
  EXPECT_EQ(step.replicas(), replicas);
  Trained out;
  for (int i = 0; i < 3; ++i) {
    double loss = 0;
    for (int mb = 0; mb < micro_batches; ++mb) {
      for (int r = 0; r < replicas; ++r) {
        const int64_t first = (int64_t(mb) * replicas + r) * share * kSeq;
        for (Tensor whole_t : {whole.tokens, whole.targets}) {
          Tensor mine = step.in_replica(r, whole_t.node() == whole.tokens.node() ? m.tokens : m.targets);
          // A different sequence each step: rotate the batch's tokens.
          for (int64_t k = 0; k < mine.numel(); ++k) {
            mine.data_as<int32_t>()[k] = whole_t.data_as<int32_t>()[(first + k + 3 * i) % (kBatch * kSeq)];
          }
        }
      }
      step.run();
      loss += step.loss();
    }
    out.losses.push_back(float(loss / micro_batches));
    out.norms.push_back(step.update(1e-2, 0.05));  // clipped: the norm is the whole batch's
  }
  for (const auto& [name, p] : m.params.list()) out.params.push_back(p.to_vector<float>());
  return out;
}

}  // namespace

// Replicas each run a share of the batch on a copy of the graph that shares
// the parameters; their gradients sum to the whole batch's, so training
// follows the single graph's to rounding (the batch is summed in groups), and
// with micro-batches too. The replica count, not the thread count, fixes the
// bits.
TEST(TrainStep, ReplicasTrainAsOneBatch) {
  const Trained want = train_replicated(1, 1, 2);
  for (auto [replicas, micro_batches] : {std::pair{2, 1}, {4, 1}, {2, 2}, {1, 2}, {1, 4}}) {
    SCOPED_TRACE(std::to_string(replicas) + " replicas x " + std::to_string(micro_batches) + " micro-batches");
    const Trained got = train_replicated(replicas, micro_batches, 2);
    for (size_t i = 0; i < got.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], want.losses[i], 1e-6 * want.losses[i]);
      ASSERT_GT(want.norms[i], 0.05);  // the clip is exercised
      EXPECT_NEAR(got.norms[i], want.norms[i], 1e-6 * want.norms[i]);
    }
    // Each parameter moved by about lr = 1e-2 a step. AdamW's first steps
    // are close to lr * sign(g), so an element whose gradient is near zero
    // turns rounding into up to a fraction of a step: 1% of lr allowed.
    ASSERT_EQ(got.params.size(), want.params.size());
    const std::vector<float> initial = TiedModel(1, 8, 160, 128, 256).params.list()[0].second.to_vector<float>();
    double moved = 0;
    for (size_t j = 0; j < initial.size(); ++j) moved = std::max(moved, double(std::abs(want.params[0][j] - initial[j])));
    EXPECT_GT(moved, 2e-2);
    for (size_t i = 0; i < got.params.size(); ++i) {
      ASSERT_EQ(got.params[i].size(), want.params[i].size());
      for (size_t j = 0; j < got.params[i].size(); ++j) {
        EXPECT_NEAR(got.params[i][j], want.params[i][j], 1e-4) << "parameter " << i;
      }
    }
    const Trained one_thread = train_replicated(replicas, micro_batches, 1);
    EXPECT_EQ(one_thread.params, got.params);
    EXPECT_EQ(one_thread.losses, got.losses);
  }
}

// Micro-batches alone are summed by graph nodes (accumulate_update), so a
// backend with memory of its own sums them where the gradients are: the
// same training as the CPU's to rounding. Replicas sum in host memory and
// are refused there, saying why.
TEST(TrainStep, MicroBatchesSumOnEveryBackend) {
  const Trained cpu = train_replicated(1, 2, 2);
  for (const std::string& backend : testing_backends::device_backends()) {
    SCOPED_TRACE(backend);
    const Trained got = train_replicated(1, 2, 2, backend);
    for (size_t i = 0; i < got.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], cpu.losses[i], 1e-5 * cpu.losses[i]);
      EXPECT_NEAR(got.norms[i], cpu.norms[i], 1e-5 * cpu.norms[i]);
    }
    // The norms (of the summed gradients) hold the sums to f32 rounding. The
    // parameters move lr = 1e-2 a step, AdamW's first steps close to lr *
    // sign(g): where g is near zero a backend's own rounding (the reference
    // sums in double) moves an element by up to 1.5% of lr with one
    // micro-batch too, so 2% of lr is allowed.
    for (size_t i = 0; i < got.params.size(); ++i) {
      for (size_t j = 0; j < got.params[i].size(); ++j) {
        ASSERT_NEAR(got.params[i][j], cpu.params[i][j], 2e-4) << "parameter " << i << " element " << j;
      }
    }
    TiedModel m(1, 8, 160, 128, 256);
    try {
      TrainStep step(m.loss, m.params, {}, optim::AdamWConfig{}, ExecOptions{.backend = backend}, {.replicas = 2});
      FAIL() << "two replicas on " << backend;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("replicas sum gradients in host memory"), std::string::npos)
          << e.what();
    }
  }
}

TEST(TrainStep, ReplicasHaveTheirOwnLeavesAndShareTheParameters) {
  TiedModel m(1, 8, 160, 128, 256);
  Tensor outside = ramp({3}, 0.1);
  TrainStep step(m.loss, m.params, {}, optim::AdamWConfig{}, ExecOptions{.threads = 2}, {.replicas = 3});
  EXPECT_EQ(step.in_replica(0, m.tokens).node(), m.tokens.node());
  for (int r = 1; r < 3; ++r) {
    Tensor tokens = step.in_replica(r, m.tokens);
    EXPECT_NE(tokens.node(), m.tokens.node());
    EXPECT_EQ(tokens.to_vector<int32_t>(), m.tokens.to_vector<int32_t>());  // copied with its values
    EXPECT_NE(tokens.node(), step.in_replica(3 - r, m.tokens).node());
    const Tensor& wte = m.params.list()[0].second;
    EXPECT_EQ(step.in_replica(r, wte).node(), wte.node());
  }
  EXPECT_THROW(step.in_replica(1, outside), UsageError);
  EXPECT_THROW(step.in_replica(3, m.tokens), UsageError);
  EXPECT_THROW(step.executor(-1), UsageError);
  EXPECT_THROW(TrainStep(m.loss, m.params, {}, optim::AdamWConfig{}, ExecOptions{.threads = 1}, {.replicas = 0}),
               UsageError);
  EXPECT_THROW(TrainStep(m.loss, m.params, {}, optim::AdamWConfig{}, ExecOptions{.threads = 1}, {.low_memory = true, .replicas = 2}),
               UsageError);
}

TEST(TrainStep, DefaultReplicasAreOnePerThreadForSmallModels) {
  EXPECT_EQ(default_replicas(2, 128, 460'000), 2);
  EXPECT_EQ(default_replicas(2, 127, 460'000), 1);     // the batch does not divide
  EXPECT_EQ(default_replicas(2, 8, 5'700'000), 1);     // a gradient copy per replica costs too much
  EXPECT_EQ(default_replicas(1, 128, 460'000), 1);
}

// Factored gradients by default for GPT-2 124M's size (its gradients are a
// quarter of its step's memory), not for the small presets.
TEST(TrainStep, DefaultLowMemoryIsForLargeModels) {
  EXPECT_TRUE(default_low_memory(124'439'808));
  EXPECT_FALSE(default_low_memory(10'700'000));  // gpt2-small-byte
  EXPECT_FALSE(default_low_memory(5'717'416));   // vit-tiny
}

// The update is the step graph's stage 1 (squared_norm, clip_scale,
// adamw_update nodes): bit for bit optim::AdamW and global_norm on the same
// gradients, a step clipped and one not, with a parameter left undecayed
// after construction.
TEST(TrainStep, UpdateInTheGraphGivesTheOptimizersBits) {
  TiedModel m(2, 8, 160, 128, 256);
  const optim::AdamWConfig config{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  TrainStep step(m.loss, m.params, {}, config, ExecOptions{.threads = 2});
  step.optimizer().set_decay(0, false);
  std::vector<optim::Slot> shadow_slots;
  for (size_t i = 0; i < m.params.list().size(); ++i) {
    const auto& [name, p] = m.params.list()[i];
    shadow_slots.push_back({name, Tensor::from_vector<float>(p.shape(), p.to_vector<float>()),
                            i == 0 ? false : optim::default_decay(name, p)});
  }
  optim::AdamW shadow(shadow_slots, config, 2);
  for (double clip : {0.05, 0.0, 1e9}) {
    step.run();
    std::vector<Tensor> grads;
    std::vector<const float*> ptrs;
    std::vector<int64_t> sizes;
    for (const Tensor& g : step.gradients()) {
      grads.push_back(step.executor().fetch(g));
      ptrs.push_back(grads.back().data_as<float>());
      sizes.push_back(g.numel());
    }
    const double want_norm = optim::global_norm(ptrs, sizes, 2);
    const double scale = clip > 0 && want_norm > clip ? clip / want_norm : 1.0;
    shadow.step(ptrs, 1e-2, scale);
    EXPECT_EQ(step.update(1e-2, clip), want_norm);
    for (size_t i = 0; i < shadow_slots.size(); ++i) {
      EXPECT_EQ(m.params.list()[i].second.to_vector<float>(), shadow_slots[i].param.to_vector<float>())
          << m.params.list()[i].first << " with clip " << clip;
    }
  }
  EXPECT_EQ(step.optimizer().steps(), 3);
  EXPECT_THROW(step.update(1e-2, 0), UsageError);  // no run since
  step.run();
  EXPECT_THROW(step.update(-1, 0), UsageError);
  EXPECT_EQ(step.optimizer().steps(), 3);
}

// low_memory on the reference backend: what autodiff left as a product there
// (no CPU fusions) is factored, its norm and update run the reference
// kernels, and three clipped steps follow the CPU's low-memory ones. Adam's
// eps is 1e-3, where a rounding difference in a near-zero gradient cannot
// flip a step's sign (as with 1e-8); they agree to 3.6e-5 of lr
// (2026-12-05), and 1e-3 of lr leaves a margin.
TEST(TrainStep, LowMemoryRunsOnTheReferenceBackend) {
  const optim::AdamWConfig config{.eps = 1e-3};
  std::vector<std::vector<float>> params[2];
  std::vector<double> norms[2];
  for (int b = 0; b < 2; ++b) {
    TiedModel m(2, 8, 160, 128, 256);
    TrainStep step(m.loss, m.params, {}, config, ExecOptions{.threads = 2, .backend = b ? "reference" : "cpu"},
                   {.low_memory = true});
    EXPECT_GT(step.factored_gradients(), 0) << (b ? "reference" : "cpu");
    for (int i = 0; i < 3; ++i) {
      step.run();
      norms[b].push_back(step.update(1e-2, 0.05));
    }
    for (const auto& [name, p] : m.params.list()) params[b].push_back(p.to_vector<float>());
  }
  // The CPU's Gram-matrix norm agrees with a materialised one to about 1e-6
  // (factored_gradient.h); the reference multiplies the product out in double.
  for (size_t i = 0; i < norms[0].size(); ++i) EXPECT_NEAR(norms[1][i], norms[0][i], 1e-5 * norms[0][i]);
  for (size_t i = 0; i < params[0].size(); ++i) {
    double worst = 0;
    for (size_t j = 0; j < params[0][i].size(); ++j) {
      worst = std::max(worst, double(std::abs(params[1][i][j] - params[0][i][j])));
    }
    EXPECT_LE(worst, 1e-3 * 1e-2) << "parameter " << i;
  }
}
