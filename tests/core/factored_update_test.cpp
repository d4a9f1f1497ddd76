// factored_squared_norm and adamw_update_factored: low_memory's update of a
// weight whose gradient is kept as factors, as graph nodes. On the CPU they
// give the bits of TrainStep's host path (train::GradientRows' norm pieces,
// optim::AdamW::step over its ranges); on the reference backend dW is
// materialised in double, within stated tolerances of the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "backend/cpu/fusion.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/thread_pool.h"
#include "core/node.h"
#include "core/op.h"
#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"
#include "optim/update.h"
#include "train/factored_gradient.h"
#include "tied_model.h"
#include "backends.h"

using namespace nabla;

namespace nabla::ops {
extern const OpDef op_contiguous;
}  // namespace nabla::ops

namespace {

using testing_models::ramp;
using testing_models::TiedModel;

Tensor copy_of(const Tensor& t) { return Tensor::from_vector<float>(t.shape(), t.to_vector<float>()); }

// The model's factored gradients in one graph: stage 0 the loss and the
// factors (copies in memory of their own, as TrainStep keeps them), stage 1
// each gradient's factored_squared_norm, clip_scale of their sum and one
// adamw_update_factored per weight, on moments m, v and a row of hyper.
struct FactoredStep {
  static constexpr double kB1 = 0.9, kB2 = 0.95, kEps = 1e-8;
  TiedModel model{2, 8, 160, 128, 256};
  std::vector<size_t> slots;  // the factored parameters' positions in params
  std::vector<train::FactoredGradient> factors;
  std::vector<Tensor> norms, m, v;
  Tensor hyper, settings, clip;
  Graph graph;

  FactoredStep(bool bf16, double eps = kEps) {
    std::vector<Tensor> wrt;
    for (const auto& [name, p] : model.params.list()) wrt.push_back(p);
    const std::vector<Tensor> grads = cpu::fuse(grad(model.loss, wrt));
    graph.add_output(model.loss);
    const auto keep = [&](Tensor& t) {
      t = apply(ops::op_contiguous, {t});
      graph.add_output(t);
    };
    for (size_t i = 0; i < grads.size(); ++i) {
      std::optional<train::FactoredGradient> f = train::factor_gradient(grads[i]);
      if (!f) continue;
      keep(f->left);
      for (auto& b : f->blocks) keep(b.right);
      if (f->values.defined()) {
        keep(f->values);
        keep(f->indices);
      }
      slots.push_back(i);
      factors.push_back(*f);
    }
    hyper = Tensor::zeros(DType::f64, {int64_t(slots.size()), 3});
    settings = Tensor::from_vector<double>({2}, {1.0, 0.05});  // {average, clip}
    Tensor sq;
    for (size_t k = 0; k < slots.size(); ++k) {
      const Tensor& p = wrt[slots[k]];
      norms.push_back(factored_squared_norm(factors[k], p.dim(0), p.dim(1), bf16));
      graph.add_output(norms.back(), 1);
      sq = k == 0 ? norms[k] : sq + norms[k];
    }
    clip = clip_scale(sq, settings);
    graph.add_output(clip, 1);
    for (size_t k = 0; k < slots.size(); ++k) {
      const Tensor& p = wrt[slots[k]];
      m.push_back(Tensor::zeros(DType::f32, p.shape()));
      v.push_back(Tensor::zeros(DType::f32, p.shape()));
      const Tensor row = reshape(slice(hyper, 0, int64_t(k), int64_t(k) + 1), {3});
      graph.add_output(adamw_update_factored(p, m[k], v[k], row, slice(clip, 0, 1, 2), factors[k], bf16, kB1, kB2, eps),
                       1);
    }
  }
  Tensor param(size_t k) const { return model.params.list()[slots[k]].second; }
  // Step t's {lr, t, weight decay}: decay on every weight but the first.
  void set_hyper(int t) {
    std::vector<double> h;
    for (size_t k = 0; k < slots.size(); ++k) h.insert(h.end(), {1e-2 * t, double(t), k == 0 ? 0.0 : 0.1});
    hyper.assign<double>(h);
  }
};

}  // namespace

