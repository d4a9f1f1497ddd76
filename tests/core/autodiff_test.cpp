// Reverse-mode autodiff: accumulation, unused parameters, higher order.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "backend/cpu/fusion.h"
#include "backend/cpu/kernel.h"
#include "core/graph_internal.h"
#include "core/node.h"
#include "nabla/nabla.hpp"
#include "ops/elementwise.h"
#include "ops/internal_ops.h"

using namespace nabla;

TEST(Autodiff, GradientsOfAReusedTensorAccumulate) {
  Tensor x = Tensor::from_vector<double>({3}, {1, 2, 3}).requires_grad();
  Tensor loss = sum(x * x + x * 3.0 + exp(x));
  Tensor g = grad(loss, {x})[0];
  std::vector<double> got = eval(g).to_vector<double>();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], 2 * (i + 1) + 3 + std::exp(i + 1), 1e-12);
}

TEST(Autodiff, GraphBackwardFindsParameters) {
  Tensor w = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4}).requires_grad();
  Tensor unused = Tensor::from_vector<float>({2}, {1, 1}).requires_grad();
  Tensor x = Tensor::from_vector<float>({1, 2}, {1, 1});
  Tensor loss = sum(matmul(x, w));
  Graph g;
  g.backward(loss);
  ASSERT_EQ(g.parameters().size(), 1u);
  EXPECT_TRUE(g.parameters()[0].same(w));
  EXPECT_FALSE(g.has_grad(unused));
  EXPECT_THROW(g.grad(unused), UsageError);
  Executor ex(g, {.threads = 2});
  ex.run();
  EXPECT_EQ(ex.read<float>(g.grad(w)), (std::vector<float>{1, 1, 1, 1}));
  // A tensor asked for explicitly that does not reach the loss gets zeros.
  std::vector<Tensor> gs = grad(loss, {unused});
  EXPECT_EQ(eval(gs[0]).to_vector<float>(), (std::vector<float>{0, 0}));
}

TEST(Autodiff, LossMustBeAScalar) {
  Tensor w = Tensor::zeros(DType::f32, {3}).requires_grad();
  EXPECT_THROW(grad(w * 2.0, {w}), ShapeError);
  EXPECT_THROW(Tensor::zeros(DType::i32, {1}).requires_grad(), DTypeError);
  EXPECT_THROW((w * 2.0).requires_grad(), UsageError);
}

TEST(Autodiff, BackwardGraphCanBeDifferentiatedAgain) {
  // f(x) = sum(x^3): f' = 3x^2, and d/dx sum(f') = 6x.
  Tensor x = Tensor::from_vector<double>({3}, {0.5, -1, 2}).requires_grad();
  Tensor f = sum(x * x * x);
  Tensor df = grad(f, {x})[0];
  Tensor d2 = grad(sum(df), {x})[0];
  std::vector<double> got = eval(d2).to_vector<double>();
  EXPECT_NEAR(got[0], 3.0, 1e-12);
  EXPECT_NEAR(got[1], -6.0, 1e-12);
  EXPECT_NEAR(got[2], 12.0, 1e-12);
}

TEST(Autodiff, GradientsThroughViewsArriveWithAnyLayout) {
  // The loss reads x through a transpose, a strided slice and a broadcast:
  // each backward rule receives a non-contiguous gradient.
  auto f = [](const std::vector<Tensor>& in) {
    Tensor x = in[0];
    Tensor t = transpose(x);
    Tensor s = slice(t, 0, 0, 4, 2);
    Tensor b = expand(reshape(sum(s, {0}), {1, 3}), {5, 3});
    return tanh(contiguous(transpose(b)) * 2.0);
  };
  Tensor x = Tensor::zeros(DType::f64, {3, 4});
  for (int i = 0; i < 12; ++i) x.data_as<double>()[i] = std::sin(i + 1.0);
  GradcheckResult r = gradcheck(f, {x});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.checked, 12);
}

// An op with a deliberately wrong backward (d(x^2) taken as x dx): the
// checker must reject it, or a passing suite would mean nothing.

// The ops of the graph `outputs` need, as autodiff built it or as the CPU
// backend compiles it (its rewrite, src/backend/cpu/fusion.h).
namespace {
std::map<std::string, int> op_counts(const std::vector<nabla::Tensor>& outputs) {
  std::map<std::string, int> ops;
  for (const nabla::Tensor& t : nabla::topo_order(outputs)) ++ops[t.node()->op->name];
  return ops;
}
std::map<std::string, int> cpu_op_counts(const std::vector<nabla::Tensor>& outputs) {
  return op_counts(nabla::cpu::fuse(outputs));
}
}  // namespace
namespace {
struct Square {
  template <class T>
  T operator()(T x) const { return x * x; }
};
const OpDef op_bad_square{
    .name = "bad_square",
    .summary = "x^2 with a wrong backward, for this test",
    .inputs = {{"x", Diff::yes}},
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return ops::infer_unary("bad_square", in); },
    .backward = [](const BackwardArgs& g) -> Grads { return {g.dout * g.inputs[0]}; },
};
NABLA_CPU_KERNEL(op_bad_square, ops::unary_forward<Square>);
}  // namespace

