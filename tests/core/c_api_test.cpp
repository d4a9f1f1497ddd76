// The C API's boundary: user errors come back as status codes with nabla's
// messages, NULL and foreign arguments are refused, and the backward/compute
// state machine behaves sensibly when used out of order.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "backends.h"
#include "nabla.h"

namespace {

class CApi : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(nabla_context_create(&ctx), NABLA_OK); }
  void TearDown() override { nabla_context_free(ctx); }

  nabla_tensor* leaf(std::vector<int64_t> shape, std::vector<float> values = {},
                     bool parameter = false) {
    nabla_tensor* t = nullptr;
    auto make = parameter ? nabla_parameter : nabla_tensor_from_data;
    EXPECT_EQ(make(ctx, NABLA_F32, static_cast<int>(shape.size()), shape.data(),
                   values.empty() ? nullptr : values.data(), &t),
              NABLA_OK)
        << nabla_last_error();
    return t;
  }
  std::vector<float> read(nabla_tensor* t) {
    int64_t n = 0;
    EXPECT_EQ(nabla_tensor_numel(t, &n), NABLA_OK);
    std::vector<float> out(static_cast<size_t>(n));
    EXPECT_EQ(nabla_tensor_read(ctx, t, out.data(), out.size() * sizeof(float)), NABLA_OK)
        << nabla_last_error();
    return out;
  }
  void compute(std::vector<nabla_tensor*> outputs) {
    ASSERT_EQ(nabla_compute(ctx, outputs.data(), outputs.size(), 1), NABLA_OK)
        << nabla_last_error();
  }
  std::string error() const { return nabla_last_error(); }

  nabla_context* ctx = nullptr;
};

TEST_F(CApi, AddOfShapesThatDoNotBroadcast) {
  nabla_tensor* out = nullptr;
  EXPECT_EQ(nabla_add(ctx, leaf({3, 4}), leaf({5}), &out), NABLA_ERROR_SHAPE);
  EXPECT_EQ(error(), "add: shapes do not broadcast: [3, 4] and [5]");
  EXPECT_EQ(out, nullptr);
}

TEST_F(CApi, MatmulInnerDimensionMismatch) {
  nabla_tensor* out = nullptr;
  EXPECT_EQ(nabla_matmul(ctx, leaf({4, 5}), leaf({6, 3}), &out), NABLA_ERROR_SHAPE);
  EXPECT_EQ(error(), "matmul: inner dimensions differ: a is [4, 5], b is [6, 3]");
  EXPECT_EQ(out, nullptr);
}

TEST_F(CApi, ReshapeToWrongElementCount) {
  nabla_tensor* out = nullptr;
  int64_t shape[2] = {5, 5};
  EXPECT_EQ(nabla_reshape(ctx, leaf({4, 6}), 2, shape, &out), NABLA_ERROR_SHAPE);
  EXPECT_EQ(error().rfind("reshape: [4, 6] has 24", 0), 0u) << error();
}

TEST_F(CApi, ConcatMismatchAndEmpty) {
  nabla_tensor* out = nullptr;
  nabla_tensor* xs[2] = {leaf({2, 3}), leaf({2, 4})};
  EXPECT_EQ(nabla_concat(ctx, xs, 2, 0, &out), NABLA_ERROR_SHAPE);
  EXPECT_EQ(error(), "concat: input 1 is [2, 4], expected [2, 3] except along axis 0");
  EXPECT_EQ(nabla_concat(ctx, xs, 2, 5, &out), NABLA_ERROR_SHAPE);
  EXPECT_NE(error().find("concat: axis 5 is out of range"), std::string::npos) << error();
  EXPECT_EQ(nabla_concat(ctx, nullptr, 0, 0, &out), NABLA_ERROR_SHAPE);
  EXPECT_EQ(error(), "concat: needs at least one tensor");
  EXPECT_EQ(out, nullptr);
  // Joined along the axis where they differ, the same inputs are fine.
  ASSERT_EQ(nabla_concat(ctx, xs, 2, 1, &out), NABLA_OK) << error();
  int64_t dims[2] = {};
  ASSERT_EQ(nabla_tensor_shape(out, dims, 2), NABLA_OK);
  EXPECT_EQ(dims[0], 2);
  EXPECT_EQ(dims[1], 7);
}

