// matmul's split-K path (a long reduction into a small output, as in weight
// gradients, or into a wider one): exact to rounding against a long double reference, and
// bit-identical at any thread count, for plain and transposed operands, f64,
// f32 and the bf16 option.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

template <class T>
Tensor random_tensor(DType dtype, Shape shape, uint32_t seed) {
  Tensor t = Tensor::zeros(dtype, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<T>()[i] = static_cast<T>(dist(rng));
  return t;
}

struct Case {
  int64_t M, N, K;
  bool trans_a, trans_b;
};

// op(A) [M, K] x op(B) [K, N], operands stored transposed when asked.
template <class T>
std::vector<T> run(const Case& c, DType dtype, int threads, bool bf16, std::vector<long double>* reference = nullptr) {
  Tensor a = random_tensor<T>(dtype, c.trans_a ? Shape{c.K, c.M} : Shape{c.M, c.K}, 1);
  Tensor b = random_tensor<T>(dtype, c.trans_b ? Shape{c.N, c.K} : Shape{c.K, c.N}, 2);
  Tensor out = matmul(c.trans_a ? transpose(a) : a, c.trans_b ? transpose(b) : b);
  Graph g({out});
  Executor ex(g, {.threads = threads, .bf16_matmul = bf16});
  ex.run();
  if (reference) {
    const T *ap = a.data_as<T>(), *bp = b.data_as<T>();
    reference->assign(size_t(c.M * c.N), 0);
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        long double s = 0;
        for (int64_t k = 0; k < c.K; ++k)
          s += (long double)(c.trans_a ? ap[k * c.M + i] : ap[i * c.K + k]) *
               (c.trans_b ? bp[j * c.K + k] : bp[k * c.N + j]);
        (*reference)[size_t(i * c.N + j)] = s;
      }
  }
  return ex.read<T>(out);
}

// The last two: a side over 512 and K at least 16 times it, split in four
// chunks (GPT-2's output head's input gradient).
const Case kCases[] = {{96, 256, 2048, true, false}, {7, 9, 1500, false, false}, {33, 65, 1576, true, true},
                       {512, 128, 1100, false, true},  {8, 600, 9700, false, false}, {520, 4, 8400, true, false}};

}  // namespace

TEST(MatmulSplitK, MatchesReferenceAndIsBitIdenticalAcrossThreads) {
  for (const Case& c : kCases) {
    std::vector<long double> ref;
    std::vector<double> one = run<double>(c, DType::f64, 1, false, &ref);
    // |error| <= (K + 1) eps sum |a||b| <= (K + 1) eps K for entries in [-1, 1].
    const long double bound = (c.K + 1) * std::numeric_limits<double>::epsilon() * c.K;
    for (size_t i = 0; i < one.size(); ++i) ASSERT_NEAR(one[i], ref[i], bound) << "M " << c.M << " K " << c.K;
    for (int threads : {2, 4}) {
      std::vector<double> other = run<double>(c, DType::f64, threads, false);
      EXPECT_EQ(std::memcmp(one.data(), other.data(), one.size() * sizeof(double)), 0) << threads << " threads";
    }
    for (bool bf16 : {false, true}) {
      std::vector<float> f1 = run<float>(c, DType::f32, 1, bf16);
      for (int threads : {2, 4}) {
        std::vector<float> f = run<float>(c, DType::f32, threads, bf16);
        EXPECT_EQ(std::memcmp(f1.data(), f.data(), f1.size() * sizeof(float)), 0)
            << threads << " threads, bf16 " << bf16;
      }
    }
  }
}