// Three steps: after each, the parameters and moments the nodes updated
// equal optim::AdamW::step's over a GradientRows range, and each norm the
// sum TrainStep::update_factored makes, on the same factors. Bit for bit
// where range() runs nabla's own kernels (OpenBLAS's order may depend on the
// rows it is given, and the class's chunks start elsewhere than a node's).
TEST(FactoredUpdate, GivesTheHostPathsBits) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    FactoredStep s(bf16);
    ASSERT_EQ(s.slots.size(), 4u);  // wte, fc, proj, qkv; not the bias
    EXPECT_TRUE(s.factors[0].values.defined());  // wte: the lookup's rows
    EXPECT_EQ(s.factors[3].blocks.size(), 3u);   // qkv: q, k and v
    const bool exact = bf16 || cpu::gemm_avx512_native();
    std::vector<optim::Slot> host;
    for (size_t k = 0; k < s.slots.size(); ++k) host.push_back({"w" + std::to_string(k), copy_of(s.param(k)), k != 0});
    const optim::AdamWConfig config{.beta1 = FactoredStep::kB1, .beta2 = FactoredStep::kB2, .eps = FactoredStep::kEps,
                                    .weight_decay = 0.1};
    optim::AdamW adamw(host, config, 2);
    Executor ex(s.graph, {.threads = 2, .bf16_matmul = bf16});
    for (int t = 1; t <= 3; ++t) {
      SCOPED_TRACE("step " + std::to_string(t));
      ex.run(0);
      // TrainStep::update_factored on this run's factors.
      const auto data = [&](const Tensor& x) { return static_cast<const float*>(ex.data(x)); };
      std::vector<std::unique_ptr<train::GradientRows>> rows;
      double sq = 0;
      std::vector<double> want_norms;
      for (size_t k = 0; k < s.slots.size(); ++k) {
        const train::FactoredGradient& f = s.factors[k];
        std::vector<train::GradientRows::Block> blocks;
        for (const auto& b : f.blocks) blocks.push_back({data(b.right), b.col, b.right.dim(1)});
        const bool added = f.values.defined();
        rows.push_back(std::make_unique<train::GradientRows>(
            data(f.left), f.left.dim(0), f.left.dim(1), s.param(k).dim(1), std::move(blocks),
            added ? data(f.values) : nullptr, added ? static_cast<const int32_t*>(ex.data(f.indices)) : nullptr,
            added ? f.indices.numel() : 0, bf16));
        rows[k]->check_indices();
        rows[k]->new_run();
        std::vector<double> parts(size_t(rows[k]->norm_pieces()));
        cpu::parallel_for(2, int64_t(parts.size()), 1, [&](int64_t b, int64_t e) {
          for (int64_t j = b; j < e; ++j) parts[size_t(j)] = rows[k]->norm_piece(j);
        });
        double one = 0;
        for (double p : parts) one += p;
        want_norms.push_back(std::max(one, 0.0));
        sq += want_norms.back();
      }
      const optim::ClipScale c = optim::clip_scale(sq, 1.0, 0.05);
      ASSERT_LT(c.scale, 1.0) << "the clip must be exercised";
      adamw.step(std::vector<const float*>(s.slots.size(), nullptr), 1e-2 * t, c.scale,
                 [&](size_t slot, int64_t begin, int64_t end) { return rows[slot]->range(begin, end); });

      s.set_hyper(t);
      ex.run(1);
      for (size_t k = 0; k < s.slots.size(); ++k) EXPECT_EQ(ex.read<double>(s.norms[k])[0], want_norms[k]) << k;
      EXPECT_EQ(ex.read<double>(s.clip), (std::vector<double>{c.norm, c.scale}));
      const auto state = adamw.state();
      for (size_t k = 0; k < s.slots.size(); ++k) {
        const std::vector<std::pair<std::vector<float>, std::vector<float>>> pairs{
            {s.param(k).to_vector<float>(), host[k].param.to_vector<float>()},
            {s.m[k].to_vector<float>(), state[2 * k].second.to_vector<float>()},
            {s.v[k].to_vector<float>(), state[2 * k + 1].second.to_vector<float>()}};
        for (size_t j = 0; j < pairs.size(); ++j) {
          const auto& [got, want] = pairs[j];
          if (exact) {
            EXPECT_EQ(got, want) << "weight " << k << " " << "pmv"[j];
            continue;
          }
          ASSERT_EQ(got.size(), want.size());
          for (size_t e = 0; e < got.size(); ++e) EXPECT_NEAR(got[e], want[e], 1e-5) << k << " " << "pmv"[j];
        }
      }
    }
  }
}

