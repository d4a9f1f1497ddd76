// The CUDA backend's row sums (scatter_add_rows, add_rows: an embedding's
// gradient) with many positions on few rows: each row's values are summed in
// position order whatever order the GPU's atomics list them in (the emulator
// runs blocks and threads in a scrambled order), so the sums are the CPU's
// bit for bit, on the emulator and on a GPU where this machine has one.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends.h"
#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"

using namespace nabla;

namespace {

TEST(CudaRowSums, EachRowSumsItsPositionsInOrder) {
  constexpr int64_t kPositions = 700, kRows = 6, kWidth = 5;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> row(0, kRows - 2);  // the last row named by none
  std::vector<float> v(static_cast<size_t>(kPositions * kWidth)), b(static_cast<size_t>(kRows * kWidth));
  // Magnitudes over six decades: a sum in another order rounds differently.
  for (float& x : v) x = normal(gen) * std::pow(10.0f, float(int(gen() % 6)) - 3.0f);
  for (float& x : b) x = normal(gen);
  std::vector<int32_t> idx(static_cast<size_t>(kPositions));
  for (int32_t& i : idx) i = row(gen);
  const Tensor values = Tensor::from_vector<float>({kPositions, kWidth}, v);
  const Tensor indices = Tensor::from_vector<int32_t>({kPositions}, idx);
  const Tensor base = Tensor::from_vector<float>({kRows, kWidth}, b);
  const std::vector<Tensor> outs{scatter_add_rows(values, indices, kRows), add_rows(base, values, indices)};
  const std::vector<Tensor> cpu = eval(outs, {.threads = 2});
  for (const std::string& backend : testing_backends::cuda_backends()) {
    const std::vector<Tensor> got = eval(outs, {.backend = backend});
    EXPECT_EQ(got[0].to_vector<float>(), cpu[0].to_vector<float>()) << backend << ": scatter_add_rows";
    EXPECT_EQ(got[1].to_vector<float>(), cpu[1].to_vector<float>()) << backend << ": add_rows";
  }
}

}  // namespace
