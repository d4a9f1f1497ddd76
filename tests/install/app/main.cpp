// Builds a small graph with the installed headers and library, differentiates
// it and checks the gradients: loss = sum(matmul(a, b) * c) with a [2, 3],
// b [3, 2], c [2, 2], so dloss/da = c b^T.
#include <cmath>
#include <cstdio>
#include <vector>

#include "nabla/nabla.hpp"  // every public header: each must build outside the tree

int main() {
  using nabla::Tensor;
  std::vector<double> a_values{1, 2, 3, 4, 5, 6}, b_values{1, -1, 2, 0, 0.5, 3},
      c_values{1, 2, 3, 4};
  Tensor a = Tensor::from_vector<double>({2, 3}, a_values);
  Tensor b = Tensor::from_vector<double>({3, 2}, b_values);
  Tensor c = Tensor::from_vector<double>({2, 2}, c_values);
  Tensor loss = nabla::sum(nabla::matmul(a, b) * c);
  Tensor da = nabla::grad(loss, {a})[0];
  nabla::ExecOptions options;
  options.threads = 2;
  std::vector<Tensor> out = nabla::eval({loss, da}, options);

  // loss: matmul(a, b) = [[6.5, 8], [17, 14]], times c and summed.
  double expected_loss = 6.5 * 1 + 8 * 2 + 17 * 3 + 14 * 4;
  std::vector<double> got = out[1].to_vector<double>();
  int failures = 0;
  if (std::abs(out[0].to_vector<double>()[0] - expected_loss) > 1e-12) {
    std::printf("loss %g, expected %g\n", out[0].to_vector<double>()[0], expected_loss);
    ++failures;
  }
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 3; ++k) {
      double expected =
          c_values[i * 2] * b_values[k * 2] + c_values[i * 2 + 1] * b_values[k * 2 + 1];
      if (std::abs(got[i * 3 + k] - expected) > 1e-12) {
        std::printf("da[%d][%d] = %g, expected %g\n", i, k, got[i * 3 + k], expected);
        ++failures;
      }
    }
  }
  std::printf("%s: loss %g, da[0] = [%g, %g, %g]\n", failures ? "FAILED" : "ok",
              out[0].to_vector<double>()[0], got[0], got[1], got[2]);
  return failures ? 1 : 0;
}
