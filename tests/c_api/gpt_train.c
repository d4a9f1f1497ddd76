/* Trains a small GPT through the C API with nabla_trainer: token and
 * position embeddings by get_rows, a pre-LN block with causal fused
 * attention and a tanh-GELU MLP, a final LayerNorm and a head tied to the
 * token embedding, under cross-entropy with ignored positions.
 *
 * The task needs attention: each sequence counts up modulo V from a random
 * start in a random step of 1 to 5, so the next token follows from the last
 * two. The first position's target is ignored (-100); every other must be
 * predicted at 95% or better on fresh sequences, where chance is 1/16.
 * Then NABLA_TRAIN_LOW_MEMORY must keep weight gradients as factors (32
 * tokens against 64 x 256 weights) and train to the same losses, and a
 * trainer made on the reference backend must train as the CPU's does.
 *
 * Dimensions: Bt sequences of T tokens from V, width E, H heads, MLP F.
 */
#include <math.h>

#include "check.h"

enum { Bt = 4, T = 8, V = 16, E = 64, H = 2, F = 256, STEPS = 400 };

typedef struct {
  nabla_context* ctx;
  nabla_tensor *tokens, *targets, *logits, *loss, *wpe;
} Gpt;

static nabla_tensor* norm(nabla_context* ctx, nabla_tensor* x) { return layer_norm(ctx, x, E, 1e-5); }

static Gpt build(void) {
  Gpt m;
  nabla_context* ctx = NULL;
  OK(nabla_context_create(&ctx));
  m.ctx = ctx;
  int64_t ts[2] = {Bt, T}, wte_s[2] = {V, E}, wpe_s[2] = {T, E};
  OK(nabla_tensor_from_data(ctx, NABLA_I32, 2, ts, NULL, &m.tokens));
  OK(nabla_tensor_from_data(ctx, NABLA_I32, 2, ts, NULL, &m.targets));
  nabla_tensor* wte = param(ctx, 2, wte_s, 0.1f, 0);
  m.wpe = param(ctx, 2, wpe_s, 0.1f, 0);
  nabla_tensor *x = NULL, *head = NULL;
  OK(nabla_get_rows(ctx, wte, m.tokens, &x));
  OK(nabla_add(ctx, x, m.wpe, &x));
  x = transformer_block(ctx, x, Bt, T, E, H, F, 1, 1e-5, nabla_gelu);

  /* The head is the token embedding, transposed (GPT-2's tied lm_head). */
  OK(nabla_transpose(ctx, wte, 0, 1, &head));
  OK(nabla_matmul(ctx, norm(ctx, x), head, &m.logits));
  OK(nabla_cross_entropy(ctx, m.logits, m.targets, -100, &m.loss));
  return m;
}

static int32_t tokens[Bt * T], targets[Bt * T];

/* Sequences counting up mod V; the first target is not determined. */
static void write_batch(Gpt* m) {
  for (int b = 0; b < Bt; ++b) {
    int start = (int)uniform(0, V) % V, step = 1 + (int)uniform(0, 5) % 5;
    for (int t = 0; t < T; ++t) {
      tokens[b * T + t] = (start + step * t) % V;
      targets[b * T + t] = t == 0 ? -100 : (start + step * (t + 1)) % V;
    }
  }
  OK(nabla_tensor_write(m->ctx, m->tokens, tokens, sizeof tokens));
  OK(nabla_tensor_write(m->ctx, m->targets, targets, sizeof targets));
}

static nabla_trainer* make_trainer(Gpt* m, int flags) {
  nabla_trainer* trainer = NULL;
  OK(nabla_trainer_create(m->ctx, m->loss, &m->logits, 1, 0.9, 0.95, 1e-8, 0.1, &m->wpe, 1, 2, flags, &trainer));
  return trainer;
}

