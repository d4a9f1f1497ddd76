// Test entry point: registers one gradient-check test per op x case x layout
// x thread count from the op registry, then runs everything.
#include <gtest/gtest.h>

#include <functional>

#include "core/op_check.h"
#include "nabla/executor.h"

namespace {

class OpGradTest : public testing::Test {
 public:
  OpGradTest(const nabla::OpDef* op, nabla::GradCase c, nabla::Layout layout, int threads)
      : op_(op), case_(std::move(c)), layout_(layout), threads_(threads) {}
  void TestBody() override {
    nabla::GradcheckResult r = nabla::check_op_case(*op_, case_, layout_, threads_);
    EXPECT_TRUE(r.ok) << r.message;
    bool any_checked = false;
    for (const nabla::CaseInput& in : case_.inputs) any_checked = any_checked || in.checked;
    if (any_checked) {
      EXPECT_GT(r.checked, 0) << "no gradient entry was compared";
    }
  }

 private:
  const nabla::OpDef* op_;
  nabla::GradCase case_;
  nabla::Layout layout_;
  int threads_;
};

// A comparison of one case that must hold and compare something: a fused op
// against its composite (f64), or another backend against the CPU.
class ComparisonTest : public testing::Test {
 public:
  explicit ComparisonTest(std::function<nabla::GradcheckResult()> check) : check_(std::move(check)) {}
  void TestBody() override {
    nabla::GradcheckResult r = check_();
    EXPECT_TRUE(r.ok) << r.message;
    EXPECT_GT(r.checked, 0);
  }

 private:
  std::function<nabla::GradcheckResult()> check_;
};

void register_gradient_tests() {
  std::vector<std::pair<std::string, std::string>> other_backends{{"Reference_", "reference"},
                                                                  {"CudaEmulated_", "cuda-emulated"}};
  if (nabla::backend_unavailable("cuda").empty()) other_backends.emplace_back("Cuda_", "cuda");
  for (const nabla::OpDef* op : nabla::all_ops()) {
    if (!op->cases) continue;  // an update op (registry_problems says which may lack cases)
    for (const nabla::GradCase& c : op->cases()) {
      for (nabla::Layout layout : nabla::kAllLayouts) {
        if (!nabla::layout_applies(c, layout)) continue;
        if (op->fused) {
          std::string suite = std::string("Composite_") + op->name;
          std::string name = c.name + "_" + nabla::layout_name(layout);
          testing::RegisterTest(suite.c_str(), name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                                [=]() -> testing::Test* {
                                  return new ComparisonTest([=] { return nabla::check_composite(*op, c, layout, 2); });
                                });
        }
        // Every backend with memory of its own against the CPU: the CUDA
        // kernels under the emulator everywhere, on the GPU where there is one.
        for (const auto& [prefix, backend_name] : other_backends) {
          const std::string backend = backend_name;  // clang 14 captures no structured binding
          std::string suite = prefix + op->name;
          std::string name = c.name + "_" + nabla::layout_name(layout);
          testing::RegisterTest(suite.c_str(), name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                                [=]() -> testing::Test* {
                                  return new ComparisonTest([=] { return nabla::check_backend(*op, c, layout, backend); });
                                });
        }
        for (int threads : {1, 2, 4}) {
          std::string suite = std::string("Grad_") + op->name;
          std::string name = c.name + "_" + nabla::layout_name(layout) + "_t" + std::to_string(threads);
          testing::RegisterTest(suite.c_str(), name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                                [=]() -> testing::Test* { return new OpGradTest(op, c, layout, threads); });
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  register_gradient_tests();
  return RUN_ALL_TESTS();
}
