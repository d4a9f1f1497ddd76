/* Trains a small Vision Transformer through the C API with nabla_trainer, as
 * an FFI framework would: a conv_2d patch embedding, a class token and
 * position embedding, a pre-LN block with LayerNorm, fused multi-head
 * attention and a GELU MLP, a final LayerNorm and a linear head under
 * cross-entropy. This is the model ggml's auto-backward cannot train (no
 * LayerNorm or GELU backward, conv_2d's non-contiguous gradient), built from
 * C alone with its real ops.
 *
 * The task is synthetic but needs every part: 8x8 images whose class is the
 * quadrant holding a bright square, under noise. Passing means the held-out
 * accuracy reaches 95% and the loss falls below a tenth of its start; wrong
 * gradients anywhere in the chain leave it near chance (25%). Then the same
 * model trains a few steps with each trainer flag, and each new entry point's
 * bad input comes back as a status with a message naming it.
 *
 * Dimensions: B images of 1 x 8 x 8, patch 4 (P = 4 patches, T = 5 tokens
 * with the class token), width E = 16, H = 2 heads, MLP width F = 32,
 * K = 4 classes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { B = 32, S = 8, PATCH = 4, P = 4, T = 5, E = 16, H = 2, F = 32, K = 4, STEPS = 120 };


/* A batch: image b is noise with a bright 3x3 square in quadrant labels[b]. */
static void make_batch(float* images, int32_t* labels) {
  for (int b = 0; b < B; ++b) {
    int q = (int)uniform(0, K) % K;
    labels[b] = q;
    int top = (q / 2) * 4 + (int)uniform(0, 2), left = (q % 2) * 4 + (int)uniform(0, 2);
    for (int i = 0; i < S; ++i)
      for (int j = 0; j < S; ++j) {
        int inside = i >= top && i < top + 3 && j >= left && j < left + 3;
        images[(b * S + i) * S + j] = uniform(-0.5f, 0.5f) + (inside ? 1.5f : 0.0f);
      }
  }
}

typedef struct {
  nabla_context* ctx;
  nabla_tensor *images, *labels, *logits, *loss;
  nabla_tensor *cls, *pos, *patch_w;
} Vit;

static nabla_tensor* norm(nabla_context* ctx, nabla_tensor* x) { return layer_norm(ctx, x, E, 1e-6); }

/* The model for batches of `batch` images. */
static Vit build_batch(int64_t batch) {
  Vit m;
  nabla_context* ctx = NULL;
  OK(nabla_context_create(&ctx));
  m.ctx = ctx;
  int64_t is[4] = {batch, 1, S, S}, ls[1] = {batch};
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 4, is, NULL, &m.images));
  OK(nabla_tensor_from_data(ctx, NABLA_I32, 1, ls, NULL, &m.labels));

  /* Patch embedding: conv [E, 1, 4, 4] stride 4 -> [B, E, 2, 2] -> tokens [B, P, E]. */
  int64_t ws[4] = {E, 1, PATCH, PATCH}, es[1] = {E}, stride[2] = {PATCH, PATCH};
  nabla_tensor *x = NULL, *tokens = NULL;
  m.patch_w = param(ctx, 4, ws, 0.25f, 0);
  OK(nabla_conv_2d(ctx, m.images, m.patch_w, param(ctx, 1, es, 0, 0), stride, NULL, NULL, 1, &x));
  int64_t flat[3] = {batch, E, P};
  OK(nabla_reshape(ctx, x, 3, flat, &x));
  OK(nabla_transpose(ctx, x, 1, 2, &tokens));

  /* Class token first, then the position embedding. */
  int64_t cs[3] = {1, 1, E}, cb[3] = {batch, 1, E}, ps[3] = {1, T, E};
  nabla_tensor* cls_b = NULL;
  m.cls = param(ctx, 3, cs, 0.02f, 0);
  m.pos = param(ctx, 3, ps, 0.02f, 0);
  OK(nabla_expand(ctx, m.cls, 3, cb, &cls_b));
  nabla_tensor* parts[2] = {cls_b, tokens};
  OK(nabla_concat(ctx, parts, 2, 1, &x));
  OK(nabla_add(ctx, x, m.pos, &x));

  /* One block; its MLP uses the exact GELU, as timm's ViT. */
  x = transformer_block(ctx, x, batch, T, E, H, F, 0, 1e-6, nabla_gelu_erf);

  /* Head on the class token. */
  int64_t rows[2] = {batch, E};
  OK(nabla_slice(ctx, norm(ctx, x), 1, 0, 1, 1, &x));
  OK(nabla_reshape(ctx, x, 2, rows, &x));
  m.logits = linear(ctx, x, E, K);
  OK(nabla_cross_entropy(ctx, m.logits, m.labels, -100, &m.loss));
  return m;
}