static void train(void) {
  rng_state = 99;
  Gpt m = build();
  nabla_trainer* trainer = make_trainer(&m, 0);
  float first = 0, last = 0;
  for (int step = 0; step < STEPS; ++step) {
    write_batch(&m);
    OK(nabla_trainer_run(trainer, &last));
    /* Warmup, then cosine decay to 0. */
    double lr = step < 40 ? 3e-3 * (step + 1) / 40 : 1.5e-3 * (1 + cos(3.141592653589793 * (step - 40) / (STEPS - 40)));
    OK(nabla_trainer_update(trainer, lr, 1.0, NULL));
    if (step == 0) first = last;
    if (step % 50 == 0 || step == STEPS - 1) printf("step %3d  loss %.4f\n", step, last);
  }
  int correct = 0, total = 0;
  for (int r = 0; r < 16; ++r) {
    write_batch(&m);
    OK(nabla_trainer_run(trainer, NULL));
    float logits[Bt * T * V];
    OK(nabla_trainer_read(trainer, m.logits, logits, sizeof logits));
    for (int i = 0; i < Bt * T; ++i) {
      if (targets[i] < 0) continue;
      int best = 0;
      for (int c = 1; c < V; ++c)
        if (logits[i * V + c] > logits[i * V + best]) best = c;
      correct += best == targets[i];
      ++total;
    }
  }
  double acc = (double)correct / total;
  printf("gpt: next-token accuracy %.3f on %d fresh positions, loss %.4f -> %.4f\n", acc, total, first, last);
  CHECK(acc >= 0.95);
  CHECK(last < 0.1f * first);
  nabla_context_free(m.ctx);
}

/* Without clipping, the low-memory trainer's parameters are those of the
 * default one (both run nabla's own kernels), so the losses agree. */
static void low_memory(void) {
  float losses[2][8];
  int64_t factored[2] = {-1, -1};
  for (int f = 0; f < 2; ++f) {
    rng_state = 5;
    Gpt m = build();
    nabla_trainer* trainer = make_trainer(&m, f ? NABLA_TRAIN_LOW_MEMORY : 0);
    OK(nabla_trainer_parameters(trainer, NULL, NULL, &factored[f]));
    for (int step = 0; step < 8; ++step) {
      write_batch(&m);
      OK(nabla_trainer_run(trainer, &losses[f][step]));
      OK(nabla_trainer_update(trainer, 1e-3, 0.0, NULL));
    }
    nabla_context_free(m.ctx);
  }
  printf("low memory: %lld gradients kept as factors; loss %.6f -> %.6f (default %.6f -> %.6f)\n",
         (long long)factored[1], losses[1][0], losses[1][7], losses[0][0], losses[0][7]);
  CHECK(factored[0] == 0);
  CHECK(factored[1] > 0);
  for (int step = 0; step < 8; ++step) CHECK(fabsf(losses[1][step] - losses[0][step]) <= 1e-6f * losses[0][step]);
}

/* The whole step (forward, backward, clip, AdamW) on the reference backend:
 * the losses follow the CPU's to f32 rounding of sums in other orders
 * (8 steps at lr 1e-3 from one start). */
static void reference_backend(void) {
  float losses[2][8];
  for (int b = 0; b < 2; ++b) {
    rng_state = 7;
    Gpt m = build();
    if (b) OK(nabla_context_set_backend(m.ctx, "reference"));
    nabla_trainer* trainer = make_trainer(&m, 0);
    for (int step = 0; step < 8; ++step) {
      write_batch(&m);
      OK(nabla_trainer_run(trainer, &losses[b][step]));
      OK(nabla_trainer_update(trainer, 1e-3, 1.0, NULL));
    }
    nabla_context_free(m.ctx);
  }
  printf("reference backend: loss %.6f -> %.6f (cpu %.6f -> %.6f)\n", losses[1][0], losses[1][7], losses[0][0],
         losses[0][7]);
  CHECK(losses[0][7] < losses[0][0]);
  for (int step = 0; step < 8; ++step) CHECK(fabsf(losses[1][step] - losses[0][step]) <= 1e-4f * losses[0][step]);
}

int main(void) {
  train();
  low_memory();
  reference_backend();
  return finish();
}
