// A training step's ops: squared_norm and clip_scale give the bits of
// optim::global_norm and TrainStep's clipping, the update ops (OpDef::mutates)
// the bits of optim::AdamW and optim::Sgd; updates run after every other
// reader of what they write, graphs where that cannot hold are refused, and
// on the reference backend host leaves are written back. Each op also runs
// on the reference backend, within a stated tolerance of the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"
#include "optim/update.h"
#include "backends.h"

using namespace nabla;

namespace {

Tensor random_leaf(Shape shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(size_t(numel(shape)));
  for (float& x : v) x = n(rng);
  return Tensor::from_vector<float>(std::move(shape), v);
}

Tensor copy_of(const Tensor& t) { return Tensor::from_vector<float>(t.shape(), t.to_vector<float>()); }

// Row i of an f64 [P, 3] leaf as an f64 [3] view (at an offset).
Tensor row(const Tensor& hyper, int64_t i) { return reshape(slice(hyper, 0, i, i + 1), {3}); }

// Entries of b within rel * (1 + |a|) of a's.
void expect_near(const std::vector<float>& a, const std::vector<float>& b, double rel, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(b[j], a[j], rel * (1 + std::abs(a[j]))) << what << " entry " << j;
}

// Parameters and gradients of the optimizer tests: the second parameter
// spans more than one 2^15-element chunk, so the class's chunks (over all
// parameters at once) and the node's (over one) start at other elements.
const std::vector<Tensor>& test_params() {
  static const std::vector<Tensor> params{random_leaf({37, 5}, 1), random_leaf({40001}, 2)};
  return params;
}
const std::vector<Tensor>& test_grads() {
  static const std::vector<Tensor> grads{random_leaf({37, 5}, 3), random_leaf({40001}, 4)};
  return grads;
}

struct Slot {
  Tensor p, g, m, v;
};

// Three steps of adamw_update nodes in one graph (the learning rate changing
// between runs), on `backend`. hyper is one f64 [P, 3] leaf read a row per
// node; grad_scale the second entry of an f64 [2] leaf.
std::vector<Slot> run_adamw_graph(const optim::AdamWConfig& c, const std::string& backend) {
  const std::vector<Tensor>& params = test_params();
  std::vector<Slot> slots;
  Tensor hyper = Tensor::zeros(DType::f64, {int64_t(params.size()), 3});
  Tensor scales = Tensor::from_vector<double>({2}, {7, 0.5});
  Graph g;
  for (size_t i = 0; i < params.size(); ++i) {
    Slot s{copy_of(params[i]), test_grads()[i], Tensor::zeros(DType::f32, params[i].shape()),
           Tensor::zeros(DType::f32, params[i].shape())};
    // The first gradient strided, as autodiff may hand it over.
    const Tensor grad = i == 0 ? transpose(contiguous(transpose(s.g))) : s.g;
    g.add_output(adamw_update(s.p, grad, s.m, s.v, row(hyper, int64_t(i)), slice(scales, 0, 1, 2), c.beta1, c.beta2,
                              c.eps));
    slots.push_back(s);
  }
  Executor ex(g, {.threads = 2, .backend = backend});
  for (int t = 1; t <= 3; ++t) {
    // Weight decay on the first parameter only.
    hyper.assign<double>({1e-2 * t, double(t), c.weight_decay, 1e-2 * t, double(t), 0.0});
    ex.run();
  }
  return slots;
}

// The same with sgd_update nodes: hyper rows {lr, momentum, weight_decay}.
std::vector<Slot> run_sgd_graph(double momentum, double weight_decay, const std::string& backend) {
  const std::vector<Tensor>& params = test_params();
  std::vector<Slot> slots;
  Tensor hyper = Tensor::zeros(DType::f64, {int64_t(params.size()), 3});
  Tensor scales = Tensor::from_vector<double>({2}, {7, 0.5});
  Graph g;
  for (size_t i = 0; i < params.size(); ++i) {
    Slot s{copy_of(params[i]), test_grads()[i], Tensor::zeros(DType::f32, params[i].shape()), Tensor()};
    const Tensor grad = i == 0 ? transpose(contiguous(transpose(s.g))) : s.g;
    g.add_output(sgd_update(s.p, grad, s.m, row(hyper, int64_t(i)), slice(scales, 0, 1, 2)));
    slots.push_back(s);
  }
  Executor ex(g, {.threads = 2, .backend = backend});
  for (int t = 1; t <= 3; ++t) {
    hyper.assign<double>({1e-2 * t, momentum, weight_decay, 1e-2 * t, momentum, 0.0});
    ex.run();
  }
  return slots;
}

std::vector<optim::Slot> class_slots() {
  std::vector<optim::Slot> slots;
  for (size_t i = 0; i < test_params().size(); ++i) {
    slots.push_back({"p" + std::to_string(i), copy_of(test_params()[i]), i == 0});
  }
  return slots;
}

std::vector<const float*> grad_ptrs() {
  std::vector<const float*> out;
  for (Tensor g : test_grads()) out.push_back(g.data_as<float>());  // a handle: the same storage
  return out;
}

}  // namespace