static Vit build(void) { return build_batch(B); }

static nabla_trainer* make_trainer(Vit* m, int flags) {
  nabla_trainer* trainer = NULL;
  nabla_tensor* no_decay[2] = {m->cls, m->pos};
  OK(nabla_trainer_create(m->ctx, m->loss, &m->logits, 1, 0.9, 0.999, 1e-8, 0.05, no_decay, 2, 2, flags,
                          &trainer));
  return trainer;
}

static float images[B * S * S];
static int32_t labels[B];

static void write_batch(Vit* m) {
  make_batch(images, labels);
  OK(nabla_tensor_write(m->ctx, m->images, images, sizeof images));
  OK(nabla_tensor_write(m->ctx, m->labels, labels, sizeof labels));
}

/* Held-out accuracy over 4 fresh batches (a run without an update). */
static double accuracy(Vit* m, nabla_trainer* trainer) {
  int correct = 0;
  for (int r = 0; r < 4; ++r) {
    write_batch(m);
    OK(nabla_trainer_run(trainer, NULL));
    float logits[B * K];
    OK(nabla_trainer_read(trainer, m->logits, logits, sizeof logits));
    for (int b = 0; b < B; ++b) {
      int best = 0;
      for (int c = 1; c < K; ++c)
        if (logits[b * K + c] > logits[b * K + best]) best = c;
      correct += best == labels[b];
    }
  }
  return correct / (4.0 * B);
}

/* The trained parameters go to a safetensors file by name, and into a
 * freshly initialised model of another context, which must then compute the
 * same logits bit for bit. A file that does not fit changes nothing. */
static void checkpoint(Vit* trained, nabla_trainer* trainer, int64_t count) {
  enum { MAX = 32 };
  const char* path = "c_api_vit_train.safetensors";
  char name_buf[MAX][24];
  const char* names[MAX];
  nabla_tensor* params[MAX];
  CHECK(count <= MAX);
  for (int64_t i = 0; i < count; ++i) {
    snprintf(name_buf[i], sizeof name_buf[i], "parameter.%lld", (long long)i);
    names[i] = name_buf[i];
    OK(nabla_trainer_parameter(trainer, i, &params[i]));
  }
  OK(nabla_save_safetensors(trained->ctx, path, names, params, (size_t)count));

  Vit fresh = build();
  nabla_trainer* other = make_trainer(&fresh, 0);
  nabla_tensor* fresh_params[MAX];
  for (int64_t i = 0; i < count; ++i) OK(nabla_trainer_parameter(other, i, &fresh_params[i]));
  /* The leaf the failed loads below would write first. */
  int64_t first_numel = 0;
  OK(nabla_tensor_numel(fresh_params[0], &first_numel));
  const size_t first_bytes = sizeof(float) * (size_t)first_numel;
  float* first_before = malloc(first_bytes);
  float* first_after = malloc(first_bytes);
  OK(nabla_tensor_read(fresh.ctx, fresh_params[0], first_before, first_bytes));

  printf("checkpoint errors:\n");
  const char* wrong[2] = {names[0], "no.such.tensor"};
  FAILS(nabla_load_safetensors(fresh.ctx, "missing.safetensors", names, fresh_params, 1), NABLA_ERROR_IO,
        "missing.safetensors");
  FAILS(nabla_load_safetensors(fresh.ctx, path, wrong, fresh_params, 2), NABLA_ERROR_IO, "no.such.tensor");
  /* parameter.0 fits, parameter.1 (another shape) does not: a shape error,
   * and parameter.0's leaf is not written either. */
  nabla_tensor* misfit[2] = {fresh_params[0], fresh_params[0]};
  FAILS(nabla_load_safetensors(fresh.ctx, path, names, misfit, 2), NABLA_ERROR_SHAPE, "parameter.1");
  OK(nabla_tensor_read(fresh.ctx, fresh_params[0], first_after, first_bytes));
  CHECK(memcmp(first_before, first_after, first_bytes) == 0);
  free(first_before);
  free(first_after);
  FAILS(nabla_save_safetensors(fresh.ctx, path, names, &fresh.logits, 1), NABLA_ERROR_USAGE, "not a leaf");
  FAILS(nabla_load_safetensors(fresh.ctx, path, names, params, 1), NABLA_ERROR_ARGUMENT, "another context");

  OK(nabla_load_safetensors(fresh.ctx, path, names, fresh_params, (size_t)count));
  float before[E * PATCH * PATCH], after[E * PATCH * PATCH];
  OK(nabla_tensor_read(fresh.ctx, fresh.patch_w, after, sizeof after));
  OK(nabla_tensor_read(trained->ctx, trained->patch_w, before, sizeof before));
  CHECK(memcmp(before, after, sizeof before) == 0);
  float logits[2][B * K];
  write_batch(trained);
  OK(nabla_tensor_write(fresh.ctx, fresh.images, images, sizeof images));
  OK(nabla_tensor_write(fresh.ctx, fresh.labels, labels, sizeof labels));
  OK(nabla_trainer_run(trainer, NULL));
  OK(nabla_trainer_run(other, NULL));
  OK(nabla_trainer_read(trainer, trained->logits, logits[0], sizeof logits[0]));
  OK(nabla_trainer_read(other, fresh.logits, logits[1], sizeof logits[1]));
  CHECK(memcmp(logits[0], logits[1], sizeof logits[0]) == 0);
  printf("checkpoint: %lld parameters saved and loaded into a fresh model: same logits\n", (long long)count);
  nabla_context_free(fresh.ctx);
  remove(path);
}