TEST(Gradcheck, CatchesAWrongBackwardRule) {
  auto f = [](const std::vector<Tensor>& in) { return apply(op_bad_square, {in[0]}); };
  Tensor x = Tensor::from_vector<double>({3}, {0.5, 1.5, -2.0});
  GradcheckResult r = gradcheck(f, {x});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("f64 gradient of input 0"), std::string::npos) << r.message;
  EXPECT_GT(r.f64_max_error, 1.0);
}

// A fused op with no backward rule of its own differentiates through its
// composite, to any order.
namespace {
struct Softplus {
  template <class T>
  T operator()(T x) const { return std::log1p(std::exp(x)); }
};
const OpDef op_test_softplus{
    .name = "test_softplus",
    .summary = "log(1 + e^x), fused, for this test",
    .inputs = {{"x", Diff::yes}},
    .fused = true,
    .infer = [](const std::vector<Tensor>& in, const Attrs&) { return ops::infer_unary("test_softplus", in); },
    .composite = [](const std::vector<Tensor>& in, const Attrs&) { return log(exp(in[0]) + 1.0); },
};
NABLA_CPU_KERNEL(op_test_softplus, ops::unary_forward<Softplus>);
}  // namespace

TEST(Autodiff, FusedOpWithoutRuleDifferentiatesThroughItsComposite) {
  auto f = [](const std::vector<Tensor>& in) { return apply(op_test_softplus, {in[0]}) * in[1]; };
  Tensor x = Tensor::from_vector<double>({2, 3}, {0.5, -1, 2, 0.1, -0.3, 1.2});
  Tensor w = Tensor::from_vector<double>({3}, {1, -2, 0.5});
  GradcheckResult r = gradcheck(f, {x, w});
  EXPECT_TRUE(r.ok) << r.message;
  // Second order: d/dx sum(softplus'(x)) = sigmoid'(x).
  auto g = [](const std::vector<Tensor>& in) {
    Tensor y = sum(apply(op_test_softplus, {in[0]}));
    return grad(y, {in[0]})[0];
  };
  GradcheckResult r2 = gradcheck(g, {x});
  EXPECT_TRUE(r2.ok) << r2.message;
  // The fused node is replaced by primitives in composite mode.
  CompositeMode mode;
  EXPECT_STREQ(apply(op_test_softplus, {x}).op_name(), "log");
}

TEST(Autodiff, SliceAndRowGradientsAddIntoTheOtherContribution) {
  // A fused qkv weight read through three column slices and directly, and a
  // tied embedding read by get_rows and by a matmul through a transpose.
  Tensor idx = Tensor::from_vector<int32_t>({4}, {2, 0, 2, 1});
  auto f = [&](const std::vector<Tensor>& in) {
    const Tensor &w = in[0], &table = in[1], &x = in[2];
    Tensor q = slice(w, 1, 0, 2), k = slice(w, 1, 2, 4), v = slice(w, 1, 4, 6);
    Tensor h = matmul(x, q) * matmul(x, k) + tanh(matmul(x, v));    // [4, 2]
    Tensor logits = matmul(get_rows(table, idx) + h, transpose(table));  // [4, 5]
    return sum(tanh(logits)) + sum(square(w)) * 0.1;
  };
  std::vector<Tensor> in = {Tensor::zeros(DType::f64, {3, 6}), Tensor::zeros(DType::f64, {5, 2}),
                            Tensor::zeros(DType::f64, {4, 3})};
  for (size_t t = 0; t < in.size(); ++t)
    for (int64_t i = 0; i < in[t].numel(); ++i) in[t].data_as<double>()[i] = std::sin(double(7 * t + i + 1));
  GradcheckResult r = gradcheck(f, in);
  EXPECT_TRUE(r.ok) << r.message;

  // The slices' and the rows' contributions were added into the dense ones,
  // never built as full-size zeros and summed; the embedding's gradient
  // arrives contiguous (the head's part was computed transposed).
  // Autodiff sums plainly; the CPU backend's rewrite fuses.
  std::vector<Tensor> g = grad(f(in), {in[0], in[1]});
  EXPECT_EQ(op_counts(g)["add_slice"] + op_counts(g)["add_rows"], 0);
  EXPECT_EQ(op_counts(g)["scatter_slice"], 3);
  g = cpu::fuse(g);
  std::map<std::string, int> ops = op_counts(g);
  EXPECT_EQ(ops["add_slice"] + ops["scatter_slice"], 3);  // one scatter_slice if a slice's part came first
  EXPECT_LE(ops["scatter_slice"], 1);
  EXPECT_EQ(ops["add_rows"], 1);
  EXPECT_EQ(ops["scatter_add_rows"], 0);
  EXPECT_TRUE(g[1].is_contiguous());
}

