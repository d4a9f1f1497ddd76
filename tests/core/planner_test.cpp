// The memory planner: reuse only after the last reader (through views too),
// outputs never reused, in-place only where safe, and the arena it reports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/graph_internal.h"
#include "core/node.h"
#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"
#include "backends.h"

using namespace nabla;

namespace {

Tensor random_leaf(Shape shape, uint32_t seed, DType dtype = DType::f64) {
  Tensor t = Tensor::zeros(dtype, shape);
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    double v = (double(s >> 8) / double(1 << 24)) * 2 - 1;
    if (dtype == DType::f64) t.data_as<double>()[i] = v;
    else t.data_as<float>()[i] = float(v);
  }
  return t;
}

// An RMS norm built from primitives, the pattern ggml's rms_norm_back got
// wrong when the allocator reused a buffer its backward still read.
Tensor rms_norm_primitives(const Tensor& x) { return x * rsqrt(mean(square(x), {-1}, true) + 1e-5); }

}  // namespace

TEST(Planner, ReusesMemoryAndReportsTheArena) {
  Tensor x = random_leaf({64, 64}, 1, DType::f32);
  Tensor y = x;
  for (int i = 0; i < 10; ++i) y = tanh(y * 1.5 + 0.1);
  Graph g({sum(y)});
  Executor planned(g, {.threads = 1});
  Executor unplanned(g, {.threads = 1, .plan_memory = false});
  EXPECT_LT(planned.memory().arena_bytes, unplanned.memory().arena_bytes / 4);
  EXPECT_EQ(unplanned.memory().arena_bytes, unplanned.memory().unplanned_bytes);
  EXPECT_GT(planned.memory().inplace, 0);
  planned.run();
  unplanned.run();
  EXPECT_EQ(planned.read<float>(g.outputs()[0]), unplanned.read<float>(g.outputs()[0]));
}

TEST(Planner, ManyNormsInSequenceMatchFiniteDifferencesWithReuse) {
  // Several norms in sequence and a loss through all of them: many buffers
  // die and are reused while backward nodes still need forward values.
  Tensor w = random_leaf({6}, 7);
  auto f = [&](const std::vector<Tensor>& in) {
    Tensor h = in[0];
    Tensor acc = Tensor::scalar(0.0, in[0].dtype());
    for (int i = 0; i < 4; ++i) {
      h = rms_norm_primitives(h * in[1] + h);
      acc = acc + sum(h * h * 0.1);
    }
    return tanh(h) + acc;
  };
  for (int threads : {1, 2, 4}) {
    GradcheckOptions opt;
    opt.threads = threads;
    opt.max_grain = threads > 1 ? 1 : 0;
    GradcheckResult r = gradcheck(f, {random_leaf({5, 6}, 3), w}, opt);
    EXPECT_TRUE(r.ok) << "threads " << threads << ": " << r.message;
    EXPECT_EQ(r.checked, 36);
  }
}

TEST(Planner, OutputsAndViewedBuffersSurvive) {
  Tensor x = random_leaf({8, 8}, 2, DType::f32);
  Tensor a = exp(x);                 // read later only through a view
  Tensor view = transpose(a);
  Tensor b = tanh(x) * 2.0;          // an output
  Tensor c = b + 1.0;
  for (int i = 0; i < 5; ++i) c = sigmoid(c) * 3.0;  // chances to reuse a's memory
  Tensor d = c + view;               // reads a through the view at the end
  Graph g({d, b});
  Executor planned(g, {.threads = 2});
  planned.run();
  Executor reference(g, {.threads = 1, .plan_memory = false});
  reference.run();
  EXPECT_EQ(planned.read<float>(d), reference.read<float>(d));
  EXPECT_EQ(planned.read<float>(b), reference.read<float>(b));
  // Intermediates may be overwritten: reading one is refused, not wrong.
  EXPECT_THROW(planned.read<float>(c), UsageError);
}

