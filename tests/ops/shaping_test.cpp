// Values of pad, repeat, set_rows and argmax against small hand-written results.
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

}  // namespace
