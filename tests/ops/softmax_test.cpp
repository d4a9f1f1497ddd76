// softmax's masking conventions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

TEST(Softmax, CausalLastQuerySeesEveryKey) {
  // Tq = 2, Tk = 3: query 0 sees keys 0..1, query 1 sees all.
  Tensor x = Tensor::zeros(DType::f64, {2, 3});
  std::vector<double> y = eval(softmax(x, 1.0, Tensor(), true)).to_vector<double>();
  std::vector<double> want = {0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3};
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-15) << i;
}

TEST(Softmax, LargeInputsDoNotOverflow) {
  Tensor x = Tensor::from_vector<float>({3}, {1000, 1001, 1002});
  std::vector<float> y = eval(softmax(x)).to_vector<float>();
  double e1 = std::exp(-1.0), e2 = std::exp(-2.0);
  EXPECT_NEAR(y[2], 1 / (1 + e1 + e2), 1e-6);
  std::vector<float> l = eval(log_softmax(x)).to_vector<float>();
  EXPECT_NEAR(l[2], -std::log(1 + e1 + e2), 1e-5);
}

TEST(Softmax, FullyMaskedRowIsNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = Tensor::zeros(DType::f64, {2, 2});
  Tensor mask = Tensor::from_vector<double>({2, 2}, {0, -inf, -inf, -inf});
  std::vector<double> y = eval(softmax(x, 1.0, mask)).to_vector<double>();
  EXPECT_EQ(y[0], 1.0);
  EXPECT_EQ(y[1], 0.0);
  EXPECT_TRUE(std::isnan(y[2]) && std::isnan(y[3]));
}

// The f32 kernel (rows of at most one vector four at a time; contiguous
// unmasked short rows on a path of their own; rows of up to 16 vectors held
// in registers, two at a time where they take as many vectors, where the
// mask is a scalar; longer rows four at a time) against f64 on the same
// values: row counts that leave a partial block, causal rows (whose visible
// lengths change the number of vectors within a pair), a transposed x, a
// fully masked row inside a block (NaN there only), no mask, and the same
// bits at 1-3 threads.
TEST(Softmax, F32MatchesF64) {
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t len : {7, 16, 37, 200, 300}) {
    for (bool causal : {false, true}) {
      for (int layout = 0; layout < 3; ++layout) {  // 0: contiguous, 1: transposed, 2: contiguous, no mask
        const bool transposed = layout == 1, masked = layout != 2;
        const int64_t rows = 2 * 9;  // [2, 9, len]: 18 rows, four blocks and two over
        std::vector<double> v(size_t(rows * len)), m(size_t(9 * len), 0.0);
        for (size_t i = 0; i < v.size(); ++i) v[i] = float(std::sin(0.37 * double(i)) * 3);
        for (int64_t j = 0; j < len; ++j) m[size_t(5 * len + j)] = -inf;  // row 5 of each batch fully masked
        const Shape shape = transposed ? Shape{2, len, 9} : Shape{2, 9, len};
        Tensor x64 = Tensor::from_vector<double>(shape, v), mask64 = Tensor::from_vector<double>({9, len}, m);
        Tensor x32 = Tensor::from_vector<float>(shape, std::vector<float>(v.begin(), v.end()));
        Tensor mask32 = Tensor::from_vector<float>({9, len}, std::vector<float>(m.begin(), m.end()));
        if (transposed) x64 = transpose(x64), x32 = transpose(x32);
        if (!masked) mask64 = Tensor(), mask32 = Tensor();
        const std::vector<double> want = eval(softmax(x64, 0.5, mask64, causal)).to_vector<double>();
        const Tensor y32 = softmax(x32, 0.5, mask32, causal);
        const std::vector<float> got = eval(y32, {.threads = 1}).to_vector<float>();
        const std::string what =
            "len " + std::to_string(len) + (causal ? " causal" : "") + " layout " + std::to_string(layout);
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::isnan(want[i])) {
            EXPECT_TRUE(std::isnan(got[i])) << what << " element " << i;
          } else {
            ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + want[i])) << what << " element " << i;
          }
        }
        for (int threads : {2, 3}) {
          const std::vector<float> again = eval(y32, {.threads = threads}).to_vector<float>();
          EXPECT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * sizeof(float))) << what << ", " << threads;
        }
      }
    }
  }
}