// The reference backend multiplies dW out in double, CUDA in f32; the CPU's norm sums
// f32 Gram matrices, within f32 rounding of dW's squares (relative 1e-6,
// src/train/factored_gradient.h). AdamW's first step moves each weight by
// lr g / (|g| + eps), g scaled by the clip (to at most 7e-4 here): with eps
// 1e-8 that is about lr sign(g), which an entry near 0 can flip on f32
// rounding (30 times the tolerance below); with eps 1e-3 it is smooth in g,
// each entry moving by at most lr / eps times its gradient's rounding, and
// the parameters agree to 1e-6 (1 + |p|) (the largest difference is 6% of it).
TEST(FactoredUpdate, DeviceBackendsAgreeWithTheCpu) {
  const std::vector<std::string> backends = testing_backends::all_backends();
  std::vector<std::vector<std::vector<float>>> params(backends.size());
  std::vector<std::vector<double>> norms(backends.size());
  for (size_t b = 0; b < backends.size(); ++b) {
    FactoredStep s(false, 1e-3);
    Executor ex(s.graph, {.threads = 2, .backend = backends[b]});
    ex.run(0);
    s.set_hyper(1);
    ex.run(1);
    for (size_t k = 0; k < s.slots.size(); ++k) {
      params[b].push_back(s.param(k).to_vector<float>());
      norms[b].push_back(ex.read<double>(s.norms[k])[0]);
    }
  }
  for (size_t b = 1; b < backends.size(); ++b) {
    for (size_t k = 0; k < params[0].size(); ++k) {
      EXPECT_NEAR(norms[b][k], norms[0][k], 1e-6 * norms[0][k]) << backends[b] << " norm " << k;
      ASSERT_EQ(params[b][k].size(), params[0][k].size());
      for (size_t e = 0; e < params[0][k].size(); ++e) {
        EXPECT_NEAR(params[b][k][e], params[0][k][e], 1e-6 * (1 + std::abs(params[0][k][e])))
            << backends[b] << " weight " << k << " entry " << e;
      }
    }
  }
}

