// The CUDA backend's sum, mean and max where the outputs lie side by side
// (a bias's gradient: columns of [rows, C]): warps read across outputs, rows
// are split into chunks on different blocks and the chunks combined in
// order. Shapes here are large enough for several chunks (the registry's
// cases are not); results match the CPU's and are the same bits run to run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backends.h"
#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  return testing_backends::random_tensor(DType::f32, shape, seed);
}

// Element-wise agreement within `tol` of the larger magnitude; NaN where the
// CPU has NaN.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " at " << i;
      continue;
    }
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0f, std::abs(want[i]))) << what << " at " << i;
  }
}

TEST(CudaColumnFolds, MatchTheCpuOverManyRows) {
  const Tensor a = random_tensor({700, 70}, 1);
  const Tensor b = random_tensor({5, 140, 33}, 2);
  // Outputs contiguous, the reduced axis not: read as columns.
  const Tensor at = transpose(random_tensor({70, 700}, 3));  // [700, 70], strides {1, 700}
  std::vector<float> nan_column(static_cast<size_t>(300 * 40), 0.5f);
  nan_column[static_cast<size_t>(211 * 40 + 7)] = std::numeric_limits<float>::quiet_NaN();
  nan_column[static_cast<size_t>(5 * 40 + 9)] = -std::numeric_limits<float>::infinity();
  nan_column[static_cast<size_t>(299 * 40 + 9)] = 2.5f;
  const Tensor c = Tensor::from_vector<float>({300, 40}, nan_column);
  const Tensor d = random_tensor({3, 1, 400, 40}, 4);
  const std::vector<std::pair<std::string, Tensor>> cases{
      {"sum [700, 70] over 0", sum(a, {0})},
      {"mean [700, 70] over 0", mean(a, {0})},
      {"max [700, 70] over 0", max(a, {0})},
      {"sum [5, 140, 33] over 0, 1", sum(b, {0, 1})},
      {"mean [5, 140, 33] over 0, 1 keepdim", mean(b, {0, 1}, true)},
      {"sum transposed over 1 (columns)", sum(at, {1})},
      {"sum transposed over 0 (rows)", sum(at, {0})},
      {"max with NaN and -inf", max(c, {0})},
      {"sum [3, 1, 400, 40] over 0, 2 keepdim", sum(d, {0, 2}, true)},
  };
  std::vector<Tensor> outs;
  for (const auto& c : cases) outs.push_back(c.second);
  const std::vector<Tensor> cpu = eval(outs, {.threads = 2});
  for (const std::string& backend : testing_backends::cuda_backends()) {
    const std::vector<Tensor> got = eval(outs, {.backend = backend});
    const std::vector<Tensor> again = eval(outs, {.backend = backend});
    for (size_t k = 0; k < cases.size(); ++k) {
      expect_close(got[k].to_vector<float>(), cpu[k].to_vector<float>(), 2e-5f, backend + ": " + cases[k].first);
      const std::vector<float> g = got[k].to_vector<float>(), r = again[k].to_vector<float>();
      EXPECT_EQ(0, std::memcmp(g.data(), r.data(), g.size() * sizeof(float))) << backend << ": " << cases[k].first
                                                                                << " differs between runs";
    }
  }
}

}  // namespace
