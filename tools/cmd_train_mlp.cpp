// `nabla train mlp`: a 2-layer MLP learns three interleaved spirals, the
// smallest model the training loop (train_loop.h) runs: its loss is a
// cross-entropy composed from primitive ops, differentiated like any graph.
//
// Dimensions:
//   N  points in a dataset (kPoints)
//   B  minibatch size (--batch)
//   D  input features (2: x, y)
//   H  hidden units (--hidden)
//   C  classes (3 spiral arms)
//
// Parameters (PyTorch's nn.Linear names):
//   fc1.weight [H, D]   fc1.bias [H]
//   fc2.weight [C, H]   fc2.bias [C]
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "commands.h"
#include "nabla/checkpoint.h"
#include "nabla/config.h"
#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/nn.h"
#include "nabla/ops.h"
#include "train_loop.h"

namespace nabla::cli {
namespace {

constexpr int64_t kPoints = 2000;
constexpr int64_t kFeatures = 2;
constexpr int64_t kClasses = 3;

struct Spirals {
  std::vector<float> x;    // [N, D]
  std::vector<int32_t> y;  // [N], class of each point
};

// Class k's arm: radius r in [0, 1], angle 4k + 4r (radians) plus noise, so
// the three arms wind around each other.
Spirals make_spirals(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.2f);
  Spirals d;
  for (int64_t i = 0; i < kPoints; ++i) {
    int64_t k = i % kClasses;
    float r = float(i / kClasses) / float(kPoints / kClasses);
    float angle = 4.0f * float(k) + 4.0f * r + noise(rng);
    d.x.push_back(r * std::sin(angle));
    d.x.push_back(r * std::cos(angle));
    d.y.push_back(int32_t(k));
  }
  return d;
}

// The checkpoint's "nabla.config".
ConfigFields fields_of(int64_t& hidden) {
  ConfigFields f("mlp config", "mlp");
  f.required("hidden", hidden, 1);
  return f;
}

struct Mlp {
  nn::Linear fc1, fc2;
  Mlp(nn::Params& p, int64_t hidden, uint64_t seed) {
    nn::Init init(seed, nn::Init::Weights::normal);
    fc1 = nn::Linear(p, "fc1", kFeatures, hidden, true, init, 1.0);
    fc2 = nn::Linear(p, "fc2", hidden, kClasses, true, init, 1.0 / std::sqrt(double(hidden)));
  }
  Tensor operator()(const Tensor& x) const { return fc2(tanh(fc1(x))); }  // x [B, D] -> logits [B, C]
};

// Mean cross-entropy of softmax(logits) against one-hot targets, both [B, C],
// composed from primitive ops. The row max is subtracted first so exp cannot
// overflow.
Tensor composed_cross_entropy(const Tensor& logits, const Tensor& onehot) {
  Tensor shifted = logits - max(logits, {1}, true);
  Tensor log_probs = shifted - log(sum(exp(shifted), {1}, true));
  return -mean(sum(log_probs * onehot, {1}));
}

int64_t count_correct(const std::vector<float>& logits, const int32_t* labels, int64_t rows) {
  int64_t correct = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = &logits[size_t(i * kClasses)];
    correct += std::max_element(row, row + kClasses) - row == labels[i];
  }
  return correct;
}

// Minibatches of distinct points drawn from (seed, step) alone, so a resumed
// run sees the same ones; evaluation on fresh points from the same spirals.
class SpiralsTask : public TrainingTask {
 public:
  SpiralsTask(const TrainStep& step, const Mlp& mlp, const Tensor& x, const Tensor& onehot, const Tensor& logits,
              int threads, uint64_t seed)
      : step_(step), train_(make_spirals(seed)), test_(make_spirals(seed + 1)), x_(x), onehot_(onehot), logits_(logits) {
    test_x_ = Tensor::from_vector({kPoints, kFeatures}, test_.x);
    std::vector<float> test_onehot(size_t(kPoints * kClasses), 0.0f);
    for (int64_t i = 0; i < kPoints; ++i) test_onehot[size_t(i * kClasses + test_.y[size_t(i)])] = 1.0f;
    test_logits_ = mlp(test_x_);
    test_loss_ = composed_cross_entropy(test_logits_, Tensor::from_vector({kPoints, kClasses}, test_onehot));
    evaluator_ = std::make_unique<Executor>(Graph({test_loss_, test_logits_}), ExecOptions{.threads = threads});
    batch_y_.resize(size_t(x.dim(0)));
  }

