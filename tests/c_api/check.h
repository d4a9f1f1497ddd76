/* What the C API tests share: checks that count failures, a call that must
 * succeed, deterministic random numbers, and the layers the model tests
 * build from. */
#ifndef NABLA_TESTS_C_API_CHECK_H
#define NABLA_TESTS_C_API_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nabla.h"

static int failures = 0;

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              nabla_last_error());                                                             \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)

/* Stops the test on a failed call: what follows depends on its result. */
#define OK(call)                                                                \
  do {                                                                          \
    nabla_status s_ = (call);                                                   \
    if (s_ != NABLA_OK) {                                                       \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, \
              nabla_status_string(s_), nabla_last_error());                     \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

/* A failed call with `status` whose message names `name`. */
#define FAILS(call, status, name)                            \
  do {                                                       \
    CHECK((call) == (status));                               \
    CHECK(strstr(nabla_last_error(), (name)) != NULL);       \
    printf("  %-28s %s\n", #status ":", nabla_last_error()); \
  } while (0)

/* Deterministic uniform numbers in [lo, hi). */
static unsigned long long rng_state = 12345;
static inline float uniform(float lo, float hi) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (hi - lo) * (float)((rng_state >> 40) & 0xFFFFFF) / (float)0x1000000;
}

/* Layers for the model tests: f32 parameters drawn from uniform(-std, std),
 * or filled with `fill` when std is 0. */
static inline nabla_tensor* param(nabla_context* ctx, int rank, const int64_t* shape, float std, float fill) {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  float* data = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; ++i) data[i] = std > 0 ? uniform(-std, std) : fill;
  nabla_tensor* t = NULL;
  OK(nabla_parameter(ctx, NABLA_F32, rank, shape, data, &t));
  free(data);
  return t;
}

/* y = x w + b over the last axis. */
static inline nabla_tensor* linear(nabla_context* ctx, nabla_tensor* x, int64_t in, int64_t out) {
  int64_t ws[2] = {in, out}, bs[1] = {out};
  nabla_tensor* y = NULL;
  OK(nabla_matmul_add(ctx, x, param(ctx, 2, ws, 1.0f / sqrtf((float)in), 0), param(ctx, 1, bs, 0, 0), &y));
  return y;
}

/* LayerNorm over the last axis (width dim) with a gain and a bias. */
static inline nabla_tensor* layer_norm(nabla_context* ctx, nabla_tensor* x, int64_t dim, double eps) {
  int64_t s[1] = {dim};
  nabla_tensor* y = NULL;
  OK(nabla_layer_norm(ctx, x, param(ctx, 1, s, 0, 1), param(ctx, 1, s, 0, 0), eps, &y));
  return y;
}

/* A pre-LN transformer block on x [batch, tokens, width]: fused multi-head
 * attention over a qkv projection read as [batch, tokens, 3, heads, d], then
 * an MLP of width mlp with `gelu` (nabla_gelu or nabla_gelu_erf). */
static inline nabla_tensor* transformer_block(nabla_context* ctx, nabla_tensor* x, int64_t batch, int64_t tokens,
                                              int64_t width, int64_t heads, int64_t mlp, int causal, double eps,
                                              nabla_status (*gelu)(nabla_context*, nabla_tensor*, nabla_tensor**)) {
  int64_t d = width / heads;
  int64_t split[5] = {batch, tokens, 3, heads, d}, per_head[4] = {batch, tokens, heads, d},
          merged[3] = {batch, tokens, width};
  nabla_tensor *qkv = linear(ctx, layer_norm(ctx, x, width, eps), width, 3 * width), *parts[3], *a = NULL,
               *h = NULL;
  OK(nabla_reshape(ctx, qkv, 5, split, &qkv));
  for (int i = 0; i < 3; ++i) {
    OK(nabla_slice(ctx, qkv, 2, i, i + 1, 1, &parts[i]));
    OK(nabla_reshape(ctx, parts[i], 4, per_head, &parts[i]));
  }
  OK(nabla_attention(ctx, parts[0], parts[1], parts[2], causal, 0.0, &a));
  OK(nabla_reshape(ctx, a, 3, merged, &a));
  OK(nabla_add(ctx, x, linear(ctx, a, width, width), &x));
  OK(gelu(ctx, linear(ctx, layer_norm(ctx, x, width, eps), width, mlp), &h));
  OK(nabla_add(ctx, x, linear(ctx, h, mlp, width), &x));
  return x;
}

/* main's ending: the number of failed checks decides the exit status. */
static inline int finish(void) {
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}

#endif
