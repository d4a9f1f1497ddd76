// matmul_add at the models' sizes, where its product runs on BLAS tiles or on
// the split-K path (the gradient cases are small products): against matmul
// then add, with c a bias, a full tensor in its own memory, and a full
// tensor that dies there (the product accumulates in c's memory); f32, f64
// and the bf16 option; the same bits at any thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"

using namespace nabla;

namespace {

Tensor random_tensor(DType dtype, Shape shape, uint32_t seed) {
  Tensor t = Tensor::zeros(dtype, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::f64) t.data_as<double>()[i] = dist(rng);
    else t.data_as<float>()[i] = float(dist(rng));
  }
  return t;
}

std::vector<double> values(const Tensor& t, const ExecOptions& options) {
  Tensor out = eval(t, options);
  std::vector<double> v(static_cast<size_t>(out.numel()));
  for (int64_t i = 0; i < out.numel(); ++i) {
    v[i] = out.dtype() == DType::f64 ? out.data_as<double>()[i] : double(out.data_as<float>()[i]);
  }
  return v;
}

}  // namespace

TEST(MatmulAdd, MatchesMatmulThenAddOnTilesAndSplitK) {
  struct Case {
    int64_t M, K, N;
  };
  enum class Addend { bias, full, dying };
  // 1100 x 64 x 96: BLAS tiles; 96 x 2048 x 80: split K; 16 x 8 x 24: small.
  for (const Case c : {Case{1100, 64, 96}, Case{96, 2048, 80}, Case{16, 8, 24}}) {
    for (DType dtype : {DType::f32, DType::f64}) {
      for (bool bf16 : {false, true}) {
        if (bf16 && dtype != DType::f32) continue;
        for (Addend kind : {Addend::bias, Addend::full, Addend::dying}) {
          const std::string what = std::to_string(c.M) + "x" + std::to_string(c.K) + "x" + std::to_string(c.N) +
                                   " " + dtype_name(dtype) + (bf16 ? " bf16" : "") + " addend " +
                                   std::to_string(int(kind));
          Tensor a = random_tensor(dtype, {c.M, c.K}, 1);
          Tensor w = random_tensor(dtype, {c.N, c.K}, 2);  // a linear layer's weight, read transposed
          Tensor base = random_tensor(dtype, kind == Addend::bias ? Shape{c.N} : Shape{c.M, c.N}, 3);
          // A dying addend is computed in the graph and read only here.
          Tensor addend = kind == Addend::dying ? base * 2.0 : base;
          Tensor fused = matmul_add(a, transpose(w), addend);
          Tensor composed = matmul(a, transpose(w)) + addend;
          ExecOptions one{.threads = 1, .bf16_matmul = bf16};
          if (kind == Addend::dying) {  // the product accumulates in c's memory
            EXPECT_EQ(Executor(Graph({fused}), one).memory().inplace, 1) << what;
          }
          const std::vector<double> got = values(fused, one), want = values(composed, one);
          ASSERT_EQ(got.size(), want.size()) << what;
          // The same products, summed onto c rather than c added after: equal
          // up to rounding of the final addition.
          const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]) + c.K * 1e-3)) << what << " element " << i;
          }
          for (int threads : {2, 3}) {
            EXPECT_EQ(values(fused, {.threads = threads, .bf16_matmul = bf16}), got) << what << ", " << threads;
          }
        }
      }
    }
  }
}

TEST(MatmulAdd, RejectsShapesThatDoNotFit) {
  Tensor a = Tensor::zeros(DType::f32, {3, 4}), b = Tensor::zeros(DType::f32, {4, 5});
  EXPECT_THROW(matmul_add(a, b, Tensor::zeros(DType::f32, {4})), ShapeError);
  EXPECT_THROW(matmul_add(a, b, Tensor::zeros(DType::f32, {2, 5})), ShapeError);
  EXPECT_THROW(matmul_add(a, b, Tensor::zeros(DType::f64, {5})), Error);
  EXPECT_THROW(matmul_add(a, Tensor::zeros(DType::f32, {3, 5}), Tensor::zeros(DType::f32, {5})), ShapeError);
}