TEST(Planner, InPlaceNeverOverwritesAnOperandStillNeeded) {
  Tensor x = random_leaf({16}, 4, DType::f32);
  Tensor a = exp(x);
  Tensor r = reshape(a, {4, 4});
  // a dies at the add, but the add also reads a through a transposed view:
  // running it in place would corrupt its own input.
  Tensor y = add(r, transpose(r));
  Graph g({y});
  Executor ex(g, {.threads = 1});
  ex.run();
  Executor ref(g, {.threads = 1, .plan_memory = false});
  ref.run();
  EXPECT_EQ(ex.read<float>(y), ref.read<float>(y));
}

// The arena's buffer asks for 2 MiB pages: aligned to one when it spans
// several, every byte usable either way, and small buffers stay as they were.
TEST(Buffer, HugePageRequestKeepsEveryByteUsable) {
  for (size_t bytes : {size_t{0}, size_t{100}, size_t{9} << 20, (size_t{9} << 20) + 3}) {
    Buffer b(bytes, /*huge_pages=*/true);
    ASSERT_NE(b.data, nullptr);
    EXPECT_EQ(b.bytes, bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % 64, 0u);
#ifdef __linux__
    if (bytes >= (size_t{8} << 20)) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % (size_t{2} << 20), 0u) << bytes;
    }
#endif
    auto* p = static_cast<unsigned char*>(b.data);
    std::memset(p, 0xab, bytes);
    if (bytes > 0) {
      EXPECT_EQ(p[bytes - 1], 0xab);
    }
  }
}

TEST(Executor, MemoryLimitFailsBeforeAllocating) {
  Tensor x = random_leaf({256, 256}, 5, DType::f32);
  Graph g({sum(matmul(x, x))});
  try {
    Executor ex(g, {.memory_limit = 1024});
    FAIL() << "no error for a graph over the memory limit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory limit"), std::string::npos) << e.what();
  }
}

TEST(Executor, ProfileCountsRunsSinceItsLastReset) {
  Tensor x = random_leaf({16, 16}, 5, DType::f32);
  Graph g({sum(tanh(x * 2.0))});
  Executor ex(g, {.threads = 1, .profile = true});
  EXPECT_EQ(ex.profile(), "");
  ex.run();
  ex.run();
  EXPECT_NE(ex.profile().find("total over 2 runs"), std::string::npos) << ex.profile();
  EXPECT_NE(ex.profile().find("tanh"), std::string::npos) << ex.profile();
  ex.reset_profile();
  ex.run();
  EXPECT_NE(ex.profile().find("total over 1 runs"), std::string::npos) << ex.profile();
}