  int64_t batches_per_epoch() const override { return 0; }

  void load_batch(const TrainPosition& pos, int) override {
    const int64_t B = x_.dim(0);
    std::mt19937_64 rng(uint64_t(step_seed(pos.seed, pos.step)));
    std::vector<int64_t> order(kPoints);
    for (int64_t i = 0; i < kPoints; ++i) order[size_t(i)] = i;
    float* x = x_.data_as<float>();
    float* onehot = onehot_.data_as<float>();
    std::fill(onehot, onehot + B * kClasses, 0.0f);
    for (int64_t i = 0; i < B; ++i) {  // the first B of a Fisher-Yates shuffle
      std::swap(order[size_t(i)], order[size_t(i + int64_t(rng() % uint64_t(kPoints - i)))]);
      const int64_t p = order[size_t(i)];
      x[2 * i] = train_.x[size_t(2 * p)];
      x[2 * i + 1] = train_.x[size_t(2 * p + 1)];
      batch_y_[size_t(i)] = train_.y[size_t(p)];
      onehot[i * kClasses + train_.y[size_t(p)]] = 1.0f;
    }
  }

  int64_t correct_predictions() override {
    return count_correct(step_.executor().read<float>(logits_), batch_y_.data(), x_.dim(0));
  }

  Evaluation evaluate() override {
    evaluator_->run();
    const int64_t correct = count_correct(evaluator_->read<float>(test_logits_), test_.y.data(), kPoints);
    return {evaluator_->read<float>(test_loss_)[0], double(correct) / double(kPoints), kPoints};
  }

 private:
  const TrainStep& step_;
  Spirals train_, test_;
  Tensor x_, onehot_, logits_;
  std::vector<int32_t> batch_y_;
  Tensor test_x_, test_logits_, test_loss_;
  std::unique_ptr<Executor> evaluator_;
};

}  // namespace

int run_train_mlp(const TrainMlpArgs& a) {
  const std::optional<Checkpoint> resume = load_resume_checkpoint(a);
  const uint64_t seed = resume ? resume->position.seed : a.seed;
  int64_t H = a.hidden;
  if (resume) {
    try {
      fields_of(H).from_json(resume->config_json);
    } catch (const Error& e) {
      throw IoError(resume->path + ": " + e.what());
    }
  }
  const int64_t B = a.batch;
  nn::Params params;
  Mlp mlp(params, H, seed);
  if (resume) load_params(*resume, params);

  // The training step, built and compiled once.
  Tensor x = Tensor::zeros(DType::f32, {B, kFeatures}).set_name("x");      // [B, D]
  Tensor onehot = Tensor::zeros(DType::f32, {B, kClasses}).set_name("y");  // [B, C]
  Tensor logits = mlp(x);
  Tensor loss = composed_cross_entropy(logits, onehot);
  optim::AdamWConfig adamw;
  adamw.weight_decay = a.weight_decay;
  TrainStep step(loss, params, {logits}, adamw, exec_options(a));
  SpiralsTask task(step, mlp, x, onehot, logits, a.threads, seed);
  TrainingLoop loop(step, task, params, a,
                    {.command = "train mlp",
                     .schedule_steps = a.steps,
                     .min_lr_fraction = 0.1,
                     .examples_per_step = B,
                     .items_per_step = B,
                     .items = "points",
                     .rate_unit = "points/s",
                     .batch = fmt::format("batch {}", B),
                     .eval_name = "test",
                     .config_json = fields_of(H).to_json()},
                    resume ? &*resume : nullptr);

  fmt::print("3-class spirals, {} training and {} test points; MLP {} -> {} (tanh) -> {}\n", kPoints, kPoints,
             kFeatures, H, kClasses);
  fmt::print("{}\n", loop.describe());
  std::fflush(stdout);
  loop.run();
  return kExitOk;
}

}  // namespace nabla::cli
