// The C API's jobs in a process no launcher started: a job of one, on which
// NABLA_TRAIN_JOB and NABLA_FINETUNE_JOB change nothing, and the fine-tuning
// replicas' weighting by counted tokens. Jobs of several processes run under
// mpirun in tests/c_api/ruby_job.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "models/small_llama.h"
#include "nabla.h"
#include "nabla/checkpoint.h"
#include "nabla/io.h"
#include "nabla/models/llama.h"
#include "temp_dir.h"

namespace {

std::string error() { return nabla_last_error(); }

TEST(CApiJob, AProcessAloneIsAJobOfOne) {
  nabla_job *job = nullptr, *again = nullptr;
  ASSERT_EQ(nabla_job_join(&job), NABLA_OK) << error();
  int rank = -1, size = -1;
  ASSERT_EQ(nabla_job_rank(job, &rank, &size), NABLA_OK);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
  const char* text = nullptr;
  ASSERT_EQ(nabla_job_describe(job, &text), NABLA_OK);
  EXPECT_STREQ(text, "1 process (no launcher)");
  double values[3] = {1.5, -2, 7};
  ASSERT_EQ(nabla_job_sum(job, values, 3), NABLA_OK);
  EXPECT_EQ(values[1], -2);
  int32_t seed = 41;
  EXPECT_EQ(nabla_job_broadcast(job, &seed, sizeof seed, 0), NABLA_OK);
  EXPECT_EQ(seed, 41);
  EXPECT_EQ(nabla_job_broadcast(job, &seed, sizeof seed, 1), NABLA_ERROR_ARGUMENT);
  EXPECT_NE(error().find("root 1 is outside [0, 1)"), std::string::npos) << error();
  EXPECT_EQ(nabla_job_barrier(job), NABLA_OK);
  ASSERT_EQ(nabla_job_join(&again), NABLA_OK);
  EXPECT_EQ(nabla_job_rank(again, nullptr, &size), NABLA_OK);
  EXPECT_EQ(nabla_job_sum(job, nullptr, 2), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(nabla_job_rank(nullptr, &rank, &size), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(nabla_job_join(nullptr), NABLA_ERROR_ARGUMENT);
  nabla_job_free(job);
  nabla_job_free(again);
  nabla_job_free(nullptr);
}

// A two-layer regression trained 3 steps: its loss per step and final
// weights, with `flags`.
struct Trained {
  std::vector<float> losses, weights;
};
Trained train_regression(int flags, const char* checkpoint = nullptr) {
  Trained out;
  nabla_context* ctx = nullptr;
  EXPECT_EQ(nabla_context_create(&ctx), NABLA_OK);
  auto leaf = [&](std::vector<int64_t> shape, bool parameter, double phase) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(std::sin(phase + 0.7 * double(i)));
    nabla_tensor* t = nullptr;
    EXPECT_EQ((parameter ? nabla_parameter : nabla_tensor_from_data)(ctx, NABLA_F32, int(shape.size()), shape.data(),
                                                                      v.data(), &t),
              NABLA_OK);
    return t;
  };
  nabla_tensor *x = leaf({8, 5}, false, 0.1), *target = leaf({8, 2}, false, 0.9), *w1 = leaf({5, 6}, true, 0.3),
               *w2 = leaf({6, 2}, true, 1.7);
  nabla_tensor *h = nullptr, *a = nullptr, *y = nullptr, *d = nullptr, *sq = nullptr, *loss = nullptr;
  EXPECT_EQ(nabla_matmul(ctx, x, w1, &h), NABLA_OK);
  EXPECT_EQ(nabla_tanh(ctx, h, &a), NABLA_OK);
  EXPECT_EQ(nabla_matmul(ctx, a, w2, &y), NABLA_OK);
  EXPECT_EQ(nabla_sub(ctx, y, target, &d), NABLA_OK);
  EXPECT_EQ(nabla_square(ctx, d, &sq), NABLA_OK);
  EXPECT_EQ(nabla_mean(ctx, sq, nullptr, 0, 0, &loss), NABLA_OK);
  nabla_trainer* trainer = nullptr;
  EXPECT_EQ(nabla_trainer_create(ctx, loss, nullptr, 0, 0.9, 0.999, 1e-8, 0.01, nullptr, 0, 1, flags, &trainer),
            NABLA_OK)
      << error();
  if (!trainer) return out;
  for (int step = 0; step < 3; ++step) {
    float value = 0;
    EXPECT_EQ(nabla_trainer_run(trainer, &value), NABLA_OK) << error();
    EXPECT_EQ(nabla_trainer_update(trainer, 0.05, 1.0, nullptr), NABLA_OK) << error();
    out.losses.push_back(value);
  }
  if (checkpoint) {
    // Saved, trained on, and loaded back: the weights are the saved ones.
    EXPECT_EQ(nabla_trainer_save(trainer, checkpoint, nullptr), NABLA_OK) << error();
    EXPECT_EQ(nabla_trainer_run(trainer, nullptr), NABLA_OK);
    EXPECT_EQ(nabla_trainer_update(trainer, 0.05, 1.0, nullptr), NABLA_OK);
    EXPECT_EQ(nabla_trainer_load(trainer, checkpoint, nullptr), NABLA_OK) << error();
    int64_t steps = 0;
    EXPECT_EQ(nabla_trainer_steps(trainer, &steps), NABLA_OK);
    EXPECT_EQ(steps, 3);
  }
  for (nabla_tensor* w : {w1, w2}) {
    int64_t n = 0;
    EXPECT_EQ(nabla_tensor_numel(w, &n), NABLA_OK);
    std::vector<float> v(static_cast<size_t>(n));
    EXPECT_EQ(nabla_trainer_read(trainer, w, v.data(), v.size() * sizeof(float)), NABLA_OK);
    out.weights.insert(out.weights.end(), v.begin(), v.end());
  }
  nabla_context_free(ctx);
  return out;
}

TEST(CApiJob, TrainerOnAJobOfOneTrainsAsWithout) {
  nabla::testing_support::TempDir dir;
  const Trained alone = train_regression(0);
  ASSERT_EQ(alone.losses.size(), 3u);
  EXPECT_LT(alone.losses[2], alone.losses[0]);

  // NABLA_TRAIN_JOB needs a joined job; sharding needs NABLA_TRAIN_JOB.
  nabla_context* ctx = nullptr;
  ASSERT_EQ(nabla_context_create(&ctx), NABLA_OK);
  const int64_t shape[1] = {3};
  nabla_tensor *w = nullptr, *loss = nullptr;
  ASSERT_EQ(nabla_parameter(ctx, NABLA_F32, 1, shape, nullptr, &w), NABLA_OK);
  ASSERT_EQ(nabla_sum(ctx, w, nullptr, 0, 0, &loss), NABLA_OK);
  nabla_trainer* trainer = nullptr;
  EXPECT_EQ(nabla_trainer_create(ctx, loss, nullptr, 0, 0.9, 0.999, 1e-8, 0, nullptr, 0, 1, NABLA_TRAIN_JOB, &trainer),
            NABLA_ERROR_USAGE);
  EXPECT_NE(error().find("NABLA_TRAIN_JOB, but this process has not joined a job (nabla_job_join)"), std::string::npos)
      << error();
  EXPECT_EQ(nabla_trainer_create(ctx, loss, nullptr, 0, 0.9, 0.999, 1e-8, 0, nullptr, 0, 1,
                                 NABLA_TRAIN_SHARD_OPTIMIZER, &trainer),
            NABLA_ERROR_ARGUMENT);
  EXPECT_NE(error().find("add NABLA_TRAIN_JOB"), std::string::npos) << error();
  nabla_context_free(ctx);

  nabla_job* job = nullptr;
  ASSERT_EQ(nabla_job_join(&job), NABLA_OK);
  const Trained joined = train_regression(NABLA_TRAIN_JOB | NABLA_TRAIN_SHARD_OPTIMIZER, dir.file("job.safetensors").c_str());
  nabla_job_free(job);
  EXPECT_EQ(joined.losses, alone.losses);
  EXPECT_EQ(joined.weights, alone.weights);
}

// Uneven counted tokens: rows 0-1 count every label, rows 2-3 one each. Two
// replicas (each a pair of rows) weighted by their counted tokens train as
// one replica of all four rows, to rounding; averaged evenly, they would
// not (the check fails with the weights set to 1).
TEST(CApiJob, FinetuneReplicasWeighTheirCountedTokens) {
  nabla::testing_support::TempDir dir;
  const nabla::models::LlamaConfig c = nabla::testing_models::small_llama();
  const std::string base = dir.file("base.safetensors");
  nabla::testing_models::save_llama(base, c);

  constexpr int64_t B = 4, T = 8;
  std::vector<int32_t> ids(B * T), labels(B * T, -100);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[size_t(i)] = int32_t((i * 7 + 3) % c.vocab_size);
    const int64_t row = i / T, t = i % T;
    if (row < 2 || t == T - 1) labels[size_t(i)] = int32_t((i * 5 + 1) % c.vocab_size);
  }
  nabla_job* job = nullptr;
  ASSERT_EQ(nabla_job_join(&job), NABLA_OK);
  struct Result {
    std::vector<float> losses;
    std::vector<float> adapter;
  };
  auto finetune = [&](int flags, const std::string& name) {
    Result r;
    nabla_finetune* ft = nullptr;
    EXPECT_EQ(nabla_finetune_create(base.c_str(), nullptr, 4, 8.0, 0.0, flags, nullptr, B, T, 0.0, 1, 3, &ft), NABLA_OK)
        << error();
    if (!ft) return r;
    int64_t rows = 0;
    EXPECT_EQ(nabla_finetune_shape(ft, &rows, nullptr, nullptr, nullptr), NABLA_OK);
    EXPECT_EQ(rows, B);
    for (int step = 0; step < 3; ++step) {
      float loss = 0;
      EXPECT_EQ(nabla_finetune_step(ft, ids.data(), labels.data(), nullptr, 1e-2, 1.0, &loss), NABLA_OK) << error();
      r.losses.push_back(loss);
    }
    EXPECT_EQ(nabla_finetune_save(ft, dir.file(name).c_str()), NABLA_OK) << error();
    nabla_finetune_free(ft);
    for (const auto& [tensor_name, t] : nabla::load_safetensors(dir.file(name) + "/adapter_model.safetensors").tensors) {
      const float* p = static_cast<const float*>(t.data());
      r.adapter.insert(r.adapter.end(), p, p + t.numel());
    }
    return r;
  };
  const Result one = finetune(0, "one");
  const Result two = finetune(NABLA_FINETUNE_REPLICAS(2), "two");
  const Result joined = finetune(NABLA_FINETUNE_REPLICAS(2) | NABLA_FINETUNE_JOB, "joined");
  nabla_job_free(job);
  ASSERT_EQ(one.losses.size(), 3u);
  ASSERT_EQ(two.losses.size(), 3u);
  // The same terms summed in another grouping (per replica, then weighted):
  // equal to rounding (measured: the losses equal, the adapter within 4.4e-6
  // of its scale after three steps).
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(two.losses[i], one.losses[i], 1e-5 * one.losses[i]) << "step " << i;
  ASSERT_EQ(two.adapter.size(), one.adapter.size());
  ASSERT_FALSE(one.adapter.empty());
  float scale = 0;
  for (float v : one.adapter) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < one.adapter.size(); ++i) ASSERT_NEAR(two.adapter[i], one.adapter[i], 1e-4 * scale) << i;
  // A job of one changes nothing.
  EXPECT_EQ(joined.losses, two.losses);
  EXPECT_EQ(joined.adapter, two.adapter);

  // Bad flags name what is wrong.
  nabla_finetune* ft = nullptr;
  EXPECT_EQ(nabla_finetune_create(base.c_str(), nullptr, 4, 8.0, 0.0, NABLA_FINETUNE_JOB, nullptr, B, T, 0.0, 1, 3, &ft),
            NABLA_ERROR_USAGE);
  EXPECT_NE(error().find("nabla_job_join"), std::string::npos) << error();
  EXPECT_EQ(nabla_finetune_create(base.c_str(), nullptr, 4, 8.0, 0.0, NABLA_FINETUNE_REPLICAS(3), nullptr, B, T, 0.0, 1,
                                  3, &ft),
            NABLA_ERROR_USAGE);
  EXPECT_NE(error().find("do not divide the batch of 4"), std::string::npos) << error();
}

}  // namespace