TEST(UpdateOps, AdamwUpdateGivesTheOptimizersBits) {
  const optim::AdamWConfig c{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  std::vector<optim::Slot> slots = class_slots();
  optim::AdamW adamw(slots, c, 2);
  for (int t = 1; t <= 3; ++t) adamw.step(grad_ptrs(), 1e-2 * t, 0.5);
  const std::vector<Slot> graph = run_adamw_graph(c, "cpu");
  const auto state = adamw.state();
  for (size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(graph[i].p.to_vector<float>(), slots[i].param.to_vector<float>()) << "p" << i;
    EXPECT_EQ(graph[i].m.to_vector<float>(), state[2 * i].second.to_vector<float>()) << "m" << i;
    EXPECT_EQ(graph[i].v.to_vector<float>(), state[2 * i + 1].second.to_vector<float>()) << "v" << i;
  }
  // The reference backend: its formula in double (f32 rounding once per
  // stored value, against the CPU's per operation: a few ulps of p), and the
  // host leaves written back after each run. The CUDA kernels: the CPU's
  // f32 arithmetic (on the GPU with fused multiply-adds).
  for (const std::string& backend : testing_backends::device_backends()) {
    const std::vector<Slot> other = run_adamw_graph(c, backend);
    for (size_t i = 0; i < slots.size(); ++i) {
      expect_near(graph[i].p.to_vector<float>(), other[i].p.to_vector<float>(), 1e-6, backend + " p" + std::to_string(i));
    }
  }
}

TEST(UpdateOps, SgdUpdateGivesTheOptimizersBits) {
  std::vector<optim::Slot> slots = class_slots();
  optim::Sgd sgd(slots, 0.9, 0.1, 2);
  for (int t = 1; t <= 3; ++t) sgd.step(grad_ptrs(), 1e-2 * t, 0.5);
  const std::vector<Slot> graph = run_sgd_graph(0.9, 0.1, "cpu");
  for (size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(graph[i].p.to_vector<float>(), slots[i].param.to_vector<float>()) << "p" << i;
  }
  // The reference backend in double, the CUDA kernels in f32: within a few
  // ulps of p and of the momentum buffer.
  for (const std::string& backend : testing_backends::device_backends()) {
    const std::vector<Slot> other = run_sgd_graph(0.9, 0.1, backend);
    for (size_t i = 0; i < slots.size(); ++i) {
      expect_near(graph[i].p.to_vector<float>(), other[i].p.to_vector<float>(), 1e-6, backend + " p" + std::to_string(i));
      expect_near(graph[i].m.to_vector<float>(), other[i].m.to_vector<float>(), 1e-6, backend + " buf" + std::to_string(i));
    }
  }
}

TEST(UpdateOps, SquaredNormGivesTheGlobalNormsBits) {
  // Sizes that cut the concatenation's 2^15-element chunks inside tensors,
  // with odd tails and a tensor of one element.
  const std::vector<Shape> shapes{{3}, {40000}, {1}, {65537}, {7, 3}};
  std::vector<Tensor> xs;
  std::vector<const float*> ptrs;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < shapes.size(); ++i) {
    xs.push_back(random_leaf(shapes[i], 10 + i));
    ptrs.push_back(xs.back().data_as<float>());
    sizes.push_back(xs.back().numel());
  }
  const double want = optim::global_norm(ptrs, sizes, 2);
  const Tensor sq = squared_norm(xs);
  for (int threads : {1, 2, 4}) {
    Executor ex(Graph({sq}), {.threads = threads});
    ex.run();
    const double got = ex.read<double>(sq)[0];
    EXPECT_EQ(std::sqrt(got), want) << threads << " threads";
  }
  // The device backends sum in other orders (the reference in element
  // order, CUDA in chunks and trees): the same squares, within 1e-12
  // relative (the sum's rounding is ~1e-16 a term).
  for (const std::string& backend : testing_backends::device_backends()) {
    Executor ref(Graph({sq}), {.threads = 1, .backend = backend});
    ref.run();
    EXPECT_NEAR(ref.read<double>(sq)[0], want * want, 1e-12 * want * want) << backend;
  }
  // f64 inputs, strided: against the sum written out.
  Tensor x = Tensor::from_vector<double>({2, 3}, {1, -2, 3, 0.5, 4, -1});
  const std::vector<Tensor> sq64{squared_norm({transpose(x), slice(x, 1, 0, 3, 2)})};
  for (const std::string& backend : testing_backends::all_backends()) {
    EXPECT_EQ(eval(sq64, {.threads = 2, .backend = backend})[0].item(), 31.25 + 1 + 9 + 0.25 + 1) << backend;
  }
}