/* Reads every parameter of a trainer, concatenated, into out (elements
 * values in all); returns how many were read. */
static int64_t read_parameters(nabla_context* ctx, nabla_trainer* trainer, float* out, int64_t elements) {
  int64_t count = 0, done = 0;
  OK(nabla_trainer_parameters(trainer, &count, NULL, NULL));
  for (int64_t i = 0; i < count; ++i) {
    nabla_tensor* p = NULL;
    int64_t n = 0;
    OK(nabla_trainer_parameter(trainer, i, &p));
    OK(nabla_tensor_numel(p, &n));
    if (done + n > elements) return -1;
    OK(nabla_tensor_read(ctx, p, out + done, sizeof(float) * (size_t)n));
    done += n;
  }
  return done;
}

/* Ten steps of a run resumed from nabla_trainer_save's checkpoint, in a
 * model built from other weights, are those of the run that went on: the
 * same losses and parameters, bit for bit. */
static void resume(void) {
  enum { BEFORE = 30, AFTER = 10, VALUES = 4096 };
  const char* path = "c_api_vit_resume.safetensors";
  rng_state = 31;
  Vit a = build();
  nabla_trainer* ta = make_trainer(&a, 0);
  float losses[2][AFTER];
  unsigned long long data_at_save = 0;
  for (int step = 0; step < BEFORE + AFTER; ++step) {
    if (step == BEFORE) {
      OK(nabla_trainer_save(ta, path, NULL));
      data_at_save = rng_state;
    }
    write_batch(&a);
    OK(nabla_trainer_run(ta, step >= BEFORE ? &losses[0][step - BEFORE] : NULL));
    OK(nabla_trainer_update(ta, 3e-3, 1.0, NULL));
  }

  Vit b = build();
  nabla_trainer* tb = make_trainer(&b, 0);
  static float values[2][VALUES];
  const int64_t n = read_parameters(b.ctx, tb, values[1], VALUES);
  CHECK(n > 0);
  printf("resume errors:\n");
  /* The saved names but the last: every parameter but one is found. */
  char name_buf[20][24];
  const char* wrong[20];
  for (int i = 0; i < 20; ++i) {
    snprintf(name_buf[i], sizeof name_buf[i], "parameter.%d", i);
    wrong[i] = name_buf[i];
  }
  wrong[19] = "no.such.parameter";
  FAILS(nabla_trainer_load(tb, "missing.safetensors", NULL), NABLA_ERROR_IO, "missing.safetensors");
  FAILS(nabla_trainer_load(tb, path, wrong), NABLA_ERROR_IO, "no.such.parameter");
  static float unchanged[VALUES];
  CHECK(read_parameters(b.ctx, tb, unchanged, VALUES) == n);
  CHECK(memcmp(unchanged, values[1], sizeof(float) * (size_t)n) == 0);

  OK(nabla_trainer_load(tb, path, NULL));
  int64_t steps = 0;
  OK(nabla_trainer_steps(tb, &steps));
  CHECK(steps == BEFORE);
  /* The batches the first run saw after its save. */
  rng_state = data_at_save;
  for (int step = 0; step < AFTER; ++step) {
    write_batch(&b);
    OK(nabla_trainer_run(tb, &losses[1][step]));
    OK(nabla_trainer_update(tb, 3e-3, 1.0, NULL));
  }
  CHECK(memcmp(losses[0], losses[1], sizeof losses[0]) == 0);
  CHECK(read_parameters(a.ctx, ta, values[0], VALUES) == n);
  CHECK(read_parameters(b.ctx, tb, values[1], VALUES) == n);
  CHECK(memcmp(values[0], values[1], sizeof(float) * (size_t)n) == 0);
  printf("resume: %d steps after loading step %d's checkpoint match the uninterrupted run bit for bit "
         "(loss %.5f)\n", AFTER, BEFORE, losses[1][AFTER - 1]);
  nabla_context_free(b.ctx);
  nabla_context_free(a.ctx);
  remove(path);
}