TEST(Executor, CheckFiniteNamesTheFirstBadOp) {
  Tensor x = Tensor::from_vector<float>({3}, {1, 0, 2});
  Tensor y = exp(log(x) * 2.0);  // log(0) = -inf
  Graph g({sum(y)});
  Executor ex(g, {.threads = 1, .check_finite = true});
  try {
    ex.run();
    FAIL() << "no error for a non-finite value";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'log'"), std::string::npos) << m;
    EXPECT_NE(m.find("Inf"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[3] (leaf)"), std::string::npos) << m;
  }
}

TEST(Planner, AccumulatingOpsRunInPlaceOnlyOnTheirBaseInItsOwnLayout) {
  Tensor idx = Tensor::from_vector<int32_t>({3}, {1, 1, 0});
  Tensor values = random_leaf({3, 2}, 6, DType::f32);
  // A reshape of a dying buffer is that buffer in its own layout: add_rows
  // writes over it. A transposed view is not: add_rows copies it first.
  Tensor own = add_rows(reshape(exp(random_leaf({6}, 7, DType::f32)), {3, 2}), values, idx);
  Tensor swapped = add_rows(transpose(exp(random_leaf({2, 3}, 8, DType::f32))), values, idx);
  Tensor sliced = add_slice(exp(random_leaf({3, 4}, 9, DType::f32)), values, 1, 1, 4, 2);
  const std::vector<Tensor> cases = {own, swapped, sliced};
  for (size_t c = 0; c < cases.size(); ++c) {
    const Tensor& y = cases[c];
    Graph g({y});
    Executor ex(g, {.threads = 1});
    Executor ref(g, {.threads = 1, .plan_memory = false});
    ex.run();
    ref.run();
    EXPECT_EQ(ex.read<float>(y), ref.read<float>(y));
    EXPECT_EQ(ex.memory().inplace, c == 1 ? 0 : 1) << "case " << c;
  }
}

// A reduction (here a bias-gradient-like sum over rows) reached late by the
// depth-first order runs right after its input instead: its input is read
// while in cache, and dies early enough for the chain to reuse its memory.
TEST(Planner, ReductionsRunRightAfterTheirInputAndFreeItEarly) {
  Tensor x = random_leaf({128, 128}, 5, DType::f32);
  Tensor y = exp(x);
  Tensor chain = y * 2.0;
  for (int i = 0; i < 6; ++i) chain = tanh(chain) * 1.5;
  Tensor s = sum(y, {0});
  const std::vector<Tensor> outputs{chain, s};
  const auto position = [](const std::vector<Tensor>& order, const Tensor& t) {
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i].node() == t.node()) return static_cast<int64_t>(i);
    }
    return int64_t{-1};
  };
  const std::vector<Tensor> dfs = topo_order(outputs);
  ASSERT_EQ(position(dfs, s), static_cast<int64_t>(dfs.size()) - 1);  // what depth-first gives
  const std::vector<Tensor> order = locality_order(dfs);
  ASSERT_EQ(order.size(), dfs.size());
  EXPECT_EQ(position(order, s), position(order, y) + 1);

  Graph g(outputs);
  Executor planned(g, {.threads = 2});
  // y's memory passes to the chain once the sum has read it: one 64 KiB
  // buffer for the chain and y, not two.
  EXPECT_LT(planned.memory().arena_bytes, 2 * 128 * 128 * 4);
  planned.run();
  Executor reference(g, {.threads = 1, .plan_memory = false});
  reference.run();
  EXPECT_EQ(planned.read<float>(chain), reference.read<float>(chain));
  EXPECT_EQ(planned.read<float>(s), reference.read<float>(s));
}

// Stages (Graph::add_output): run(k) runs the nodes stage k's outputs need
// and no earlier stage's, reading earlier outputs as they were left; leaves
// rewritten in between are seen. run() runs everything, as one.
TEST(Executor, StagesRunTheirOwnNodes) {
  Tensor x = Tensor::from_vector<double>({3}, {1, 2, 3});
  Tensor k = Tensor::from_vector<double>({3}, {10, 10, 10});
  Tensor first = exp(x) * 2.0;                  // stage 0
  Tensor second = first + k;                    // stage 1: an output of stage 0 and a leaf
  Tensor third = sum(square(second) * first);  // stage 2
  Graph g;
  g.add_output(first);
  g.add_output(third, 2);
  g.add_output(second, 1);
  g.add_output(third, 3);  // keeps stage 2
  EXPECT_EQ(g.stages(), (std::vector<int>{0, 2, 1}));
  for (const std::string& backend : testing_backends::all_backends()) {
    SCOPED_TRACE(backend);
    Executor ex(g, {.backend = backend});
    ASSERT_EQ(ex.stages(), 3);
    ex.run(0);
    const std::vector<double> f = ex.read<double>(first);
    EXPECT_DOUBLE_EQ(f[2], 2 * std::exp(3.0));
    k.assign<double>({1, 1, 1});  // after stage 0: stage 1 sees it
    ex.run(1);
    EXPECT_EQ(ex.read<double>(second), (std::vector<double>{f[0] + 1, f[1] + 1, f[2] + 1}));
    x.assign<double>({0, 0, 0});  // stage 2 does not recompute `first`
    ex.run(2);
    double want = 0;
    for (double v : f) want += (v + 1) * (v + 1) * v;
    EXPECT_DOUBLE_EQ(ex.read<double>(third)[0], want);
    ex.run();
    EXPECT_EQ(ex.read<double>(first), (std::vector<double>{2, 2, 2}));
    EXPECT_DOUBLE_EQ(ex.read<double>(third)[0], 3 * 3 * 3 * 2.0);
    EXPECT_THROW(ex.run(3), UsageError);
    EXPECT_THROW(ex.run(-1), UsageError);
    x.assign<double>({1, 2, 3});
    k.assign<double>({10, 10, 10});
  }
}

