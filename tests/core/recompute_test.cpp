// Gradient checkpointing (recompute): the same values and gradients as
// keeping the forward's intermediates, in a fraction of the arena, with the
// recomputed nodes scheduled just ahead of their region's backward.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

// A residual stack: x + tanh(x W1) W2 per block over 512 rows, each
// block's hidden activations [512, 128] eight times its input's size and
// far larger than its weights (whose gradients, outputs, stay in the arena).
struct Stack {
  std::vector<Tensor> w1, w2;
  Tensor x;
  explicit Stack(int blocks) {
    x = Tensor::from_vector<double>({512, 16}, values(512 * 16, 1));
    for (int b = 0; b < blocks; ++b) {
      w1.push_back(leaf({16, 128}, 2 + b));
      w2.push_back(leaf({128, 16}, 100 + b));
    }
  }
  static std::vector<double> values(int64_t n, int seed) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = 0.1 * std::sin(0.37 * double(i) + seed);
    return v;
  }
  static Tensor leaf(Shape s, int seed) {
    Tensor t = Tensor::from_vector<double>(s, values(numel(s), seed));
    t.requires_grad();
    return t;
  }
  Tensor loss(bool checkpoint) const {
    Tensor h = x;
    for (size_t b = 0; b < w1.size(); ++b) {
      auto block = [&, b, h] { return h + matmul(tanh(matmul(h, w1[b])), w2[b]); };
      h = checkpoint ? recompute(block) : block();
    }
    return sum(square(h));
  }
};

struct Outcome {
  std::vector<std::vector<double>> values;
  size_t arena = 0;
};

Outcome run(const Stack& s, bool checkpoint) {
  Graph g;
  g.backward(s.loss(checkpoint));
  Executor ex(g, {.threads = 2});
  ex.run();
  Outcome r;
  r.arena = ex.memory().arena_bytes;
  for (const Tensor& t : g.outputs()) {
    r.values.push_back(ex.read<double>(t));
  }
  return r;
}

}  // namespace

TEST(Recompute, SameLossAndGradients) {
  const Stack s(6);
  const Outcome kept = run(s, false), again = run(s, true);
  ASSERT_EQ(kept.values.size(), again.values.size());
  for (size_t i = 0; i < kept.values.size(); ++i) EXPECT_EQ(kept.values[i], again.values[i]) << "output " << i;
}

TEST(Recompute, ArenaHoldsOneBlockOfIntermediates) {
  // Kept: every block's hidden activations [512, 128] f64 (512 KiB) live
  // until the backward; recomputed: a block's at a time, beside the block
  // outputs (64 KiB each) and the weight gradients (16 KiB each).
  const Stack s(12);
  const Outcome kept = run(s, false), again = run(s, true);
  const size_t hidden = 512 * 128 * sizeof(double);
  EXPECT_GT(kept.arena, 12 * hidden);
  EXPECT_LT(again.arena, 6 * hidden) << "kept " << kept.arena;
}

TEST(Recompute, SecondOrderThroughARegion) {
  // d/dw of (dL/dw . v): differentiating the recomputed nodes again.
  const Stack s(2);
  std::vector<double> got[2];
  for (bool checkpoint : {false, true}) {
    const Tensor l = s.loss(checkpoint);
    const Tensor g = grad(l, {s.w1[0]})[0];
    const Tensor gg = grad(sum(g * g), {s.w2[1]})[0];
    Executor ex(Graph({gg}), {.threads = 1});
    ex.run();
    got[checkpoint] = ex.read<double>(gg);
  }
  EXPECT_EQ(got[0], got[1]);
}

TEST(Recompute, NestedAndOutsideReadersKeepTheirValues) {
  // An inner region inside an outer one, and a node of the region read
  // outside it too: still the plain gradients.
  const Stack s(1);
  auto build = [&](bool checkpoint) {
    Tensor inner_h;
    auto outer = [&] {
      auto inner = [&] { return tanh(matmul(s.x, s.w1[0])); };
      inner_h = checkpoint ? recompute(inner) : inner();
      return matmul(inner_h, s.w2[0]);
    };
    const Tensor y = checkpoint ? recompute(outer) : outer();
    return sum(square(y)) + sum(inner_h);
  };
  std::vector<double> got[2];
  for (bool checkpoint : {false, true}) {
    const Tensor l = build(checkpoint);
    const std::vector<Tensor> g = grad(l, {s.w1[0], s.w2[0]});
    Executor ex(Graph({l, g[0], g[1]}), {.threads = 1});
    ex.run();
    got[checkpoint] = ex.read<double>(g[0]);
    const std::vector<double> g2 = ex.read<double>(g[1]);
    got[checkpoint].insert(got[checkpoint].end(), g2.begin(), g2.end());
  }
  EXPECT_EQ(got[0], got[1]);
}