TEST(Autodiff, SharedWeightGradientIsOneFoldedProduct) {
  // A patch embedding (conv_2d with stride = kernel, ViT's): the kernel is
  // shared by every image, so its gradient sums one product per image. It
  // comes as one product over the images folded into the contraction: no
  // batched product of the kernel's shape per image and no sum over them.
  auto f = [](const std::vector<Tensor>& in) { return sum(tanh(conv_2d(in[0], in[1], in[2], 2))); };
  std::vector<Tensor> in = {Tensor::zeros(DType::f64, {3, 2, 4, 4}), Tensor::zeros(DType::f64, {5, 2, 2, 2}),
                            Tensor::zeros(DType::f64, {5})};
  for (size_t t = 0; t < in.size(); ++t)
    for (int64_t i = 0; i < in[t].numel(); ++i) in[t].data_as<double>()[i] = std::sin(double(7 * t + i + 1));
  GradcheckResult r = gradcheck(f, in);
  EXPECT_TRUE(r.ok) << r.message;

  std::vector<Tensor> g = grad(f(in), {in[1]});
  int folded = 0;
  for (const Node* n : Graph(g).nodes()) {
    const std::string op = n->op->name;
    EXPECT_FALSE(op == "matmul" && n->shape == (Shape{3, 1, 5, 8})) << "a product per image of the kernel's shape";
    EXPECT_NE(op, "sum") << "a sum over the images";
    // [5, 8] <- [5, 3 * 4 patches] x [12, 8]
    if (op == "matmul" && n->shape == Shape{5, 8} && n->inputs[0].shape().back() == 12) ++folded;
  }
  EXPECT_EQ(folded, 1);
}

TEST(Autodiff, ProductGradientsAccumulateInTheProduct) {
  // Tokens [2, 3, 4] through three linear layers (q, k, v of one input, with
  // biases): the input's three gradient parts are matmuls; the later ones
  // accumulate onto the first (matmul_add), with no add of the input's size.
  auto f = [](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    auto linear = [&](int i) { return matmul_add(x, transpose(in[1 + 2 * i]), in[2 + 2 * i]); };
    return sum(linear(0) * linear(1) + tanh(linear(2)));
  };
  std::vector<Tensor> in = {Tensor::zeros(DType::f64, {2, 3, 4})};
  for (int i = 0; i < 3; ++i) {
    in.push_back(Tensor::zeros(DType::f64, {5, 4}));
    in.push_back(Tensor::zeros(DType::f64, {5}));
  }
  for (size_t t = 0; t < in.size(); ++t)
    for (int64_t i = 0; i < in[t].numel(); ++i) in[t].data_as<double>()[i] = std::sin(double(5 * t + i + 1));
  GradcheckResult r = gradcheck(f, in);
  EXPECT_TRUE(r.ok) << r.message;

  const std::vector<Tensor> g = grad(f(in), {in[0]});
  EXPECT_EQ(op_counts(g)["matmul_add"], 3) << "autodiff's sums are plain adds";
  for (const Tensor& t : topo_order(cpu::fuse(g))) {
    const Node* n = t.node();
    EXPECT_FALSE(std::string(n->op->name) == "add" && n->shape.size() >= 2 && numel(n->shape) == 24)
        << "an add of the input's size";
  }
  EXPECT_EQ(cpu_op_counts(g)["matmul_add"], 3 + 2);  // the forward's three layers, two accumulations
}

TEST(Autodiff, ResidualGradientIsAddedByTheLayerNormBackward) {
  // Two pre-norm residual blocks, x + tanh(layer_norm(x) W): the residual
  // sum's gradient reaches x before the layer norm's does, and the layer
  // norm's backward adds it as it writes dx (layer_norm_affine_back_add),
  // with no add of x's size.
  auto f = [](const std::vector<Tensor>& in) {
    Tensor x = in[0];
    for (int b = 0; b < 2; ++b) x = x + tanh(matmul(layer_norm(x, in[1 + 3 * b], in[2 + 3 * b], 1e-5), in[3 + 3 * b]));
    return sum(tanh(x));
  };
  std::vector<Tensor> in = {Tensor::zeros(DType::f64, {2, 3, 4})};
  for (int b = 0; b < 2; ++b) {
    in.push_back(Tensor::zeros(DType::f64, {4}));
    in.push_back(Tensor::zeros(DType::f64, {4}));
    in.push_back(Tensor::zeros(DType::f64, {4, 4}));
  }
  for (size_t t = 0; t < in.size(); ++t)
    for (int64_t i = 0; i < in[t].numel(); ++i) in[t].data_as<double>()[i] = std::sin(double(5 * t + i + 1));
  GradcheckResult r = gradcheck(f, in);
  EXPECT_TRUE(r.ok) << r.message;

  const std::vector<Tensor> g = grad(f(in), in);
  EXPECT_EQ(op_counts(g)["layer_norm_affine_back"], 2) << "autodiff builds each rule alone";
  std::map<std::string, int> ops;
  int adds = 0;
  for (const Tensor& t : topo_order(cpu::fuse(g))) {
    const Node* n = t.node();
    ++ops[n->op->name];
    adds += std::string(n->op->name) == "add" && numel(n->shape) == 24;
  }
  EXPECT_EQ(adds, 2) << "the forward's two residual sums, and no add of x's size in the backward";
  EXPECT_EQ(ops["layer_norm_affine_back_add"], 2);
  EXPECT_EQ(ops["layer_norm_affine_back"], 0);
}