TEST(UpdateOps, ClipScaleFollowsTheTrainersRule) {
  // sq 16, average 0.5: norm 2; clipped to 1, the scale is 0.5 * 1 / 2.
  const auto run = [](double average, double clip, const std::string& backend) {
    Tensor sq = Tensor::from_vector<double>({1}, {16});
    Tensor settings = Tensor::from_vector<double>({2}, {average, clip});
    return eval(clip_scale(sq, settings), {.threads = 1, .backend = backend}).to_vector<double>();
  };
  for (const std::string& backend : testing_backends::all_backends()) {
    EXPECT_EQ(run(0.5, 1.0, backend), (std::vector<double>{2, 0.25})) << backend;
    EXPECT_EQ(run(0.5, 0.0, backend), (std::vector<double>{2, 0.5})) << backend << ": clip 0 is no clipping";
    EXPECT_EQ(run(0.5, 5.0, backend), (std::vector<double>{2, 0.5})) << backend << ": under the clip";
    const optim::ClipScale c = optim::clip_scale(16, 0.25, 0.3);
    EXPECT_EQ(run(0.25, 0.3, backend), (std::vector<double>{c.norm, c.scale})) << backend;
  }
}

TEST(UpdateOps, AStepIsOneGraph) {
  // Forward, backward, the gradients' norm, clipping and AdamW updates in
  // one graph give optim::AdamW's bits after the trainer's clipping.
  const optim::AdamWConfig c{.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.05};
  Tensor x = random_leaf({8, 5}, 20);
  std::vector<Tensor> params{random_leaf({5, 3}, 21), random_leaf({3}, 22)};
  const std::vector<Tensor> initial{copy_of(params[0]), copy_of(params[1])};
  Tensor loss = mean(square(matmul(x, params[0]) + params[1]));
  const std::vector<Tensor> grads = grad(loss, params);
  // {average, clip}: the norm (about 1) is clipped to 0.05.
  Tensor settings = Tensor::from_vector<double>({2}, {0.5, 0.05});
  Tensor hyper = Tensor::from_vector<double>({2, 3}, {1e-2, 1, c.weight_decay, 1e-2, 1, 0});
  Tensor norm_scale = clip_scale(squared_norm(grads), settings);
  Graph g({loss, norm_scale, grads[0], grads[1]});
  std::vector<Tensor> m, v;
  for (size_t i = 0; i < params.size(); ++i) {
    m.push_back(Tensor::zeros(DType::f32, params[i].shape()));
    v.push_back(Tensor::zeros(DType::f32, params[i].shape()));
    g.add_output(adamw_update(params[i], grads[i], m[i], v[i], row(hyper, int64_t(i)), slice(norm_scale, 0, 1, 2),
                              c.beta1, c.beta2, c.eps));
  }
  Executor ex(g, {.threads = 2});
  ex.run();
  const std::vector<float> g0 = ex.read<float>(grads[0]), g1 = ex.read<float>(grads[1]);
  const std::vector<double> got = ex.read<double>(norm_scale);

  // The trainer's arithmetic on the gradients the graph computed.
  double norm = optim::global_norm({g0.data(), g1.data()}, {15, 3}, 2) * 0.5, scale = 0.5;
  if (norm > 0.05) scale *= 0.05 / norm;
  ASSERT_LT(scale, 0.5) << "the case must clip";
  EXPECT_EQ(got, (std::vector<double>{norm, scale}));
  std::vector<optim::Slot> slots{{"w", copy_of(initial[0]), true}, {"b", copy_of(initial[1]), false}};
  optim::AdamW adamw(slots, c, 2);
  adamw.step({g0.data(), g1.data()}, 1e-2, scale);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].to_vector<float>(), slots[i].param.to_vector<float>()) << "p" << i;
  }
}

