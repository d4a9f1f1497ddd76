// The backend layer: devices of leaves, explicit copies, kernels chosen or
// composites run at compile time, and the reference backend's memory being
// its own.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cmath>

#include "backend/cpu/kernel.h"
#include "core/node.h"
#include "core/op.h"
#include "nabla/nabla.hpp"
#include "ops/elementwise.h"
#include "ops/internal_ops.h"
#include "backends.h"

using namespace nabla;

namespace {

struct Cube {
  template <class T>
  T operator()(T x) const { return x * x * x; }
};
// An op with a CPU kernel only and no composite: other backends cannot run it.
const OpDef op_cpu_only_cube{
    .name = "cpu_only_cube",
    .summary = "x^3 with a CPU kernel alone, for this test",
    .inputs = {{"x", Diff::yes}},
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return ops::infer_unary("cpu_only_cube", in); },
    .backward = [](const BackwardArgs& g) -> Grads { return {g.dout * g.inputs[0] * g.inputs[0] * 3.0}; },
};
NABLA_CPU_KERNEL(op_cpu_only_cube, ops::unary_forward<Cube>);

// A fused op without a reference kernel: the reference runs its composite.
const OpDef op_fused_cube{
    .name = "fused_cube",
    .summary = "x^3, fused, for this test",
    .inputs = {{"x", Diff::yes}},
    .fused = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return ops::infer_unary("fused_cube", in); },
    .composite = [](const std::vector<Tensor>& in, const Attrs&) { return in[0] * in[0] * in[0]; },
};
NABLA_CPU_KERNEL(op_fused_cube, ops::unary_forward<Cube>);

}  // namespace

TEST(Backends, TheBuildHasCpuReferenceAndTheCudaKernels) {
  std::vector<std::string> want{"cpu", "reference", "cuda-emulated"};
#if defined(NABLA_TEST_HAVE_CUDA)
  want.push_back("cuda");
#endif
  EXPECT_EQ(backend_names(), want);
  Tensor x = Tensor::from_vector<float>({2}, {1, 2});
  try {
    eval(x * 2.0, {.backend = "tpu"});
    FAIL() << "an unknown backend ran";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no backend named 'tpu'; this build has cpu, reference, cuda-emulated"),
              std::string::npos)
        << e.what();
  }
}

// Without a GPU (or without nvcc at build time) "cuda" is refused when the
// executor is built, saying why; with one it runs.
TEST(Backends, CudaRunsOrSaysWhyNot) {
  const std::string why = backend_unavailable("cuda");
  Tensor x = Tensor::from_vector<float>({2}, {1, 2});
  if (why.empty()) {
    EXPECT_EQ(eval(x * 2.0, {.backend = "cuda"}).to_vector<float>(), (std::vector<float>{2, 4}));
    return;
  }
  try {
    eval(x * 2.0, {.backend = "cuda"});
    FAIL() << "cuda ran where it says: " << why;
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), why);
  }
#if defined(NABLA_TEST_HAVE_CUDA)
  EXPECT_NE(why.find("backend: cuda: no CUDA device"), std::string::npos) << why;
#else
  EXPECT_NE(why.find("this build has no 'cuda' backend"), std::string::npos) << why;
#endif
  GTEST_SKIP() << why;
}