static void train(void) {
  Vit m = build();
  nabla_trainer* trainer = make_trainer(&m, 0);
  int64_t count = 0, elements = 0;
  OK(nabla_trainer_parameters(trainer, &count, &elements, NULL));
  CHECK(count == 20); /* patch w, b; cls; pos; 3 norms x 2; qkv, proj, fc1, fc2, head x 2 */
  printf("vit: %lld parameters, %lld values\n", (long long)count, (long long)elements);

  float patch_before[E * PATCH * PATCH], patch_after[E * PATCH * PATCH];
  OK(nabla_tensor_read(m.ctx, m.patch_w, patch_before, sizeof patch_before));
  float first = 0, last = 0;
  for (int step = 0; step < STEPS; ++step) {
    write_batch(&m);
    float loss = 0;
    double norm = 0;
    OK(nabla_trainer_run(trainer, &loss));
    OK(nabla_trainer_update(trainer, 3e-3, 1.0, &norm));
    CHECK(isfinite(loss) && isfinite(norm) && norm > 0);
    if (step == 0) first = loss;
    last = loss;
    if (step % 20 == 0 || step == STEPS - 1) printf("step %3d  loss %.4f  grad norm %.4f\n", step, loss, norm);
  }
  int64_t steps = 0;
  OK(nabla_trainer_steps(trainer, &steps));
  CHECK(steps == STEPS);
  /* The update reached the leaves the caller holds. */
  OK(nabla_tensor_read(m.ctx, m.patch_w, patch_after, sizeof patch_after));
  CHECK(memcmp(patch_before, patch_after, sizeof patch_before) != 0);

  double acc = accuracy(&m, trainer);
  printf("held-out accuracy %.3f, loss %.4f -> %.4f\n", acc, first, last);
  CHECK(acc >= 0.95);
  CHECK(last < 0.1f * first);
  checkpoint(&m, trainer, count);
  nabla_trainer_free(trainer);
  nabla_context_free(m.ctx);
}

/* The same start under each flag: a few steps, finite and falling. The
 * parameters match the default trainer's to rounding (low memory changes
 * no value without clipping; bf16 rounds the products' operands). */
static void flags(void) {
  const int variants[3] = {0, NABLA_TRAIN_LOW_MEMORY, NABLA_TRAIN_BF16_MATMUL};
  float losses[3][10];
  for (int f = 0; f < 3; ++f) {
    rng_state = 7;
    Vit m = build();
    nabla_trainer* trainer = make_trainer(&m, variants[f]);
    for (int step = 0; step < 10; ++step) {
      write_batch(&m);
      OK(nabla_trainer_run(trainer, &losses[f][step]));
      OK(nabla_trainer_update(trainer, 3e-3, 0.0, NULL));
    }
    printf("flags %d: loss %.5f -> %.5f\n", variants[f], losses[f][0], losses[f][9]);
    nabla_context_free(m.ctx); /* frees the trainer too */
  }
  for (int step = 0; step < 10; ++step) {
    CHECK(fabsf(losses[1][step] - losses[0][step]) <= 1e-5f * fabsf(losses[0][step]));
    CHECK(fabsf(losses[2][step] - losses[0][step]) <= 2e-2f * fabsf(losses[0][step]));
  }
  CHECK(losses[0][9] < losses[0][0]);
}

