/* A C program on the installed C API, built with
 *   cc c_api.c $(pkg-config --cflags --libs nabla)
 * loss = sum(x * x) for a parameter x; its gradient must be 2 x. */
#include <math.h>
#include <stdio.h>

#include "nabla.h"

#define OK(call)                                                     \
  do {                                                               \
    if ((call) != NABLA_OK) {                                        \
      fprintf(stderr, "%s failed: %s\n", #call, nabla_last_error()); \
      return 1;                                                      \
    }                                                                \
  } while (0)

int main(void) {
  float x_values[4] = {1.0f, -2.0f, 0.5f, 3.0f}, dx[4] = {0}, loss_value = 0.0f;
  int64_t shape[2] = {2, 2};
  nabla_context* ctx = NULL;
  nabla_tensor *x, *sq, *loss, *grad;
  OK(nabla_context_create(&ctx));
  OK(nabla_parameter(ctx, NABLA_F32, 2, shape, x_values, &x));
  OK(nabla_mul(ctx, x, x, &sq));
  OK(nabla_sum(ctx, sq, NULL, 0, 0, &loss));
  OK(nabla_backward(ctx, loss));
  OK(nabla_grad(ctx, x, &grad));
  nabla_tensor* outputs[2] = {loss, grad};
  OK(nabla_compute(ctx, outputs, 2, 1));
  OK(nabla_tensor_read(ctx, loss, &loss_value, sizeof loss_value));
  OK(nabla_tensor_read(ctx, grad, dx, sizeof dx));
  nabla_context_free(ctx);

  int failures = fabsf(loss_value - 14.25f) > 1e-6f;
  for (int i = 0; i < 4; ++i) failures += fabsf(dx[i] - 2.0f * x_values[i]) > 1e-6f;
  printf("%s: loss %g, dx = [%g, %g, %g, %g]\n", failures ? "FAILED" : "ok", loss_value, dx[0],
         dx[1], dx[2], dx[3]);
  return failures ? 1 : 0;
}