// on_computed: called once a run, after the output's node and before the
// nodes after it, with the value complete; a leaf has no node to wait for.
TEST(Executor, OnComputedCallsBackAsEachOutputIsDone) {
  Tensor x = Tensor::from_vector<double>({3}, {1, 2, 3});
  Tensor first = exp(x) * 2.0;
  Tensor second = sum(square(first));
  Tensor view = reshape(first, {3, 1});
  for (const std::string& backend : testing_backends::all_backends()) {
    SCOPED_TRACE(backend);
    Executor ex(Graph({second, first}), {.backend = backend});
    std::vector<std::string> calls;
    std::vector<double> seen;
    ASSERT_TRUE(ex.on_computed(first, [&] {
      calls.push_back("first");
      if (backend == "cpu") seen = ex.read<double>(first);
    }));
    ASSERT_TRUE(ex.on_computed(second, [&] { calls.push_back("second"); }));
    ASSERT_TRUE(ex.on_computed(view, [&] { calls.push_back("view"); }));  // the node that writes its memory
    EXPECT_FALSE(ex.on_computed(x, [&] { calls.push_back("x"); }));
    EXPECT_THROW(ex.on_computed(exp(x), [] {}), UsageError);
    ex.run();
    ex.run();
    EXPECT_EQ(calls, (std::vector<std::string>{"first", "view", "second", "first", "view", "second"}));
    if (backend == "cpu") {
      EXPECT_DOUBLE_EQ(seen[2], 2 * std::exp(3.0));
    }
  }
}

// host_copy: each run's value of an output in host memory, begun after its
// node and before the nodes after it (queued behind it on a device), read
// once landed; a leaf has no node to copy after.
TEST(Executor, HostCopyHasEachRunsValue) {
  Tensor x = Tensor::from_vector<double>({3}, {1, 2, 3});
  Tensor first = exp(x) * 2.0;
  Tensor second = sum(square(first));
  Tensor m = exp(reshape(x, {3, 1}) * Tensor::from_vector<double>({1, 2}, {1, -1}));
  for (const std::string& backend : testing_backends::all_backends()) {
    SCOPED_TRACE(backend);
    Executor ex(Graph({second, first, m, transpose(m)}), {.backend = backend});
    std::vector<std::string> calls;
    const int id = ex.host_copy(first, [&] { calls.push_back("first"); });
    ASSERT_GE(id, 0);
    ASSERT_TRUE(ex.on_computed(second, [&] { calls.push_back("second"); }));
    EXPECT_EQ(ex.host_copy(x, [] {}), -1);
    EXPECT_THROW(ex.host_copied(id), UsageError);  // before a run
    EXPECT_THROW(ex.host_copied(id + 1), UsageError);
    EXPECT_THROW(ex.host_copy(transpose(m), [] {}), UsageError);  // strided
    EXPECT_THROW(ex.host_copy(square(first), [] {}), UsageError);  // not in the graph
    for (double shift : {0.0, 1.0}) {
      x.assign<double>({1 + shift, 2 + shift, 3 + shift});
      ex.run();
      const auto* got = static_cast<const double*>(ex.host_copied(id));
      for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(got[i], 2 * std::exp(i + 1 + shift)) << i;
    }
    EXPECT_EQ(calls, (std::vector<std::string>{"first", "second", "first", "second"}));
  }
}

// A stage may not read an earlier stage's intermediate: the planner may have
// given its memory to a later node by then.
TEST(Executor, StagesRefuseToReadAnEarlierIntermediate) {
  Tensor x = Tensor::from_vector<double>({4}, {1, 2, 3, 4});
  Tensor hidden = exp(x);
  Graph g;
  g.add_output(sum(hidden));
  g.add_output(hidden * 3.0, 1);
  try {
    Executor ex(g);
    FAIL() << "compiled";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("of stage 1 reads"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("make it an output of stage 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.add_output(x, -1), UsageError);
}