/* Two replicas of the model built for half the batch (NABLA_TRAIN_REPLICAS)
 * train as the model built for the whole batch: the same losses, logits
 * and parameters to rounding, since the gradient is summed in two halves. */
static void replicas(void) {
  enum { STEPS_R = 5, VALUES = 4096, HALF = B / 2 };
  rng_state = 11;
  Vit whole = build();
  nabla_trainer* tw = make_trainer(&whole, 0);
  rng_state = 11; /* the same initial weights */
  Vit half = build_batch(HALF);
  nabla_trainer* th = make_trainer(&half, NABLA_TRAIN_REPLICAS(2));
  nabla_tensor *images1 = NULL, *labels1 = NULL, *logits1 = NULL, *cls = NULL;
  OK(nabla_trainer_replica(th, 1, half.images, &images1));
  OK(nabla_trainer_replica(th, 1, half.labels, &labels1));
  OK(nabla_trainer_replica(th, 1, half.logits, &logits1));
  CHECK(images1 != half.images && logits1 != half.logits);
  OK(nabla_trainer_replica(th, 1, half.cls, &cls));
  CHECK(cls == half.cls); /* parameters are shared */
  OK(nabla_trainer_replica(th, 0, half.images, &cls));
  CHECK(cls == half.images);
  static float initial[VALUES];
  CHECK(read_parameters(whole.ctx, tw, initial, VALUES) > 0);
  float logits_whole[B * K], logits_half[B * K], last = 0;
  for (int step = 0; step < STEPS_R; ++step) {
    make_batch(images, labels);
    OK(nabla_tensor_write(whole.ctx, whole.images, images, sizeof images));
    OK(nabla_tensor_write(whole.ctx, whole.labels, labels, sizeof labels));
    OK(nabla_tensor_write(half.ctx, half.images, images, sizeof images / 2));
    OK(nabla_tensor_write(half.ctx, half.labels, labels, sizeof labels / 2));
    OK(nabla_tensor_write(half.ctx, images1, images + HALF * S * S, sizeof images / 2));
    OK(nabla_tensor_write(half.ctx, labels1, labels + HALF, sizeof labels / 2));
    float lw = 0, lh = 0;
    double nw = 0, nh = 0;
    OK(nabla_trainer_run(tw, &lw));
    OK(nabla_trainer_run(th, &lh));
    OK(nabla_trainer_read(tw, whole.logits, logits_whole, sizeof logits_whole));
    OK(nabla_trainer_read(th, half.logits, logits_half, sizeof logits_half / 2));
    OK(nabla_trainer_read(th, logits1, logits_half + HALF * K, sizeof logits_half / 2));
    OK(nabla_trainer_update(tw, 3e-3, 1.0, &nw));
    OK(nabla_trainer_update(th, 3e-3, 1.0, &nh));
    CHECK(fabsf(lh - lw) <= 1e-5f * fabsf(lw));
    last = lh;
    CHECK(fabs(nh - nw) <= 1e-5 * nw);
    /* As the losses: the logits agree to about 6e-7 relative. */
    for (int i = 0; i < B * K; ++i) CHECK(fabsf(logits_half[i] - logits_whole[i]) <= 1e-5f * (1 + fabsf(logits_whole[i])));
  }
  static float values[2][VALUES];
  const int64_t n = read_parameters(whole.ctx, tw, values[0], VALUES);
  CHECK(n > 0 && read_parameters(half.ctx, th, values[1], VALUES) == n);
  /* AdamW's first steps are close to lr sign(g), so an element whose
   * gradient is rounding noise takes steps of up to lr in a direction the
   * noise picks: the key bias (softmax ignores a constant added to each
   * key's score, so its gradient is zero but for rounding). Elements that
   * moved by at least one lr are held to 1e-5 as the losses are (they
   * agree to about 1e-7); only the others (moved less) are allowed the lr
   * steps they took. */
  const float lr = 3e-3f;
  float worst = 0;
  int64_t compared = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float d = fabsf(values[1][i] - values[0][i]);
    if (fabsf(values[0][i] - initial[i]) >= lr) {
      CHECK(d <= 1e-5f * (1 + fabsf(values[0][i])));
      worst = fmaxf(worst, d);
      ++compared;
    } else {
      CHECK(d <= 2 * lr * STEPS_R);
    }
  }
  printf("replicas: %lld of %lld parameters moved by lr or more; they differ by at most %.3g\n", (long long)compared,
         (long long)n, worst);
  CHECK(compared > n / 2);
  printf("replicas: 2 x %d images train as %d (loss %.5f after %d steps)\n", HALF, B, last, STEPS_R);

  printf("replica errors:\n");
  nabla_tensor* out = NULL;
  FAILS(nabla_trainer_replica(th, 2, half.images, &out), NABLA_ERROR_ARGUMENT, "replica 2 is outside [0, 2)");
  FAILS(nabla_trainer_replica(th, 1, whole.images, &out), NABLA_ERROR_ARGUMENT, "another context");
  nabla_tensor* stray = NULL;
  int64_t one[1] = {1};
  OK(nabla_tensor_from_data(half.ctx, NABLA_F32, 1, one, NULL, &stray));
  FAILS(nabla_trainer_replica(th, 1, stray, &out), NABLA_ERROR_ARGUMENT, "not a tensor of the trainer's graph");
  CHECK(out == NULL);
  nabla_trainer* bad = NULL;
  FAILS(nabla_trainer_create(half.ctx, half.loss, NULL, 0, 0.9, 0.999, 1e-8, 0.0, NULL, 0, 2,
                             NABLA_TRAIN_REPLICAS(2) | NABLA_TRAIN_LOW_MEMORY, &bad),
        NABLA_ERROR_USAGE, "replicas");
  CHECK(bad == NULL);
  nabla_context_free(half.ctx);
  nabla_context_free(whole.ctx);
}

