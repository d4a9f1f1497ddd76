// Values of pad, repeat, set_rows and argmax against small hand-written
// results; copies of transposed views (contiguous, concat) element by element.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

TEST(Pad, ConstantBorder) {
  Tensor x = Tensor::from_vector<float>({1, 2}, {1, 2});
  EXPECT_EQ(eval(pad(x, {{1, 0}, {0, 1}}, 9)).to_vector<float>(),
            (std::vector<float>{9, 9, 9, 1, 2, 9}));
  EXPECT_THROW(pad(x, {{1, 0}}), ShapeError);
  EXPECT_THROW(pad(x, {{-1, 0}, {0, 0}}), ShapeError);
}

TEST(Repeat, TilesLikeTorch) {
  // torch.tensor([[1, 2]]).repeat(2, 2) and .repeat(2, 1, 1) ([2, 1, 2]).
  Tensor x = Tensor::from_vector<float>({1, 2}, {1, 2});
  Tensor y = repeat(x, {2, 2});
  EXPECT_EQ(y.shape(), (Shape{2, 4}));
  EXPECT_EQ(eval(y).to_vector<float>(), (std::vector<float>{1, 2, 1, 2, 1, 2, 1, 2}));
  EXPECT_EQ(repeat(x, {2, 1, 1}).shape(), (Shape{2, 1, 2}));
  EXPECT_THROW(repeat(x, {2}), ShapeError);
}

TEST(SetRows, LastWriteWins) {
  Tensor dst = Tensor::from_vector<float>({3, 1}, {1, 2, 3});
  Tensor idx = Tensor::from_vector<int32_t>({3}, {2, 0, 2});
  Tensor values = Tensor::from_vector<float>({3, 1}, {10, 20, 30});
  EXPECT_EQ(eval(set_rows(dst, idx, values)).to_vector<float>(), (std::vector<float>{20, 2, 30}));
  Tensor bad = Tensor::from_vector<int32_t>({3}, {0, 3, 1});
  EXPECT_THROW(eval(set_rows(dst, bad, values)), ShapeError);
}

TEST(Argmax, FirstMaximumAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector<float>({3, 3}, {1, 3, 3, 2, nan, 5, -1, -1, -2});
  EXPECT_EQ(eval(argmax(x, -1)).to_vector<int32_t>(), (std::vector<int32_t>{1, 1, 0}));
  EXPECT_EQ(eval(argmax(x, 0, true)).to_vector<int32_t>(), (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(argmax(x, 0, true).shape(), (Shape{1, 3}));
}

// x[b, i, j] = 1000 b + 10 i + j as T, shape [B, R, C].
template <class T>
Tensor numbered(int64_t B, int64_t R, int64_t C) {
  std::vector<T> v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j) v.push_back(T(1000 * b + 10 * i + j));
  return Tensor::from_vector<T>({B, R, C}, v);
}

// Transposed views copied whole (contiguous) and into a band of a larger
// output (concat), split finely over threads: every element must land in its
// place, at every element size.
template <class T>
void check_transposed_copies() {
  const int64_t B = 3, R = 37, C = 21;
  Tensor t = transpose(numbered<T>(B, R, C), 1, 2);  // [B, C, R], last axis strided
  Tensor head = numbered<T>(B, 2, R);
  for (int threads : {1, 3}) {
    std::vector<Tensor> out = eval({contiguous(t), concat({head, t}, 1)},
                                   {.threads = threads, .max_grain = threads > 1 ? 1 : 0});
    std::vector<T> copy = out[0].to_vector<T>(), joined = out[1].to_vector<T>();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < C; ++j) {
        for (int64_t i = 0; i < R; ++i) {
          const T want = T(1000 * b + 10 * i + j);
          ASSERT_EQ(copy[(b * C + j) * R + i], want) << "b " << b << " j " << j << " i " << i;
          ASSERT_EQ(joined[(b * (C + 2) + 2 + j) * R + i], want) << "b " << b << " j " << j << " i " << i;
        }
      }
      for (int64_t i = 0; i < R; ++i) ASSERT_EQ(joined[(b * (C + 2) + 1) * R + i], T(1000 * b + 10 + i));
    }
  }
}

TEST(TransposedCopy, ContiguousAndConcatPlaceEveryElement) {
  check_transposed_copies<double>();
  check_transposed_copies<float>();
  check_transposed_copies<int32_t>();
}

}  // namespace