TEST_F(CApi, DTypeErrors) {
  nabla_tensor* out = nullptr;
  int64_t shape[1] = {2};
  nabla_tensor* d = nullptr;
  ASSERT_EQ(nabla_tensor_from_data(ctx, NABLA_F64, 1, shape, nullptr, &d), NABLA_OK);
  EXPECT_EQ(nabla_add(ctx, leaf({2}), d, &out), NABLA_ERROR_DTYPE);
  EXPECT_NE(error().find("add"), std::string::npos) << error();
  EXPECT_EQ(nabla_tensor_from_data(ctx, static_cast<nabla_dtype>(7), 1, shape, nullptr, &out),
            NABLA_ERROR_DTYPE);
  EXPECT_NE(error().find("unknown dtype 7"), std::string::npos) << error();
  EXPECT_EQ(nabla_parameter(ctx, NABLA_I32, 1, shape, nullptr, &out), NABLA_ERROR_DTYPE);
  EXPECT_EQ(out, nullptr);
}

TEST_F(CApi, NullArgumentsNameTheFunctionAndArgument) {
  nabla_tensor* a = leaf({2});
  nabla_tensor* out = nullptr;
  EXPECT_EQ(nabla_add(nullptr, a, a, &out), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(error(), "nabla_add: argument 'ctx' is NULL");
  EXPECT_EQ(nabla_add(ctx, a, nullptr, &out), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(error(), "nabla_add: argument 'b' is NULL");
  EXPECT_EQ(nabla_get_rows(ctx, a, nullptr, &out), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(error(), "nabla_get_rows: argument 'indices' is NULL");
  EXPECT_EQ(nabla_exp(ctx, a, nullptr), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(error(), "nabla_exp: argument 'out' is NULL");
  EXPECT_EQ(nabla_sum(ctx, a, nullptr, 1, 0, &out), NABLA_ERROR_ARGUMENT);
  EXPECT_NE(error().find("'axes' is NULL"), std::string::npos) << error();
  EXPECT_EQ(nabla_reshape(ctx, a, -1, nullptr, &out), NABLA_ERROR_ARGUMENT);
  nabla_tensor* xs[2] = {a, nullptr};
  EXPECT_EQ(nabla_concat(ctx, xs, 2, 0, &out), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(error(), "nabla_concat: argument 'xs[1]' is NULL");
  EXPECT_EQ(nabla_backward(ctx, nullptr), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(nabla_compute(ctx, nullptr, 2, 1), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(nabla_tensor_write(ctx, a, nullptr, 8), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(nabla_tensor_read(ctx, nullptr, nullptr, 0), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(nabla_tensor_rank(nullptr, nullptr), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(nabla_context_create(nullptr), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  nabla_context_free(nullptr);
}

TEST_F(CApi, TensorOfAnotherContextIsRefused) {
  nabla_context* other = nullptr;
  ASSERT_EQ(nabla_context_create(&other), NABLA_OK);
  int64_t shape[1] = {2};
  nabla_tensor* foreign = nullptr;
  ASSERT_EQ(nabla_tensor_from_data(other, NABLA_F32, 1, shape, nullptr, &foreign), NABLA_OK);
  nabla_tensor* out = nullptr;
  EXPECT_EQ(nabla_add(ctx, leaf({2}), foreign, &out), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(error(), "nabla_add: tensor 'b' belongs to another context");
  nabla_context_free(other);
}

TEST_F(CApi, ShapeQueries) {
  nabla_tensor* t = leaf({2, 3, 4});
  int rank = 0;
  int64_t numel = 0, dims[3] = {};
  nabla_dtype dtype = NABLA_I32;
  ASSERT_EQ(nabla_tensor_rank(t, &rank), NABLA_OK);
  ASSERT_EQ(nabla_tensor_numel(t, &numel), NABLA_OK);
  ASSERT_EQ(nabla_tensor_dtype(t, &dtype), NABLA_OK);
  ASSERT_EQ(nabla_tensor_shape(t, dims, 3), NABLA_OK);
  EXPECT_EQ(rank, 3);
  EXPECT_EQ(numel, 24);
  EXPECT_EQ(dtype, NABLA_F32);
  EXPECT_EQ(dims[2], 4);
  EXPECT_EQ(nabla_tensor_shape(t, dims, 2), NABLA_ERROR_ARGUMENT);
  EXPECT_NE(error().find("capacity 2 is less than the rank 3"), std::string::npos) << error();
}

TEST_F(CApi, OpsPassTheirAttributes) {
  nabla_tensor* x = leaf({2, 3}, {1, 2, 3, 4, 5, 6});
  nabla_tensor *sum = nullptr, *t = nullptr, *s = nullptr, *mx = nullptr, *rows = nullptr,
               *sc = nullptr;
  int64_t axes[1] = {1};
  ASSERT_EQ(nabla_sum(ctx, x, axes, 1, 1, &sum), NABLA_OK);    // [2, 1]
  ASSERT_EQ(nabla_transpose(ctx, x, 0, 1, &t), NABLA_OK);      // [3, 2]
  ASSERT_EQ(nabla_slice(ctx, x, 1, 0, 3, 2, &s), NABLA_OK);    // [2, 2]
  ASSERT_EQ(nabla_max(ctx, x, nullptr, 0, 0, &mx), NABLA_OK);  // []
  ASSERT_EQ(nabla_scale(ctx, x, -2.0, &sc), NABLA_OK);         // [2, 3]
  int64_t ishape[1] = {3};
  int32_t idx[3] = {1, 0, 1};
  nabla_tensor* indices = nullptr;
  ASSERT_EQ(nabla_tensor_from_data(ctx, NABLA_I32, 1, ishape, idx, &indices), NABLA_OK);
  ASSERT_EQ(nabla_get_rows(ctx, x, indices, &rows), NABLA_OK);  // [3, 3]
  compute({sum, t, s, mx, rows, sc});
  EXPECT_EQ(read(sum), (std::vector<float>{6, 15}));
  EXPECT_EQ(read(t), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(read(s), (std::vector<float>{1, 3, 4, 6}));
  EXPECT_EQ(read(mx), (std::vector<float>{6}));
  EXPECT_EQ(read(rows), (std::vector<float>{4, 5, 6, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(read(sc), (std::vector<float>{-2, -4, -6, -8, -10, -12}));
}

// A linear layer through the C API: x w + bias in one op, its value and the
// bias's gradient (the rows summed), and a bias that does not fit.
TEST_F(CApi, MatmulAddIsALinearLayer) {
  nabla_tensor* x = leaf({2, 3}, {1, 2, 3, 4, 5, 6});
  nabla_tensor* w = leaf({3, 2}, {1, 0, 0, 1, 1, 1});
  nabla_tensor* bias = leaf({2}, {10, 20}, /*parameter=*/true);
  nabla_tensor *y = nullptr, *loss = nullptr, *gb = nullptr;
  ASSERT_EQ(nabla_matmul_add(ctx, x, w, bias, &y), NABLA_OK) << error();
  ASSERT_EQ(nabla_sum(ctx, y, nullptr, 0, 0, &loss), NABLA_OK);
  ASSERT_EQ(nabla_backward(ctx, loss), NABLA_OK) << error();
  ASSERT_EQ(nabla_grad(ctx, bias, &gb), NABLA_OK) << error();
  compute({y, gb});
  EXPECT_EQ(read(y), (std::vector<float>{14, 25, 20, 31}));
  EXPECT_EQ(read(gb), (std::vector<float>{2, 2}));
  nabla_tensor* out = nullptr;
  EXPECT_EQ(nabla_matmul_add(ctx, x, w, leaf({3}), &out), NABLA_ERROR_SHAPE);
  EXPECT_EQ(error(), "matmul_add: shapes do not broadcast: [3] and [2, 2]");
  EXPECT_EQ(out, nullptr);
}

TEST_F(CApi, ReadBeforeComputeAndGradBeforeBackward) {
  nabla_tensor* w = leaf({3}, {1, 2, 3}, true);
  nabla_tensor *sq = nullptr, *loss = nullptr, *dw = nullptr;
  ASSERT_EQ(nabla_square(ctx, w, &sq), NABLA_OK);
  ASSERT_EQ(nabla_sum(ctx, sq, nullptr, 0, 0, &loss), NABLA_OK);
  EXPECT_EQ(nabla_grad(ctx, w, &dw), NABLA_ERROR_USAGE);
  EXPECT_NE(error().find("nabla_backward"), std::string::npos) << error();
  ASSERT_EQ(nabla_backward(ctx, loss), NABLA_OK) << error();
  ASSERT_EQ(nabla_grad(ctx, w, &dw), NABLA_OK) << error();
  float buf[3];
  EXPECT_EQ(nabla_tensor_read(ctx, dw, buf, sizeof buf), NABLA_ERROR_USAGE);
  EXPECT_NE(error().find("call nabla_compute first"), std::string::npos) << error();
  // Leaves have a value without any compute.
  EXPECT_EQ(read(w), (std::vector<float>{1, 2, 3}));
  compute({});
  EXPECT_EQ(read(dw), (std::vector<float>{2, 4, 6}));
  EXPECT_EQ(read(loss), (std::vector<float>{14}));
  // An intermediate that is not an output has no value to read.
  EXPECT_EQ(nabla_tensor_read(ctx, sq, buf, sizeof buf), NABLA_ERROR_USAGE);
  EXPECT_EQ(nabla_tensor_read(ctx, dw, buf, 4), NABLA_ERROR_SHAPE);
}

TEST_F(CApi, GradOfANonParameterOrUnreachedParameter) {
  nabla_tensor* w = leaf({2}, {1, 2}, true);
  nabla_tensor* unused = leaf({2}, {}, true);
  nabla_tensor* x = leaf({2});
  nabla_tensor *loss = nullptr, *g = nullptr;
  ASSERT_EQ(nabla_sum(ctx, w, nullptr, 0, 0, &loss), NABLA_OK);
  ASSERT_EQ(nabla_backward(ctx, loss), NABLA_OK);
  EXPECT_EQ(nabla_grad(ctx, x, &g), NABLA_ERROR_USAGE);
  EXPECT_NE(error().find("not a parameter"), std::string::npos) << error();
  EXPECT_EQ(nabla_grad(ctx, unused, &g), NABLA_ERROR_USAGE);
  EXPECT_NE(error().find("does not reach the loss"), std::string::npos) << error();
  // A loss with more than one element is refused.
  EXPECT_EQ(nabla_backward(ctx, w), NABLA_ERROR_SHAPE);
  EXPECT_NE(error().find("backward: the loss must have one element"), std::string::npos) << error();
}

TEST_F(CApi, ComputeWithNoOutputs) {
  EXPECT_EQ(nabla_compute(ctx, nullptr, 0, 1), NABLA_ERROR_USAGE);
  EXPECT_NE(error().find("nothing to compute"), std::string::npos) << error();
}

TEST_F(CApi, BackwardTwiceReplacesTheGradients) {
  nabla_tensor* w = leaf({2}, {1, 3}, true);
  nabla_tensor *sq = nullptr, *loss = nullptr, *loss2 = nullptr, *g1 = nullptr, *g2 = nullptr,
               *g3 = nullptr;
  ASSERT_EQ(nabla_square(ctx, w, &sq), NABLA_OK);
  ASSERT_EQ(nabla_sum(ctx, sq, nullptr, 0, 0, &loss), NABLA_OK);  // sum w^2
  ASSERT_EQ(nabla_backward(ctx, loss), NABLA_OK);
  ASSERT_EQ(nabla_grad(ctx, w, &g1), NABLA_OK);
  compute({});
  EXPECT_EQ(read(g1), (std::vector<float>{2, 6}));
  // The same loss again: gradients are rebuilt, not accumulated.
  ASSERT_EQ(nabla_backward(ctx, loss), NABLA_OK);
  ASSERT_EQ(nabla_grad(ctx, w, &g2), NABLA_OK);
  compute({});
  EXPECT_EQ(read(g2), (std::vector<float>{2, 6}));
  // A new loss replaces the old one.
  ASSERT_EQ(nabla_sum(ctx, w, nullptr, 0, 0, &loss2), NABLA_OK);  // sum w
  ASSERT_EQ(nabla_backward(ctx, loss2), NABLA_OK);
  ASSERT_EQ(nabla_grad(ctx, w, &g3), NABLA_OK);
  compute({});
  EXPECT_EQ(read(g3), (std::vector<float>{1, 1}));
}

TEST_F(CApi, SecondOrderGradient) {
  // loss = sum(w^3), dloss/dw = 3 w^2; loss2 = sum(3 w^2), dloss2/dw = 6 w.
  nabla_tensor* w = leaf({3}, {1, -2, 0.5f}, true);
  nabla_tensor *sq = nullptr, *cube = nullptr, *loss = nullptr, *dw = nullptr, *loss2 = nullptr,
               *ddw = nullptr;
  ASSERT_EQ(nabla_mul(ctx, w, w, &sq), NABLA_OK);
  ASSERT_EQ(nabla_mul(ctx, sq, w, &cube), NABLA_OK);
  ASSERT_EQ(nabla_sum(ctx, cube, nullptr, 0, 0, &loss), NABLA_OK);
  ASSERT_EQ(nabla_backward(ctx, loss), NABLA_OK);
  ASSERT_EQ(nabla_grad(ctx, w, &dw), NABLA_OK);
  ASSERT_EQ(nabla_sum(ctx, dw, nullptr, 0, 0, &loss2), NABLA_OK);
  ASSERT_EQ(nabla_backward(ctx, loss2), NABLA_OK) << error();
  ASSERT_EQ(nabla_grad(ctx, w, &ddw), NABLA_OK);
  compute({dw});
  EXPECT_EQ(read(dw), (std::vector<float>{3, 12, 0.75f}));
  EXPECT_EQ(read(ddw), (std::vector<float>{6, -12, 3}));
}

TEST_F(CApi, ComputeAgainSeesRewrittenLeaves) {
  nabla_tensor* x = leaf({2}, {1, 2});
  nabla_tensor* w = leaf({2}, {3, 4}, true);
  nabla_tensor *prod = nullptr, *loss = nullptr, *dw = nullptr, *other = nullptr;
  ASSERT_EQ(nabla_mul(ctx, x, w, &prod), NABLA_OK);
  ASSERT_EQ(nabla_sum(ctx, prod, nullptr, 0, 0, &loss), NABLA_OK);
  ASSERT_EQ(nabla_backward(ctx, loss), NABLA_OK);
  ASSERT_EQ(nabla_grad(ctx, w, &dw), NABLA_OK);
  compute({prod});
  EXPECT_EQ(read(loss), (std::vector<float>{11}));
  float nx[2] = {-1, 5}, nw[2] = {2, 2};
  ASSERT_EQ(nabla_tensor_write(ctx, x, nx, sizeof nx), NABLA_OK);
  ASSERT_EQ(nabla_tensor_write(ctx, w, nw, sizeof nw), NABLA_OK);
  compute({prod});
  EXPECT_EQ(read(prod), (std::vector<float>{-2, 10}));
  EXPECT_EQ(read(loss), (std::vector<float>{8}));
  EXPECT_EQ(read(dw), (std::vector<float>{-1, 5}));
  // A different output set compiles a new plan.
  ASSERT_EQ(nabla_exp(ctx, x, &other), NABLA_OK);
  compute({other});
  EXPECT_FLOAT_EQ(read(other)[0], std::exp(-1.0f));
  EXPECT_EQ(read(dw), (std::vector<float>{-1, 5}));
  // Writes are checked against the leaf's size, and only leaves take them.
  EXPECT_EQ(nabla_tensor_write(ctx, x, nx, 4), NABLA_ERROR_SHAPE);
  EXPECT_EQ(nabla_tensor_write(ctx, prod, nx, sizeof nx), NABLA_ERROR_USAGE);
}

TEST_F(CApi, ComputesOnEveryBackend) {
  nabla_tensor* x = leaf({2}, {1, 2});
  nabla_tensor* w = leaf({2}, {3, 4}, true);
  nabla_tensor *prod = nullptr, *loss = nullptr, *dw = nullptr;
  ASSERT_EQ(nabla_mul(ctx, x, w, &prod), NABLA_OK);
  ASSERT_EQ(nabla_exp(ctx, prod, &prod), NABLA_OK);
  ASSERT_EQ(nabla_sum(ctx, prod, nullptr, 0, 0, &loss), NABLA_OK);
  ASSERT_EQ(nabla_backward(ctx, loss), NABLA_OK);
  ASSERT_EQ(nabla_grad(ctx, w, &dw), NABLA_OK);
  compute({prod});
  const std::vector<float> cpu = read(dw);
  EXPECT_EQ(nabla_context_set_backend(ctx, "nosuch"), NABLA_ERROR_USAGE);
  EXPECT_NE(error().find("cpu, reference"), std::string::npos) << error();
  for (const std::string& backend : nabla::testing_backends::device_backends()) {
    ASSERT_EQ(nabla_context_set_backend(ctx, backend.c_str()), NABLA_OK);
    float ones[2] = {1, 2};
    ASSERT_EQ(nabla_tensor_write(ctx, x, ones, sizeof ones), NABLA_OK);
    compute({prod});
    const std::vector<float> other = read(dw);
    for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(other[i], cpu[i], 1e-6 * std::abs(cpu[i])) << backend;
    // Leaves stay the caller's host memory, copied in at every compute.
    float nx[2] = {0, 0};
    ASSERT_EQ(nabla_tensor_write(ctx, x, nx, sizeof nx), NABLA_OK);
    compute({prod});
    EXPECT_EQ(read(dw), (std::vector<float>{0, 0})) << backend;
  }
}

// A backend without a GPU says why, through the C API too.
TEST_F(CApi, CudaRunsOrSaysWhyNot) {
  nabla_tensor* x = leaf({2}, {1, 2});
  nabla_tensor* y = nullptr;
  ASSERT_EQ(nabla_exp(ctx, x, &y), NABLA_OK);
  const nabla_status s = nabla_context_set_backend(ctx, "cuda");
  if (s == NABLA_OK) {
    EXPECT_EQ(nabla_compute(ctx, &y, 1, 1), NABLA_OK);  // a GPU is here
    return;
  }
  EXPECT_EQ(s, NABLA_ERROR_USAGE);
  // No GPU, or a build without the cuda backend.
  const std::string why = error();
  EXPECT_TRUE(why.find("cuda: no CUDA device") != std::string::npos || why.find("no backend named 'cuda'") != std::string::npos)
      << why;
  EXPECT_EQ(nabla_compute(ctx, &y, 1, 1), NABLA_OK);  // still on the CPU
}

TEST_F(CApi, RunTimeErrorLeavesTheContextUsable) {
  nabla_tensor* table = leaf({2, 2}, {1, 2, 3, 4});
  int64_t ishape[1] = {2};
  int32_t idx[2] = {0, 1};
  nabla_tensor *indices = nullptr, *rows = nullptr;
  ASSERT_EQ(nabla_tensor_from_data(ctx, NABLA_I32, 1, ishape, idx, &indices), NABLA_OK);
  ASSERT_EQ(nabla_get_rows(ctx, table, indices, &rows), NABLA_OK);
  // A GPU finds the bad index on the device and says so, in the CPU's words.
  for (const std::string& backend : nabla::testing_backends::all_backends()) {
    ASSERT_EQ(nabla_context_set_backend(ctx, backend.c_str()), NABLA_OK);
    compute({rows});
    int32_t bad[2] = {0, 7};
    ASSERT_EQ(nabla_tensor_write(ctx, indices, bad, sizeof bad), NABLA_OK);
    EXPECT_EQ(nabla_compute(ctx, &rows, 1, 1), NABLA_ERROR_SHAPE) << backend;
    EXPECT_EQ(error(), "get_rows: index 7 at position 1 is out of range for 2 rows") << backend;
    float buf[4];
    EXPECT_EQ(nabla_tensor_read(ctx, rows, buf, sizeof buf), NABLA_ERROR_USAGE) << backend;
    ASSERT_EQ(nabla_tensor_write(ctx, indices, idx, sizeof idx), NABLA_OK);
    compute({rows});
    EXPECT_EQ(read(rows), (std::vector<float>{1, 2, 3, 4})) << backend;
  }
}

TEST_F(CApi, LastErrorIsPerThread) {
  nabla_tensor* out = nullptr;
  EXPECT_EQ(nabla_matmul(ctx, leaf({4, 5}), leaf({6, 3}), &out), NABLA_ERROR_SHAPE);
  std::string other;
  std::thread([&] {
    other = nabla_last_error();
    nabla_context_create(nullptr);
  }).join();
  EXPECT_EQ(other, "");
  EXPECT_EQ(error(), "matmul: inner dimensions differ: a is [4, 5], b is [6, 3]");
  EXPECT_STREQ(nabla_status_string(NABLA_ERROR_SHAPE), "NABLA_ERROR_SHAPE");
  EXPECT_STREQ(nabla_status_string(static_cast<nabla_status>(99)), "NABLA_UNKNOWN_STATUS");
}

// Found by fuzz_c_api_graph: an elementwise op over a tensor with a zero
// extent (here [1, 0, 0, 0]) divided by that extent looking for the first
// element (SIGFPE). Empty tensors run through ops, a backward and a read of
// zero bytes.
TEST_F(CApi, EmptyTensorsRunThroughOpsAndBackward) {
  nabla_tensor* x = leaf({1, 0, 0, 0}, {}, true);
  nabla_tensor *d = nullptr, *e = nullptr, *loss = nullptr, *grad = nullptr;
  ASSERT_EQ(nabla_sub(ctx, x, x, &d), NABLA_OK);
  ASSERT_EQ(nabla_mul(ctx, d, x, &e), NABLA_OK);
  ASSERT_EQ(nabla_sum(ctx, e, nullptr, 0, 0, &loss), NABLA_OK);
  ASSERT_EQ(nabla_backward(ctx, loss), NABLA_OK) << error();
  ASSERT_EQ(nabla_grad(ctx, x, &grad), NABLA_OK) << error();
  compute({e});
  EXPECT_EQ(read(e), std::vector<float>{});
  EXPECT_EQ(read(grad), std::vector<float>{});
  EXPECT_EQ(read(loss), std::vector<float>{0.0f});
}

// Gradient checkpointing through the C API: regions of tanh(x W) layers
// marked with nabla_recompute_begin/end give the same loss and gradients in
// a smaller arena; a mark not taken yet, or no output, is refused.
TEST_F(CApi, RecomputeRegionsKeepValuesInLessMemory) {
  const int64_t rows = 64, width = 32, layers = 6;
  std::vector<float> xv(size_t(rows * width)), wv(size_t(width * width));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(std::sin(0.37 * double(i)));
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = float(std::cos(0.11 * double(i))) / float(width);
  std::vector<float> results[2];
  int64_t arena[2] = {};
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    nabla_tensor* x = leaf({rows, width}, xv);
    std::vector<nabla_tensor*> weights;
    for (int64_t l = 0; l < layers; ++l) {
      weights.push_back(leaf({width, width}, wv, /*parameter=*/true));
      uint64_t mark = 0;
      if (checkpointed) {
        ASSERT_EQ(nabla_recompute_begin(ctx, &mark), NABLA_OK) << error();
      }
      nabla_tensor *product = nullptr, *y = nullptr;
      ASSERT_EQ(nabla_matmul(ctx, x, weights.back(), &product), NABLA_OK) << error();
      ASSERT_EQ(nabla_tanh(ctx, product, &y), NABLA_OK) << error();
      ASSERT_EQ(nabla_exp(ctx, y, &x), NABLA_OK) << error();
      if (checkpointed) {
        ASSERT_EQ(nabla_recompute_end(ctx, mark, x), NABLA_OK) << error();
      }
    }
    nabla_tensor* loss = nullptr;
    ASSERT_EQ(nabla_sum(ctx, x, nullptr, 0, 0, &loss), NABLA_OK) << error();
    ASSERT_EQ(nabla_backward(ctx, loss), NABLA_OK) << error();
    std::vector<nabla_tensor*> grads;
    for (nabla_tensor* w : weights) {
      grads.push_back(nullptr);
      ASSERT_EQ(nabla_grad(ctx, w, &grads.back()), NABLA_OK) << error();
    }
    compute({loss});
    ASSERT_EQ(nabla_compute_arena_bytes(ctx, &arena[checkpointed]), NABLA_OK) << error();
    results[checkpointed] = read(loss);
    for (nabla_tensor* g : grads) {
      const std::vector<float> v = read(g);
      results[checkpointed].insert(results[checkpointed].end(), v.begin(), v.end());
    }
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i) {
    EXPECT_NEAR(results[1][i], results[0][i], 1e-5 * std::max(1.0f, std::abs(results[0][i]))) << i;
  }
  EXPECT_LT(arena[1], arena[0] * 3 / 4) << "checkpointed " << arena[1] << " bytes, kept " << arena[0];

  nabla_tensor* y = leaf({2});
  uint64_t mark = 0;
  ASSERT_EQ(nabla_recompute_begin(ctx, &mark), NABLA_OK);
  EXPECT_EQ(nabla_recompute_end(ctx, mark + 1000000, y), NABLA_ERROR_USAGE);
  EXPECT_NE(error().find("not taken yet"), std::string::npos) << error();
  EXPECT_EQ(nabla_recompute_end(ctx, mark, nullptr), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(nabla_recompute_begin(ctx, nullptr), NABLA_ERROR_ARGUMENT);
  nabla_context* fresh = nullptr;
  ASSERT_EQ(nabla_context_create(&fresh), NABLA_OK);
  int64_t bytes = 0;
  EXPECT_EQ(nabla_compute_arena_bytes(fresh, &bytes), NABLA_ERROR_USAGE);
  nabla_context_free(fresh);
}

}  // namespace
