// `nabla train mlp`: a 2-layer MLP learns three interleaved spirals.
//
// The graph (forward, loss, backward) is built once and compiled once; each
// step writes a new minibatch into the input leaves, runs, and updates the
// weights on the host with SGD + momentum.
//
// Dimensions:
//   N  points in the dataset (kPoints)
//   B  minibatch size (--batch)
//   D  input features (2: x, y)
//   H  hidden units (--hidden)
//   C  classes (3 spiral arms)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "commands.h"
#include "nabla/executor.h"
#include "nabla/graph.h"
#include "nabla/ops.h"

namespace nabla::cli {
namespace {

constexpr int kPoints = 2000;
constexpr int kFeatures = 2;
constexpr int kClasses = 3;
constexpr int kReportEvery = 50;
constexpr float kMomentum = 0.9f;

struct Dataset {
  std::vector<float> x;  // [N, D]
  std::vector<int> y;    // [N], class of each point
};

// Class k's arm: radius r in [0, 1], angle 4k + 4r (radians) plus noise, so
// the three arms wind around each other.
Dataset make_spirals(std::mt19937_64& rng) {
  std::normal_distribution<float> noise(0.0f, 0.2f);
  Dataset d;
  for (int i = 0; i < kPoints; ++i) {
    int k = i % kClasses;
    float r = float(i / kClasses) / float(kPoints / kClasses);
    float angle = 4.0f * float(k) + 4.0f * r + noise(rng);
    d.x.push_back(r * std::sin(angle));
    d.x.push_back(r * std::cos(angle));
    d.y.push_back(k);
  }
  return d;
}

struct Param {
  Tensor value;             // leaf, requires_grad
  std::vector<float> host;  // the weights, updated here and copied in
  std::vector<float> velocity;
};

Param make_param(Shape shape, float stddev, std::mt19937_64& rng, const char* name) {
  std::normal_distribution<float> normal(0.0f, stddev);
  Param p;
  p.host.resize(static_cast<size_t>(numel(shape)));
  for (float& w : p.host) w = stddev > 0 ? normal(rng) : 0.0f;
  p.velocity.assign(p.host.size(), 0.0f);
  p.value = Tensor::from_vector(std::move(shape), p.host);
  p.value.requires_grad().set_name(name);
  return p;
}

struct Mlp {
  Param w1, b1, w2, b2;                               // [D, H], [H], [H, C], [C]
  Tensor forward(const Tensor& x) const {             // x [B, D] -> logits [B, C]
    Tensor h = tanh(matmul(x, w1.value) + b1.value);  // [B, H]
    return matmul(h, w2.value) + b2.value;
  }
  std::vector<Param*> params() { return {&w1, &b1, &w2, &b2}; }
};

// Mean cross-entropy of softmax(logits) against one-hot targets, both [B, C],
// composed from primitive ops. The row max is subtracted first so exp cannot
// overflow.
Tensor composed_cross_entropy(const Tensor& logits, const Tensor& onehot) {
  Tensor shifted = logits - max(logits, {1}, true);
  Tensor log_probs = shifted - log(sum(exp(shifted), {1}, true));
  return -mean(sum(log_probs * onehot, {1}));
}

// Correct predictions among the rows of logits [rows, C].
int count_correct(const std::vector<float>& logits, const int* labels, int rows) {
  int correct = 0;
  for (int i = 0; i < rows; ++i) {
    const float* row = &logits[static_cast<size_t>(i) * kClasses];
    int best = int(std::max_element(row, row + kClasses) - row);
    correct += best == labels[i];
  }
  return correct;
}

}  // namespace

int run_train_mlp(const TrainMlpArgs& args) {
  const int B = args.batch, H = args.hidden;
  std::mt19937_64 rng(args.seed);
  Dataset data = make_spirals(rng);

  Mlp mlp{make_param({kFeatures, H}, 1.0f, rng, "w1"), make_param({H}, 0.0f, rng, "b1"),
          make_param({H, kClasses}, 1.0f / std::sqrt(float(H)), rng, "w2"),
          make_param({kClasses}, 0.0f, rng, "b2")};

  // The training graph, built and compiled once.
  Tensor x = Tensor::zeros(DType::f32, {B, kFeatures}).set_name("x");      // [B, D]
  Tensor onehot = Tensor::zeros(DType::f32, {B, kClasses}).set_name("y");  // [B, C]
  Tensor logits = mlp.forward(x);
  Tensor loss = composed_cross_entropy(logits, onehot);
  Graph graph({loss, logits});
  graph.backward(loss);
  ExecOptions exec_options;
  exec_options.threads = args.threads;
  exec_options.check_finite = args.check_finite;
  Executor train(graph, exec_options);

  // Whole-dataset accuracy, sharing the weight leaves.
  Tensor all_x = Tensor::from_vector({kPoints, kFeatures}, data.x);
  Tensor all_logits = mlp.forward(all_x);
  Executor evaluate(Graph({all_logits}), exec_options);

  fmt::print(
      "3-class spirals, {} points; MLP {} -> {} (tanh) -> {}; batch {}, lr {}, momentum {}, "
      "threads {}\n",
      kPoints, kFeatures, H, kClasses, B, args.lr, kMomentum, train.threads());

  std::vector<int> order(kPoints);
  std::iota(order.begin(), order.end(), 0);
  size_t cursor = kPoints;
  std::vector<float> batch_x(static_cast<size_t>(B) * kFeatures),
      batch_onehot(static_cast<size_t>(B) * kClasses);
  std::vector<int> batch_y(B);
  double loss_sum = 0;
  int correct = 0, seen = 0, since_report = 0;

  auto start = std::chrono::steady_clock::now();
  for (int step = 1; step <= args.steps; ++step) {
    // Next minibatch from a shuffled pass over the data.
    std::fill(batch_onehot.begin(), batch_onehot.end(), 0.0f);
    for (int i = 0; i < B; ++i) {
      if (cursor == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      int p = order[cursor++];
      batch_x[2 * i] = data.x[2 * p];
      batch_x[2 * i + 1] = data.x[2 * p + 1];
      batch_y[i] = data.y[p];
      batch_onehot[static_cast<size_t>(i) * kClasses + data.y[p]] = 1.0f;
    }
    x.assign(batch_x);
    onehot.assign(batch_onehot);
    train.run();

    // SGD with momentum: v = mu v + dw; w -= lr v.
    for (Param* p : mlp.params()) {
      std::vector<float> dw = train.read<float>(graph.grad(p->value));
      for (size_t i = 0; i < dw.size(); ++i) {
        p->velocity[i] = kMomentum * p->velocity[i] + dw[i];
        p->host[i] -= float(args.lr) * p->velocity[i];
      }
      p->value.assign(p->host);
    }

    loss_sum += train.read<float>(loss)[0];
    correct += count_correct(train.read<float>(logits), batch_y.data(), B);
    seen += B;
    ++since_report;
    if (step == 1 || step % kReportEvery == 0 || step == args.steps) {
      fmt::print("step {:>5}  loss {:.4f}  batch acc {:5.1f}%\n", step, loss_sum / since_report,
                 100.0 * correct / seen);
      loss_sum = 0;
      correct = seen = since_report = 0;
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  evaluate.run();
  int train_correct = count_correct(evaluate.read<float>(all_logits), data.y.data(), kPoints);
  fmt::print("train accuracy {:.1f}% ({}/{})\n", 100.0 * train_correct / kPoints, train_correct,
             kPoints);
  fmt::print("{:.0f} steps/s ({} steps in {:.2f} s)\n", args.steps / seconds, args.steps, seconds);
  const MemoryReport& mem = train.memory();
  fmt::print("arena {} bytes planned ({} without reuse), {} buffers, {} in place\n",
             mem.arena_bytes, mem.unplanned_bytes, mem.buffers, mem.inplace);
  return kExitOk;
}

}  // namespace nabla::cli