namespace {

std::string message_of(const std::function<void()>& build) {
  try {
    build();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(FactoredUpdate, WrongOperandsNameTheOpAndWhatItExpected) {
  // dW [4, 6] = left^T right over columns [1, 4), rows added at 2 indices.
  const Tensor left = ramp({5, 4}, 0.3), right = ramp({5, 3}, 0.7), values = ramp({2, 6}, 0.1);
  const Tensor indices = Tensor::from_vector<int32_t>({2}, {3, 3});
  const train::FactoredGradient good{.left = left, .blocks = {{right, 1}}, .values = values, .indices = indices};
  EXPECT_NO_THROW(factored_squared_norm(good, 4, 6, false));
  const auto norm_error = [](train::FactoredGradient f, int64_t rows = 4, int64_t cols = 6) {
    return message_of([&] { factored_squared_norm(f, rows, cols, false); });
  };
  train::FactoredGradient f = good;
  f.left = Tensor::zeros(DType::f64, {5, 4});
  EXPECT_EQ(norm_error(f), "factored_squared_norm: left must be f32, got f64");
  EXPECT_EQ(norm_error(good, 5), "factored_squared_norm: left must be [T, 5], got [5, 4]");
  f = good;
  f.blocks[0].right = ramp({6, 3}, 0.7);
  EXPECT_EQ(norm_error(f), "factored_squared_norm: right 0 must be [5, width] (left's T), got [6, 3]");
  f = good;
  f.blocks.push_back({ramp({5, 2}, 0.5), 3});
  EXPECT_EQ(norm_error(f), "factored_squared_norm: right 1 must fill columns in [4, 6), got [3, 5)");
  EXPECT_EQ(norm_error(good, 4, 3),
            "factored_squared_norm: values must be [2, 3] (the indices' shape, then cols), got [2, 6]");
  f = good;
  f.indices = Tensor::zeros(DType::f32, {2});
  EXPECT_EQ(norm_error(f), "factored_squared_norm: indices must be i32, got f32");

  const Tensor p = ramp({4, 6}, 0.2), m = Tensor::zeros(DType::f32, {4, 6}), v = Tensor::zeros(DType::f32, {4, 6});
  const Tensor hyper = Tensor::from_vector<double>({3}, {0.1, 1, 0.01}), scale = Tensor::scalar(1.0, DType::f64);
  const auto update_error = [&](const Tensor& param, const Tensor& moment, const Tensor& settings) {
    const Tensor second = Tensor::zeros(DType::f32, param.shape());
    return message_of(
        [&] { adamw_update_factored(param, moment, second, settings, scale, good, false, 0.9, 0.999, 1e-8); });
  };
  EXPECT_EQ(update_error(p, Tensor::zeros(DType::f64, {4, 6}), hyper), "adamw_update_factored: m must be f32, got f64");
  EXPECT_EQ(update_error(p, Tensor::zeros(DType::f32, {4, 5}), hyper),
            "adamw_update_factored: m is [4, 5], p is [4, 6]");
  EXPECT_EQ(update_error(p, m, Tensor::zeros(DType::f64, {2})),
            "adamw_update_factored: hyper must be f64 [3] {lr, step, weight_decay}, got f64[2] (leaf)");
  // p of 3 rows, the factors' left of 4.
  EXPECT_EQ(update_error(ramp({3, 6}, 0.2), Tensor::zeros(DType::f32, {3, 6}), hyper),
            "adamw_update_factored: left must be [T, 3], got [5, 4]");
  EXPECT_THROW(adamw_update_factored(p, m, v, hyper, scale, good, false, 1.0, 0.999, 1e-8), UsageError);

  // An index outside [0, rows) is found when run, on either backend.
  const Tensor bad = Tensor::from_vector<int32_t>({2}, {1, 4});
  f = good;
  f.indices = bad;
  for (const std::string& backend : testing_backends::all_backends()) {
    Executor norm(Graph({factored_squared_norm(f, 4, 6, false)}), {.threads = 1, .backend = backend});
    EXPECT_THROW(norm.run(), ShapeError) << backend;
    Executor update(Graph({adamw_update_factored(p, m, v, hyper, scale, f, false, 0.9, 0.999, 1e-8)}),
                    {.threads = 1, .backend = backend});
    EXPECT_THROW(update.run(), ShapeError) << backend;
  }
}

// Without the add_rows term (values and indices undefined) the ops take
// empty operands in their place; against the product written out.
TEST(FactoredUpdate, WithoutAddedRows) {
  const Tensor left = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});  // [T, R]
  const Tensor right = Tensor::from_vector<float>({2, 1}, {1, -1});      // [T, width]
  const train::FactoredGradient f{.left = left, .blocks = {{right, 1}}};
  // dW [2, 3]: column 1 = left^T right = {1 - 3, 2 - 4}; columns 0 and 2 zero.
  for (const std::string& backend : testing_backends::all_backends()) {
    EXPECT_EQ(eval(factored_squared_norm(f, 2, 3, false), {.threads = 1, .backend = backend}).item(), 8.0) << backend;
  }
}