TEST(Backends, LeavesMoveExplicitly) {
  Tensor x = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  x.set_name("x");
  EXPECT_EQ(x.device(), "cpu");
  Tensor d = x.to("reference");
  EXPECT_EQ(d.device(), "reference");
  EXPECT_EQ(d.name(), "x");
  EXPECT_THROW(d.data(), UsageError);  // its memory is the backend's
  EXPECT_EQ(d.to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(d.item(4), 5.0);
  d.assign<float>({6, 5, 4, 3, 2, 1});
  EXPECT_EQ(d.to("cpu").to_vector<float>(), (std::vector<float>{6, 5, 4, 3, 2, 1}));
  EXPECT_EQ(x.to_vector<float>()[0], 1.0f);  // a copy, not the same memory

  // A leaf on one backend in a graph on another is a compile error naming it.
  try {
    eval(d * 2.0);
    FAIL() << "a reference leaf ran on the CPU";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'x' lives on 'reference' and the graph runs on 'cpu'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(eval(d * 2.0, {.backend = "reference"}).to_vector<float>(),
            (std::vector<float>{12, 10, 8, 6, 4, 2}));
  // Host leaves in a reference graph are copied in at every run.
  Graph g({x * 2.0});
  Executor ex(g, {.backend = "reference"});
  ex.run();
  EXPECT_EQ(ex.read<float>(g.outputs()[0])[5], 12.0f);
  x.data_as<float>()[5] = 10;
  ex.run();
  EXPECT_EQ(ex.read<float>(g.outputs()[0])[5], 20.0f);
  EXPECT_THROW(ex.data(g.outputs()[0]), UsageError);  // device memory: read() copies
}

TEST(Backends, AnOpWithoutKernelRunsItsCompositeOrFailsAtCompile) {
  Tensor x = Tensor::from_vector<double>({3}, {1, -2, 0.5});
  // The reference backend has no kernel for fused_cube: its composite runs.
  const Tensor fused = apply(op_fused_cube, {x});
  EXPECT_EQ(eval(fused, {.backend = "reference"}).to_vector<double>(), (std::vector<double>{1, -8, 0.125}));
  // cpu_only_cube has neither: the graph does not compile there, naming it.
  const Tensor y = apply(op_cpu_only_cube, {x});
  EXPECT_EQ(eval(y).to_vector<double>(), (std::vector<double>{1, -8, 0.125}));
  try {
    Executor ex(Graph({y}), {.backend = "reference"});
    FAIL() << "compiled an op the reference backend cannot run";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cpu_only_cube: the reference backend has no kernel for this op, and the op has no composite to run "
              "instead");
  }
}

TEST(BackendsDeathTest, ReferenceMemoryIsNotHostMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Tensor d = Tensor::from_vector<float>({4}, {1, 2, 3, 4}).to("reference");
  // Read as if it were the host's (what a code path that forgot the copy
  // would do): the page is not readable outside the backend's own kernels.
  // The fault exits with status 3 through a handler of the test's own, so
  // that a sanitizer's handler does not report it as a crash.
  const float* raw = static_cast<const float*>(d.node()->buffer->data);
  EXPECT_EXIT(
      {
        struct sigaction on_fault = {};
        on_fault.sa_handler = [](int) { _exit(3); };
        sigaction(SIGSEGV, &on_fault, nullptr);
        volatile float v = raw[0];
        (void)v;
        _exit(0);
      },
      testing::ExitedWithCode(3), "");
  EXPECT_EQ(d.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
}

// A parameter a step updates on a backend with memory of its own stays
// there between runs: the host's copy is brought back only when read, and a
// host write is sent before the next run. Each backend with memory of its
// own, then the CPU reading what it left.
TEST(Backends, UpdatedParametersStayOnTheBackendBetweenRuns) {
  for (const std::string& backend : testing_backends::device_backends()) {
    Tensor p = Tensor::from_vector<float>({3}, {1, 2, 3});
    p.requires_grad();
    Tensor g = Tensor::from_vector<float>({3}, {1, 1, 1});
    Tensor buf = Tensor::zeros(DType::f32, {3});
    Tensor hyper = Tensor::from_vector<double>({3}, {0.5, 0, 0});  // lr 0.5, no momentum, no decay
    Tensor scale = Tensor::scalar(1.0, DType::f64);
    Executor ex(Graph({sgd_update(p, g, buf, hyper, scale)}), {.threads = 1, .backend = backend});
    ex.run();
    ex.run();
    Buffer& host = *p.node()->buffer;
    EXPECT_FALSE(host.host_current) << backend << ": the step's result was copied back unasked";
    EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{0, 1, 2})) << backend;
    EXPECT_TRUE(host.host_current) << backend;
    p.assign<float>({10, 20, 30});  // a host write: sent before the next run
    ex.run();
    EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{9.5f, 19.5f, 29.5f})) << backend;
    ex.run();
    // The CPU reads the backend's latest values.
    EXPECT_EQ(eval(p * 2.0, {.threads = 1}).to_vector<float>(), (std::vector<float>{18, 38, 58})) << backend;
    // The CPU's own update makes the backend's copy stale.
    Executor cpu(Graph({sgd_update(p, g, buf, hyper, scale)}), {.threads = 1});
    cpu.run();
    ex.run();
    EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{8, 18, 28})) << backend;
  }
}
