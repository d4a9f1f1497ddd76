// ExecOptions::check_finite (and NABLA_CHECK_FINITE=1, --check-finite):
// the first op that produces NaN or Inf is named with its graph position and
// its inputs' dtypes, shapes and ops.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

std::string run_error(const Tensor& out) {
  Executor ex(Graph({out}), {.threads = 1, .check_finite = true});
  try {
    ex.run();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for a non-finite value";
  return "";
}

}  // namespace

TEST(CheckFinite, LogOfANegativeNamesOpPositionAndInputs) {
  Tensor x = Tensor::from_vector<float>({3}, {1, -2, 3});
  std::string m = run_error(sum(log(x) * 2.0));
  EXPECT_EQ(m, "check_finite: 'log' at graph position 1 produced NaN at element 1 of [3]; inputs: f32[3] (leaf)");
}

TEST(CheckFinite, NamesEveryInputShape) {
  Tensor a = Tensor::from_vector<double>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from_vector<double>({3}, {1, 0, 1});
  std::string m = run_error(sum(exp(a) / b));
  EXPECT_NE(m.find("check_finite: 'div' at graph position "), std::string::npos) << m;
  EXPECT_NE(m.find(" produced Inf at element 1 of [2, 3]; inputs: f64[2, 3] (exp), f64[3] (leaf)"), std::string::npos)
      << m;
}

TEST(CheckFinite, OffByDefaultAndFiniteGraphsRun) {
  Tensor x = Tensor::from_vector<float>({2}, {-1, 4});
  Tensor y = log(x);
  Executor plain(Graph({y}), {.threads = 1});
  EXPECT_NO_THROW(plain.run());
  EXPECT_TRUE(std::isnan(plain.read<float>(y)[0]));
  Executor checked(Graph({sqrt(x * x)}), {.threads = 1, .check_finite = true});
  EXPECT_NO_THROW(checked.run());
}
