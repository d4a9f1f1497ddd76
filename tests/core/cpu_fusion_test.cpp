// The CPU backend's rewrite after autodiff (src/backend/cpu/fusion.h): what
// it must leave alone.
#include <gtest/gtest.h>

#include "backend/cpu/fusion.h"
#include "core/graph_internal.h"
#include "core/node.h"
#include "core/op.h"
#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"

using namespace nabla;

namespace {

int count(const std::vector<Tensor>& outputs, const std::string& op) {
  int n = 0;
  for (const Tensor& t : topo_order(outputs)) n += std::string(t.node()->op->name) == op;
  return n;
}

Tensor ramp(Shape shape, double scale) {
  Tensor t = Tensor::zeros(DType::f64, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<double>()[i] = scale * std::sin(double(i + 1));
  return t;
}

}  // namespace

TEST(CpuFusion, ALayerNormDxReadElsewhereKeepsItsOwnSum) {
  const Tensor x = ramp({3, 4}, 1.0), dy = ramp({3, 4}, 0.5), gamma = ramp({4}, 2.0), acc = ramp({3, 4}, 3.0);
  const Tensor flat = layer_norm_affine_back(x, dy, gamma);
  const Tensor dx = reshape(slice(flat, 0, 0, 12), {3, 4});
  // dx alone is an output: taking acc into the layer norm's kernel would change it.
  const std::vector<Tensor> fused = cpu::fuse({acc + dx, dx});
  EXPECT_EQ(count(fused, "layer_norm_affine_back_add"), 0);
  const std::vector<Tensor> got = eval(std::vector<Tensor>{acc + dx, dx});
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(got[0].item(i), acc.item(i) + got[1].item(i));
  }
  // As the sum's one reader, it is taken in, and the value is the same.
  const std::vector<Tensor> alone = cpu::fuse({acc + dx});
  EXPECT_EQ(count(alone, "layer_norm_affine_back_add"), 1);
  EXPECT_EQ(count(alone, "add"), 0);
  const Tensor sum = eval(acc + dx);
  for (int64_t i = 0; i < 12; ++i) EXPECT_NEAR(sum.item(i), got[0].item(i), 1e-14);
}

TEST(CpuFusion, UntouchedNodesStayTheSameNodes) {
  const Tensor a = ramp({4, 3}, 1.0), b = ramp({3, 5}, 1.0), c = ramp({4, 5}, 1.0);
  const Tensor plain = tanh(a) * 2.0;
  const Tensor summed = c + matmul(a, b);  // a 2-D product summed with c: accumulates onto it
  const std::vector<Tensor> out = cpu::fuse({plain, summed});
  EXPECT_TRUE(out[0].same(plain));
  EXPECT_FALSE(out[1].same(summed));
  EXPECT_EQ(count({out[1]}, "matmul_add"), 1);
  EXPECT_EQ(count({out[1]}, "matmul"), 0);
  {
    CompositeMode composite;  // nothing is fused
    EXPECT_TRUE(cpu::fuse({summed})[0].same(summed));
  }
  // The executor reads the original tensor through its replacement.
  Graph g({summed});
  Executor ex(g, {.threads = 1});
  ex.run();
  const std::vector<double> got = ex.read<double>(summed);
  const std::vector<double> want = eval(summed).to_vector<double>();
  EXPECT_EQ(got, want);
}