static void errors(void) {
  printf("errors:\n");
  nabla_context* ctx = NULL;
  OK(nabla_context_create(&ctx));
  int64_t xs[3] = {2, 3, 8}, gs[1] = {7}, ims[4] = {1, 2, 6, 6}, w3[3] = {4, 2, 3}, w4[4] = {4, 3, 3, 3},
          ls[2] = {2, 3}, one[1] = {1};
  nabla_tensor *x = NULL, *gamma = NULL, *image = NULL, *w_bad = NULL, *w_groups = NULL, *flabels = NULL,
               *out = NULL, *loss = NULL, *w = NULL, *seed = NULL;
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 3, xs, NULL, &x));
  OK(nabla_parameter(ctx, NABLA_F32, 1, gs, NULL, &gamma));
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 4, ims, NULL, &image));
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 3, w3, NULL, &w_bad));
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 4, w4, NULL, &w_groups));
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 2, ls, NULL, &flabels));
  OK(nabla_tensor_from_data(ctx, NABLA_F32, 1, one, NULL, &seed));

  FAILS(nabla_layer_norm(ctx, x, gamma, NULL, 1e-5, &out), NABLA_ERROR_SHAPE, "layer_norm");
  FAILS(nabla_conv_2d(ctx, image, w_bad, NULL, NULL, NULL, NULL, 1, &out), NABLA_ERROR_SHAPE, "conv_2d");
  FAILS(nabla_conv_2d(ctx, image, w_groups, NULL, NULL, NULL, NULL, 1, &out), NABLA_ERROR_SHAPE, "conv_2d");
  FAILS(nabla_cross_entropy(ctx, x, flabels, -100, &out), NABLA_ERROR_DTYPE, "cross_entropy");
  FAILS(nabla_max_pool_2d(ctx, image, NULL, NULL, NULL, &out), NABLA_ERROR_ARGUMENT, "kernel");
  FAILS(nabla_rope(ctx, x, 0, 10000.0, 5, &out), NABLA_ERROR_ARGUMENT, "nabla_rope");
  FAILS(nabla_rope_at(ctx, x, NULL, 0, 10000.0, 0, NULL, 3, 0, 1.0, &out), NABLA_ERROR_ARGUMENT, "freq_factors");
  FAILS(nabla_dropout(ctx, x, 0.1, seed, 1, 0, &out), NABLA_ERROR_DTYPE, "dropout");
  FAILS(nabla_attention(ctx, x, x, x, 0, 0.0, &out), NABLA_ERROR_SHAPE, "attention");
  CHECK(out == NULL);

  /* The trainer: a loss no parameter reaches, bad flags, an f64 loss,
   * update and read before any run. */
  nabla_trainer* trainer = NULL;
  OK(nabla_sum(ctx, x, NULL, 0, 0, &loss));
  FAILS(nabla_trainer_create(ctx, loss, NULL, 0, 0.9, 0.999, 1e-8, 0.0, NULL, 0, 1, 0, &trainer),
        NABLA_ERROR_USAGE, "no parameter reaches the loss");
  int64_t ws[2] = {8, 8}, ds[2] = {2, 8};
  OK(nabla_parameter(ctx, NABLA_F32, 2, ws, NULL, &w));
  OK(nabla_matmul(ctx, x, w, &out));
  OK(nabla_sum(ctx, out, NULL, 0, 0, &loss));
  FAILS(nabla_trainer_create(ctx, loss, NULL, 0, 0.9, 0.999, 1e-8, 0.0, NULL, 0, 1, 16, &trainer),
        NABLA_ERROR_ARGUMENT, "unknown flags 16");
  FAILS(nabla_trainer_create(ctx, loss, NULL, 0, 0.9, 0.999, 1e-8, 0.0, &gamma, 1, 1, 0, &trainer),
        NABLA_ERROR_ARGUMENT, "no_decay[0]");
  nabla_tensor *x64 = NULL, *w64 = NULL, *loss64 = NULL;
  OK(nabla_tensor_from_data(ctx, NABLA_F64, 2, ds, NULL, &x64));
  OK(nabla_parameter(ctx, NABLA_F64, 2, ws, NULL, &w64));
  OK(nabla_matmul(ctx, x64, w64, &loss64));
  OK(nabla_sum(ctx, loss64, NULL, 0, 0, &loss64));
  FAILS(nabla_trainer_create(ctx, loss64, NULL, 0, 0.9, 0.999, 1e-8, 0.0, NULL, 0, 1, 0, &trainer),
        NABLA_ERROR_DTYPE, "f32");
  CHECK(trainer == NULL);
  FAILS(nabla_trainer_create(ctx, loss, NULL, 0, 1.0, 0.999, 1e-8, 0.0, NULL, 0, 1, 0, &trainer), NABLA_ERROR_USAGE,
        "beta1 must be in [0, 1)");
  FAILS(nabla_trainer_create(ctx, loss, NULL, 0, 0.9, 0.999, -1e-8, 0.0, NULL, 0, 1, 0, &trainer), NABLA_ERROR_USAGE,
        "eps");
  OK(nabla_trainer_create(ctx, loss, &out, 1, 0.9, 0.999, 1e-8, 0.0, NULL, 0, 1, 0, &trainer));
  FAILS(nabla_trainer_update(trainer, 1e-3, 0.0, NULL), NABLA_ERROR_USAGE, "before any run");
  float values[2 * 8];
  FAILS(nabla_trainer_read(trainer, out, values, sizeof values), NABLA_ERROR_USAGE, "nabla_trainer_read");
  OK(nabla_trainer_run(trainer, NULL));
  FAILS(nabla_trainer_read(trainer, out, values, 4), NABLA_ERROR_SHAPE, "bytes");
  FAILS(nabla_trainer_update(trainer, 1e-3, -1.0, NULL), NABLA_ERROR_ARGUMENT, "clip");
  FAILS(nabla_trainer_update(trainer, NAN, 0.0, NULL), NABLA_ERROR_USAGE, "learning rate");
  int64_t steps = -1;
  OK(nabla_trainer_steps(trainer, &steps));
  CHECK(steps == 0);
  FAILS(nabla_trainer_run(NULL, NULL), NABLA_ERROR_ARGUMENT, "trainer");
  nabla_context_free(ctx);
}

int main(void) {
  train();
  resume();
  flags();
  replicas();
  errors();
  return finish();
}