// A NaN score makes its row NaN (as in PyTorch and the f64 kernel), on every
// f32 path: rows of one vector in blocks of 16 and of 4, longer rows, the
// row walker (a mask that is not a scalar); the other rows stay as f64 has them.
TEST(Softmax, NaNScoreMakesItsRowNaN) {
  for (int64_t len : {7, 16, 37}) {
    for (bool scalar_mask : {true, false}) {
      const int64_t rows = 21;  // a block of 16, one of 4 and one row
      std::vector<double> v(size_t(rows * len));
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37 * double(i)) * 3;
      for (int64_t nan_row : {3, 18, 20}) v[size_t(nan_row * len + len / 2)] = std::nan("");
      Tensor mask32 = scalar_mask ? Tensor() : Tensor::zeros(DType::f32, {rows, len});
      Tensor mask64 = scalar_mask ? Tensor() : Tensor::zeros(DType::f64, {rows, len});
      const std::vector<float> got =
          eval(softmax(Tensor::from_vector<float>({rows, len}, std::vector<float>(v.begin(), v.end())), 0.5, mask32))
              .to_vector<float>();
      const std::vector<double> want =
          eval(softmax(Tensor::from_vector<double>({rows, len}, v), 0.5, mask64)).to_vector<double>();
      for (size_t i = 0; i < got.size(); ++i) {
        const int64_t row = int64_t(i) / len;
        const std::string what = "len " + std::to_string(len) + " row " + std::to_string(row);
        if (row == 3 || row == 18 || row == 20) {
          EXPECT_TRUE(std::isnan(got[i]) && std::isnan(want[i])) << what;
        } else {
          ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + want[i])) << what;
        }
      }
    }
  }
}

// Rows whose every score is -inf (x itself, the mask a scalar) are NaN on
// each f32 path, whole rows, the rows around them untouched.
TEST(Softmax, RowOfMinusInfinityIsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t len : {7, 37, 200, 300}) {
    for (bool causal : {false, true}) {
      const int64_t rows = 6;
      std::vector<float> v(size_t(rows * len), 0.0f);
      for (int64_t j = 0; j < len; ++j) v[size_t(2 * len + j)] = -inf;
      const std::vector<float> y =
          eval(softmax(Tensor::from_vector<float>({rows, len}, v), 1.0, Tensor(), causal)).to_vector<float>();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t visible = causal ? len - rows + r + 1 : len;
        for (int64_t j = 0; j < len; ++j) {
          const float got = y[size_t(r * len + j)];
          const std::string what = "len " + std::to_string(len) + (causal ? " causal" : "") + " row " +
                                   std::to_string(r) + " key " + std::to_string(j);
          if (r == 2) {
            EXPECT_TRUE(std::isnan(got)) << what;
          } else {
            EXPECT_FLOAT_EQ(got, j < visible ? 1.0f / float(visible) : 0.0f) << what;
          }
        }
      }
    }
  }
}

TEST(Softmax, RejectsAMaskThatDoesNotBroadcast) {
  Tensor x = Tensor::zeros(DType::f32, {2, 3});
  EXPECT_THROW(softmax(x, 1.0, Tensor::zeros(DType::f32, {2, 3, 3})), ShapeError);
  EXPECT_THROW(softmax(x, 1.0, Tensor::zeros(DType::f64, {3})), DTypeError);
  EXPECT_THROW(softmax(Tensor::zeros(DType::f32, {3}), 1.0, Tensor(), true), ShapeError);
}

}  // namespace
