// Tensors and views: layouts, aliasing, and values through eval().
#include <gtest/gtest.h>

#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"

using namespace nabla;

namespace {

Tensor iota(Shape shape, DType dtype = DType::f32) {
  Tensor t = Tensor::zeros(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::f32) t.data_as<float>()[i] = float(i);
    else t.data_as<double>()[i] = double(i);
  }
  return t;
}

std::vector<float> values(const Tensor& t) { return eval(t).to_vector<float>(); }

}  // namespace

TEST(Tensor, LeafBasics) {
  Tensor t = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.strides(), (Strides{3, 1}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_TRUE(t.is_leaf());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.item(4), 5.0);
  EXPECT_THROW(Tensor::from_vector<float>({2, 2}, {1, 2, 3}), ShapeError);
  EXPECT_THROW(t.to_vector<double>(), DTypeError);
}

TEST(Tensor, ViewsShareStorageAndComputeStrides) {
  Tensor x = iota({2, 3, 4});
  Tensor p = permute(x, {2, 0, 1});
  EXPECT_TRUE(p.is_view());
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Strides{1, 12, 4}));
  EXPECT_FALSE(p.is_contiguous());

  Tensor s = slice(x, 2, 1, 4, 2);  // columns 1, 3
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.strides(), (Strides{12, 4, 2}));
  EXPECT_EQ(s.offset(), 1);

  Tensor e = expand(reshape(x, {2, 1, 3, 4}), {2, 5, 3, 4});
  EXPECT_EQ(e.strides()[1], 0);

  EXPECT_EQ(values(slice(iota({10}), 0, 2, 9, 3)), (std::vector<float>{2, 5, 8}));
  EXPECT_EQ(values(transpose(iota({2, 3}))), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(values(expand(iota({2, 1}), {2, 3})), (std::vector<float>{0, 0, 0, 1, 1, 1}));
}

TEST(Tensor, ContiguousCopiesOnlyWhenNeeded) {
  Tensor x = iota({3, 4});
  EXPECT_TRUE(contiguous(x).same(x));
  Tensor t = transpose(x);
  Tensor c = contiguous(t);
  EXPECT_FALSE(c.same(t));
  EXPECT_TRUE(c.is_contiguous());
  // A reshape of a non-contiguous view copies first, then views the copy.
  Tensor r = reshape(t, {12});
  EXPECT_EQ(values(r), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  // A reshape of a contiguous offset view stays a view of the leaf.
  Tensor o = reshape(slice(x, 0, 1, 3), {8});
  EXPECT_EQ(o.offset(), 4);
  EXPECT_EQ(values(o), (std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11}));
}

TEST(Tensor, LeavesCanBeRewrittenBetweenRuns) {
  Tensor x = Tensor::from_vector<float>({2}, {1, 2});
  Tensor y = x * 3.0;
  Graph g({y});
  Executor ex(g, {.threads = 1});
  ex.run();
  EXPECT_EQ(ex.read<float>(y), (std::vector<float>{3, 6}));
  x.assign<float>({10, 20});
  ex.run();
  EXPECT_EQ(ex.read<float>(y), (std::vector<float>{30, 60}));
}

TEST(Ops, ValuesMatchHandComputedResults) {
  Tensor a = Tensor::from_vector<double>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from_vector<double>({3}, {10, 20, 30});
  EXPECT_EQ(eval(a + b).to_vector<double>(), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(eval(sum(a, {0})).to_vector<double>(), (std::vector<double>{5, 7, 9}));
  EXPECT_EQ(eval(mean(a, {1}, true)).to_vector<double>(), (std::vector<double>{2, 5}));
  EXPECT_EQ(eval(max(a)).to_vector<double>(), (std::vector<double>{6}));
  EXPECT_EQ(eval(matmul(a, b)).to_vector<double>(), (std::vector<double>{140, 320}));
  Tensor idx = Tensor::from_vector<int32_t>({3}, {1, 0, 1});
  EXPECT_EQ(eval(get_rows(a, idx)).to_vector<double>(), (std::vector<double>{4, 5, 6, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(eval(scatter_add_rows(get_rows(a, idx), idx, 2)).to_vector<double>(),
            (std::vector<double>{1, 2, 3, 8, 10, 12}));
  EXPECT_EQ(eval(concat({a, a}, 1)).shape(), (Shape{2, 6}));
  Tensor c = Tensor::from_vector<int32_t>({2, 1}, {0, 1});
  EXPECT_EQ(eval(where(c, a, -a)).to_vector<double>(), (std::vector<double>{-1, -2, -3, 4, 5, 6}));
}

TEST(Ops, BadInputsThrowClearErrors) {
  Tensor a = Tensor::zeros(DType::f32, {4, 5});
  Tensor b = Tensor::zeros(DType::f32, {6, 3});
  try {
    matmul(a, b);
    FAIL() << "matmul accepted mismatched inner dimensions";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "matmul: inner dimensions differ: a is [4, 5], b is [6, 3]");
  }
  EXPECT_THROW(add(a, b), ShapeError);
  EXPECT_THROW(add(a, Tensor::zeros(DType::f64, {4, 5})), DTypeError);
  EXPECT_THROW(reshape(a, {3, 7}), ShapeError);
  EXPECT_THROW(permute(a, {0, 0}), ShapeError);
  EXPECT_THROW(sum(a, {2}), ShapeError);
  EXPECT_THROW(concat({a, b}, 0), ShapeError);
  EXPECT_THROW(expand(a, {4, 6}), ShapeError);
  EXPECT_THROW(slice(a, 0, 0, 2, 0), ShapeError);
  EXPECT_THROW(get_rows(a, Tensor::zeros(DType::f32, {2})), DTypeError);
  EXPECT_THROW(exp(Tensor::zeros(DType::i32, {2})), DTypeError);
  EXPECT_THROW(add(a, Tensor()), UsageError);
  try {
    reshape(a, {3, 7});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reshape"), std::string::npos) << e.what();
  }
}

TEST(Ops, OutOfRangeIndexIsAnErrorAtRunTime) {
  Tensor table = Tensor::zeros(DType::f32, {3, 2});
  Tensor idx = Tensor::from_vector<int32_t>({2}, {1, 3});
  EXPECT_THROW(eval(get_rows(table, idx)), ShapeError);
}
