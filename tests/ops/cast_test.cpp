// cast: values rounded as static_cast rounds them, on both backends; the
// same dtype is no node; an integer target is refused.
#include <gtest/gtest.h>

#include "nabla/nabla.hpp"
#include "backends.h"

using namespace nabla;

TEST(Cast, RoundsAsStaticCastOnEveryBackend) {
  const std::vector<double> values{0.1, -1.0 / 3, 1e-40, 3.4e38, 16777217.0};
  Tensor x = Tensor::from_vector<double>({5}, values);
  Tensor i = Tensor::from_vector<int32_t>({2, 2}, {-3, 0, 7, 16777217});
  for (const std::string& backend : testing_backends::all_backends()) {
    const std::vector<Tensor> got =
        eval({cast(x, DType::f32), cast(cast(x, DType::f32), DType::f64), cast(transpose(i), DType::f32)},
             {.threads = 2, .backend = backend});
    std::vector<float> want32;
    for (double v : values) want32.push_back(static_cast<float>(v));
    EXPECT_EQ(got[0].to_vector<float>(), want32) << backend;
    EXPECT_EQ(got[1].to_vector<double>(), std::vector<double>(want32.begin(), want32.end())) << backend;
    EXPECT_EQ(got[2].to_vector<float>(), (std::vector<float>{-3, 7, 0, static_cast<float>(16777217)})) << backend;
  }
}

TEST(Cast, SameDtypeIsXItself) {
  Tensor x = Tensor::zeros(DType::f32, {2});
  EXPECT_TRUE(cast(x, DType::f32).same(x));
  EXPECT_THROW(cast(x, DType::i32), DTypeError);
}
