/* Trains a 2-layer MLP through the C API, as an FFI user would: parameters
 * are leaves, gradients are read out after each compute, SGD runs on the
 * host, and the new weights are written back into the same leaves, so every
 * step reuses the compiled plan. Also checks that user errors come back as
 * status codes instead of aborting.
 *
 * Dimensions: N samples, D inputs, H hidden units.
 *   x [N, D], y [N, 1]
 *   w1 [D, H], b1 [H], w2 [H, 1], b2 [1]
 *   pred = tanh(x w1 + b1) w2 + b2;  loss = mean((pred - y)^2)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { N = 64, D = 2, H = 16, STEPS = 200 };


static void check_errors(void) {
  nabla_context* ctx = NULL;
  OK(nabla_context_create(&ctx));
  int64_t sa[2] = {4, 5}, sb[2] = {6, 3};
  nabla_tensor *a = NULL, *b = NULL, *out = NULL;
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 2, sa, NULL, &a));
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 2, sb, NULL, &b));

  /* A shape error carries nabla's message and leaves `out` untouched. */
  CHECK(nabla_matmul(ctx, a, b, &out) == NABLA_ERROR_SHAPE);
  CHECK(strstr(nabla_last_error(), "matmul") != NULL);
  CHECK(strstr(nabla_last_error(), "a is [4, 5], b is [6, 3]") != NULL);
  CHECK(out == NULL);
  printf("shape error: %s\n", nabla_last_error());

  /* NULL arguments name the function and the argument. */
  CHECK(nabla_matmul(NULL, a, b, &out) == NABLA_ERROR_ARGUMENT);
  CHECK(strstr(nabla_last_error(), "nabla_matmul") != NULL);
  CHECK(strstr(nabla_last_error(), "ctx") != NULL);
  CHECK(nabla_matmul(ctx, a, NULL, &out) == NABLA_ERROR_ARGUMENT);
  CHECK(strstr(nabla_last_error(), "'b'") != NULL);
  CHECK(nabla_matmul(ctx, a, b, NULL) == NABLA_ERROR_ARGUMENT);
  CHECK(nabla_tanh(ctx, NULL, &out) == NABLA_ERROR_ARGUMENT);
  CHECK(nabla_context_create(NULL) == NABLA_ERROR_ARGUMENT);
  CHECK(nabla_tensor_from_data(ctx, NABLA_F32, 2, NULL, NULL, &out) == NABLA_ERROR_ARGUMENT);
  CHECK(nabla_compute(ctx, NULL, 1, 1) == NABLA_ERROR_ARGUMENT);
  CHECK(nabla_tensor_read(ctx, a, NULL, 80) == NABLA_ERROR_ARGUMENT);
  CHECK(out == NULL);
  printf("argument error: %s\n", nabla_last_error());

  /* The context still works after errors. */
  int64_t st[2] = {5, 4};
  OK(nabla_reshape(ctx, a, 2, st, &out));
  int rank = 0;
  int64_t dims[2] = {0, 0};
  OK(nabla_tensor_rank(out, &rank));
  OK(nabla_tensor_shape(out, dims, 2));
  CHECK(rank == 2 && dims[0] == 5 && dims[1] == 4);

  nabla_context_free(ctx);
  nabla_context_free(NULL);
}

static float run_training(void) {
  /* y = sin(2 x0) + 0.5 x0 x1: smooth and nonlinear, easy for 16 tanh units. */
  static float x[N * D], y[N];
  for (int i = 0; i < N; ++i) {
    x[i * D + 0] = uniform(-1.5f, 1.5f);
    x[i * D + 1] = uniform(-1.5f, 1.5f);
    y[i] = sinf(2.0f * x[i * D + 0]) + 0.5f * x[i * D + 0] * x[i * D + 1];
  }
  static float w1[D * H], b1[H], w2[H], b2[1];
  for (int i = 0; i < D * H; ++i) w1[i] = uniform(-1.0f, 1.0f);
  for (int i = 0; i < H; ++i) b1[i] = uniform(-0.5f, 0.5f);
  for (int i = 0; i < H; ++i) w2[i] = uniform(-0.5f, 0.5f);
  b2[0] = 0.0f;

  nabla_context* ctx = NULL;
  OK(nabla_context_create(&ctx));
  int64_t sx[2] = {N, D}, sy[2] = {N, 1}, sw1[2] = {D, H}, sb1[1] = {H}, sw2[2] = {H, 1},
          sb2[1] = {1};
  nabla_tensor *tx, *ty, *tw1, *tb1, *tw2, *tb2;
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 2, sx, x, &tx));
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 2, sy, y, &ty));
  OK(nabla_parameter(ctx, NABLA_F32, 2, sw1, w1, &tw1));
  OK(nabla_parameter(ctx, NABLA_F32, 1, sb1, b1, &tb1));
  OK(nabla_parameter(ctx, NABLA_F32, 2, sw2, w2, &tw2));
  OK(nabla_parameter(ctx, NABLA_F32, 1, sb2, b2, &tb2));

  nabla_tensor *z1, *a1, *h1, *z2, *pred, *diff, *sq, *loss;
  OK(nabla_matmul(ctx, tx, tw1, &z1));        /* [N, H] */
  OK(nabla_add(ctx, z1, tb1, &a1));           /* [N, H] */
  OK(nabla_tanh(ctx, a1, &h1));               /* [N, H] */
  OK(nabla_matmul(ctx, h1, tw2, &z2));        /* [N, 1] */
  OK(nabla_add(ctx, z2, tb2, &pred));         /* [N, 1] */
  OK(nabla_sub(ctx, pred, ty, &diff));        /* [N, 1] */
  OK(nabla_square(ctx, diff, &sq));           /* [N, 1] */
  OK(nabla_mean(ctx, sq, NULL, 0, 0, &loss)); /* [] */
  OK(nabla_backward(ctx, loss));

  nabla_tensor* params[4] = {tw1, tb1, tw2, tb2};
  float* values[4] = {w1, b1, w2, b2};
  size_t counts[4] = {D * H, H, H, 1};
  nabla_tensor* grads[4];
  for (int p = 0; p < 4; ++p) OK(nabla_grad(ctx, params[p], &grads[p]));
  static float grad_buf[D * H];

  const float lr = 0.1f;
  float first = 0.0f, value = 0.0f;
  nabla_tensor* outputs[1] = {loss};
  for (int step = 0; step <= STEPS; ++step) {
    OK(nabla_compute(ctx, outputs, 1, 2));
    OK(nabla_tensor_read(ctx, loss, &value, sizeof value));
    if (step == 0) first = value;
    if (step % 25 == 0 || step == STEPS) printf("step %3d  loss %.6f\n", step, value);
    if (step == STEPS) break;
    for (int p = 0; p < 4; ++p) {
      OK(nabla_tensor_read(ctx, grads[p], grad_buf, counts[p] * sizeof(float)));
      for (size_t i = 0; i < counts[p]; ++i) values[p][i] -= lr * grad_buf[i];
      OK(nabla_tensor_write(ctx, params[p], values[p], counts[p] * sizeof(float)));
    }
  }
  printf("initial loss %.6f, final loss %.6f (ratio %.4f)\n", first, value, value / first);
  CHECK(isfinite(value));
  CHECK(value < 0.2f * first);
  nabla_context_free(ctx);
  return value;
}

int main(void) {
  check_errors();
  run_training();
  return finish();
}