TEST(UpdateOps, AnUpdateRunsAfterEveryOtherReader) {
  Tensor p = random_leaf({4, 3}, 1), g = random_leaf({4, 3}, 2);
  Tensor m = Tensor::zeros(DType::f32, {4, 3}), v = Tensor::zeros(DType::f32, {4, 3});
  Tensor hyper = Tensor::from_vector<double>({3}, {0.1, 1, 0.05}), scale = Tensor::scalar(1.0, DType::f64);
  const std::vector<float> before = p.to_vector<float>();
  // The update first among the outputs, so a plain depth-first order would
  // run it before the product that reads p.
  Tensor token = adamw_update(p, g, m, v, hyper, scale, 0.9, 0.999, 1e-8);
  Tensor y = p * 2.0;
  for (const std::string& backend : testing_backends::all_backends()) {
    p.assign<float>(before);
    Graph graph({token, y});
    Executor ex(graph, {.threads = 1, .backend = backend});
    ex.run();
    const std::vector<float> doubled = ex.read<float>(y);
    for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(doubled[i], 2 * before[i]) << backend;
    EXPECT_NE(p.to_vector<float>(), before) << backend << ": p was not updated";
  }
}

TEST(UpdateOps, GraphsWhereAnUpdateCannotHoldAreRefused) {
  Tensor p = random_leaf({2, 2}, 1), g = random_leaf({2, 2}, 2);
  Tensor m = Tensor::zeros(DType::f32, {2, 2}), v = Tensor::zeros(DType::f32, {2, 2});
  Tensor hyper = Tensor::from_vector<double>({3}, {0.1, 1, 0.05}), scale = Tensor::scalar(1.0, DType::f64);
  p.set_name("w");
  const auto adamw = [&](const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& hyper) {
    return adamw_update(p, g, m, v, hyper, scale, 0.9, 0.999, 1e-8);
  };
  const auto refused = [](const std::vector<Tensor>& outputs, const std::string& message) {
    try {
      Executor ex(Graph(outputs), {.threads = 1});
      ADD_FAILURE() << "compiled; expected: " << message;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  refused({adamw(p * 1.0, g, m, v, hyper)}, "input 'p' (f32[2, 2] (scale)) is updated in place and must be a leaf");
  refused({adamw(p, g, m, v, hyper),
           adamw(p, g * 2.0, Tensor::zeros(DType::f32, {2, 2}), Tensor::zeros(DType::f32, {2, 2}), hyper)},
          "input 'p' (f32[2, 2] (leaf) 'w') is updated by two nodes of the graph");
  refused({sum(adamw(p, g, m, v, hyper))}, "sum: reads the token of 'adamw_update'");
  refused({sgd_update(p, g, Tensor::zeros(DType::f32, {2, 2}), hyper, scale), adamw(p, g, m, v, hyper)},
          "input 'p' (f32[2, 2] (leaf) 'w') is updated by two nodes of the graph");
  // Bad settings are a clear error when run, not a crash, on every backend
  // (a GPU finds them on the device and says so at the run's end).
  const std::vector<std::pair<std::vector<double>, std::string>> bad_hypers{
      {{-1, 1, 0}, "adamw_update: learning rate must be finite and >= 0"},
      {{0.1, 0, 0}, "adamw_update: step must be 1, 2, ..."},
      {{0.1, 1.5, 0}, "adamw_update: step must be 1, 2, ..."},
      {{0.1, 1, -1}, "adamw_update: weight decay must be finite and >= 0"}};
  for (const std::string& backend : testing_backends::all_backends()) {
    for (const auto& [bad, said] : bad_hypers) {
      Executor ex(Graph({adamw(p, g, m, v, Tensor::from_vector<double>({3}, bad))}), {.threads = 1, .backend = backend});
      try {
        ex.run();
        ADD_FAILURE() << backend << ": ran with hyper " << bad[0] << ", " << bad[1] << ", " << bad[2];
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find(said), std::string::npos) << backend << ": " << e.what();
      }
    }
    Executor ex(Graph({sgd_update(p, g, m, Tensor::from_vector<double>({3}, {0.1, 0.9, -1}), scale)}),
                {.threads = 1, .backend = backend});
    EXPECT_THROW(ex.run(), UsageError) << backend;
  }
}

TEST(UpdateOps, WrongOperandsNameTheOpAndWhatItExpected) {
  Tensor p = random_leaf({2, 2}, 1), g = random_leaf({2, 2}, 2), buf = Tensor::zeros(DType::f32, {2, 2});
  Tensor hyper = Tensor::from_vector<double>({3}, {0.1, 0.9, 0}), scale = Tensor::scalar(1.0, DType::f64);
  const auto message = [](auto&& build) -> std::string {
    try {
      build();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THROW(adamw_update(p, g, buf, Tensor::zeros(DType::f32, {2, 3}), hyper, scale, 0.9, 0.999, 1e-8),
               ShapeError);
  EXPECT_THROW(adamw_update(p, g, buf, buf, Tensor::zeros(DType::f64, {2}), scale, 0.9, 0.999, 1e-8), ShapeError);
  EXPECT_THROW(sgd_update(p, g, buf, hyper, Tensor::zeros(DType::f64, {2})), ShapeError);
  EXPECT_THROW(sgd_update(p, g, buf, Tensor::zeros(DType::f32, {3}), scale), DTypeError);
  EXPECT_EQ(message([&] { sgd_update(p, g, buf, Tensor::zeros(DType::f32, {3}), scale); }),
            "sgd_update: hyper must be f64 [3] {lr, momentum, weight_decay}, got f32[3] (leaf)");
  EXPECT_THROW(sgd_update(Tensor::zeros(DType::f64, {2, 2}), g, buf, hyper, scale), DTypeError);
  EXPECT_EQ(message([&] { squared_norm({p, Tensor::zeros(DType::f64, {3})}); }),
            "squared_norm: input 1 is f64, input 0 is f32; all must have one dtype");
  EXPECT_THROW(squared_norm({Tensor::zeros(DType::i32, {3})}), DTypeError);
  EXPECT_EQ(message([&] { clip_scale(Tensor::scalar(4.0, DType::f64), Tensor::zeros(DType::f64, {3})); }),
            "clip_scale: settings must be f64 [2] {average, clip}, got f64[3] (leaf)");
  EXPECT_THROW(clip_scale(Tensor::scalar(4.0, DType::f32), Tensor::zeros(DType::f64, {2})), DTypeError);
  EXPECT_EQ(message([&] { accumulate_update(p, g, Tensor::zeros(DType::f32, {1})); }),
            "accumulate_update: restart must be f64 with one element, got f32[1] (leaf)");
  EXPECT_THROW(accumulate_update(p, Tensor::zeros(DType::f32, {3}), scale), ShapeError);
}

// accumulate_update sums a gradient over runs in place: acc = g on a run
// with restart set, acc + g after, read through any layout, on every backend.
TEST(UpdateOps, AccumulateSumsOverRunsOnEveryBackend) {
  for (const std::string& backend : testing_backends::all_backends()) {
    SCOPED_TRACE(backend);
    Tensor acc = Tensor::zeros(DType::f32, {2, 3}), restart = Tensor::zeros(DType::f64, {1});
    Tensor g = Tensor::from_vector<float>({3, 2}, {1, 2, 3, 4, 5, 6});
    Executor ex(Graph({accumulate_update(acc, transpose(g, 0, 1), restart)}), {.threads = 1, .backend = backend});
    acc.assign<float>({9, 9, 9, 9, 9, 9});
    restart.assign<double>({1});
    ex.run();
    EXPECT_EQ(acc.to_vector<float>(), (std::vector<float>{1, 3, 5, 2, 4, 6}));
    restart.assign<double>({0});
    g.assign<float>({0.5f, 1, 1.5f, 2, 2.5f, 3});
    ex.run();
    EXPECT_EQ(acc.to_vector<float>(), (std::vector<float>{1.5f, 4.5f, 7.5f, 3, 6, 9}));
  }
}
