/* nabla C API, for FFI users (Python ctypes/cffi, Ruby FFI, ...).
 *
 * Pure C99; every type is an opaque handle, a fixed-size integer, a double or
 * a pointer, so an FFI binding can be written from this file alone.
 *
 * Conventions
 *   - Every function except nabla_last_error, nabla_status_string and
 *     nabla_context_free returns a nabla_status; results go through
 *     out-pointers, which are written only on success.
 *   - On failure, nabla_last_error() returns a readable message (nabla's own
 *     wording, e.g. "matmul: inner dimensions differ: a is [4, 5], b is [6, 3]").
 *     Nothing aborts: every exception is caught at this boundary.
 *   - Tensor handles belong to the context that made them and are freed with
 *     it; there is no per-tensor free. A handle must not be passed to another
 *     context.
 *   - Shapes are in NumPy order (outermost first); values are read and
 *     written in row-major order.
 *   - A context is not thread-safe: use one context per thread, or lock.
 *
 * Define-then-run: the op functions only record graph nodes. nabla_backward
 * records a loss and builds its gradients, nabla_compute plans and runs the
 * graph, nabla_tensor_read copies values out. A training loop writes new
 * data into leaves with nabla_tensor_write and calls nabla_compute again with
 * the same outputs: the compiled plan is reused.
 */
#ifndef NABLA_H
#define NABLA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nabla_context nabla_context;
typedef struct nabla_tensor nabla_tensor;

/* NOTE: FFI callers may pass any int where an enum is expected; a fixed
 * underlying type makes such values well-defined on the C++ side, where they
 * are rejected with a status instead of being undefined behaviour. */
#ifdef __cplusplus
#define NABLA_ENUM_BASE : int
#else
#define NABLA_ENUM_BASE
#endif

/* Values are fixed: FFI bindings hard-code them. */
typedef enum nabla_status NABLA_ENUM_BASE {
  NABLA_OK = 0,
  NABLA_ERROR_SHAPE = 1,    /* a shape, axis or size that does not fit */
  NABLA_ERROR_DTYPE = 2,    /* an element type the op does not accept */
  NABLA_ERROR_IO = 3,       /* a file that cannot be read or written */
  NABLA_ERROR_USAGE = 4,    /* the API used out of order, e.g. a read before compute */
  NABLA_ERROR_INTERNAL = 5, /* a bug in nabla, or an unexpected exception */
  NABLA_ERROR_ARGUMENT = 6, /* a NULL pointer, a negative count, a foreign handle */
  NABLA_ERROR_RUNTIME = 7   /* any other failure: NaN check, memory limit, allocation */
} nabla_status;

/* Matches nabla::DType. */
typedef enum nabla_dtype NABLA_ENUM_BASE {
  NABLA_F32 = 0,
  NABLA_F64 = 1,
  NABLA_I32 = 2
} nabla_dtype;

/* The message of the last failed call on this thread; "" if none failed yet.
 * Valid until the next failing call on this thread. */
const char* nabla_last_error(void);
/* "NABLA_ERROR_SHAPE" etc.; "NABLA_UNKNOWN_STATUS" for other values. */
const char* nabla_status_string(nabla_status status);

/* ---- Context */
nabla_status nabla_context_create(nabla_context** out);
/* Frees the context and every tensor handle it made. Accepts NULL. */
void nabla_context_free(nabla_context* ctx);
/* Which backend runs the context's graphs from the next nabla_compute on:
 * "cpu" (the default) or "reference" (plain single-threaded kernels in memory
 * of their own, to check results against). Leaves stay in host memory and are
 * copied to the backend at every compute. Trainers (nabla_trainer_create)
 * run their whole step (forward, backward, update) on the backend the
 * context had when they were created. An unknown name is NABLA_ERROR_USAGE, naming the backends
 * this build has. */
nabla_status nabla_context_set_backend(nabla_context* ctx, const char* backend);

/* ---- Leaves. `shape` has `rank` entries (may be NULL when rank is 0);
 * `data` holds numel values of `dtype` in row-major order, or is NULL for
 * zeros. The data is copied. */
nabla_status nabla_tensor_from_data(nabla_context* ctx, nabla_dtype dtype, int rank,
                                    const int64_t* shape, const void* data, nabla_tensor** out);
/* A leaf whose gradient nabla_backward builds (f32 or f64). */
nabla_status nabla_parameter(nabla_context* ctx, nabla_dtype dtype, int rank, const int64_t* shape,
                             const void* data, nabla_tensor** out);
/* Overwrites a leaf's values; `bytes` must be numel * element size. The next
 * nabla_compute sees the new values. */
nabla_status nabla_tensor_write(nabla_context* ctx, nabla_tensor* t, const void* src, size_t bytes);

/* ---- Shape queries */
nabla_status nabla_tensor_rank(nabla_tensor* t, int* out);
/* Writes rank() dims; `capacity` must be at least the rank. */
nabla_status nabla_tensor_shape(nabla_tensor* t, int64_t* dims, int capacity);
nabla_status nabla_tensor_dtype(nabla_tensor* t, nabla_dtype* out);
nabla_status nabla_tensor_numel(nabla_tensor* t, int64_t* out);

/* ---- Ops: each records one node and returns its handle through `out`.
 * See include/nabla/ops.h for the semantics of each. */

/* Elementwise, NumPy broadcasting. */
nabla_status nabla_add(nabla_context* ctx, nabla_tensor* a, nabla_tensor* b, nabla_tensor** out);
nabla_status nabla_sub(nabla_context* ctx, nabla_tensor* a, nabla_tensor* b, nabla_tensor** out);
nabla_status nabla_mul(nabla_context* ctx, nabla_tensor* a, nabla_tensor* b, nabla_tensor** out);
nabla_status nabla_div(nabla_context* ctx, nabla_tensor* a, nabla_tensor* b, nabla_tensor** out);
/* 1 where a == b, else 0. Not differentiable. */
nabla_status nabla_eq(nabla_context* ctx, nabla_tensor* a, nabla_tensor* b, nabla_tensor** out);
/* cond ? a : b; cond is nonzero-is-true, any dtype. */
nabla_status nabla_where(nabla_context* ctx, nabla_tensor* cond, nabla_tensor* a, nabla_tensor* b,
                         nabla_tensor** out);

nabla_status nabla_neg(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_scale(nabla_context* ctx, nabla_tensor* x, double factor, nabla_tensor** out);
nabla_status nabla_exp(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_log(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_sqrt(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_rsqrt(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_square(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_abs(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_tanh(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_sigmoid(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_relu(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_silu(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
/* 1 where x > 0, else 0. Not differentiable. */
nabla_status nabla_step(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
/* -1, 0 or 1. Not differentiable. */
nabla_status nabla_sign(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);

/* Reductions over `axes` (`naxes` entries; all axes when naxes is 0, and then
 * axes may be NULL). keepdim: nonzero keeps reduced axes with size 1. */
nabla_status nabla_sum(nabla_context* ctx, nabla_tensor* x, const int64_t* axes, int naxes,
                       int keepdim, nabla_tensor** out);
nabla_status nabla_mean(nabla_context* ctx, nabla_tensor* x, const int64_t* axes, int naxes,
                        int keepdim, nabla_tensor** out);
nabla_status nabla_max(nabla_context* ctx, nabla_tensor* x, const int64_t* axes, int naxes,
                       int keepdim, nabla_tensor** out);

/* [..., M, K] x [..., K, N] -> [..., M, N]; batch axes broadcast. */
nabla_status nabla_matmul(nabla_context* ctx, nabla_tensor* a, nabla_tensor* b, nabla_tensor** out);
/* a b + c, c broadcast to the product (a linear layer's bias, or a tensor to
 * add into), in one pass: the product accumulates onto c. */
nabla_status nabla_matmul_add(nabla_context* ctx, nabla_tensor* a, nabla_tensor* b, nabla_tensor* c,
                              nabla_tensor** out);

/* Layout. `shape` / `order` have `rank` entries. */
nabla_status nabla_reshape(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* shape,
                           nabla_tensor** out);
nabla_status nabla_permute(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* order,
                           nabla_tensor** out);
nabla_status nabla_transpose(nabla_context* ctx, nabla_tensor* x, int64_t axis0, int64_t axis1,
                             nabla_tensor** out);
nabla_status nabla_slice(nabla_context* ctx, nabla_tensor* x, int64_t axis, int64_t start,
                         int64_t stop, int64_t step, nabla_tensor** out);
nabla_status nabla_expand(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* shape,
                          nabla_tensor** out);
nabla_status nabla_contiguous(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
/* Joins `n` tensors along `axis`. */
nabla_status nabla_concat(nabla_context* ctx, nabla_tensor* const* xs, size_t n, int64_t axis,
                          nabla_tensor** out);
/* Places x into zeros of shape `full` (`rank` entries) where
 * slice(axis, start, stop, step) selects: the adjoint of slice. */
nabla_status nabla_scatter_slice(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* full,
                                 int64_t axis, int64_t start, int64_t stop, int64_t step,
                                 nabla_tensor** out);

/* Indexing. table [R, ...], indices i32 of any shape -> [*indices, ...]. */
nabla_status nabla_get_rows(nabla_context* ctx, nabla_tensor* table, nabla_tensor* indices,
                            nabla_tensor** out);
/* out [rows, ...] = 0; out[indices[i]] += values[i]. */
nabla_status nabla_scatter_add_rows(nabla_context* ctx, nabla_tensor* values, nabla_tensor* indices,
                                    int64_t rows, nabla_tensor** out);

/* ---- Transformer and vision ops (see include/nabla/ops.h). Each is
 * differentiable in its float inputs, with a fused backward where ops.h says
 * so; an optional tensor argument may be NULL. */

/* Activations. gelu is the tanh approximation (GPT-2's), gelu_erf the exact
 * one (timm's ViT), gelu_quick x * sigmoid(1.702 x). */
nabla_status nabla_gelu(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_gelu_erf(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_gelu_quick(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_erf(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_hardswish(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
nabla_status nabla_softplus(nabla_context* ctx, nabla_tensor* x, double beta, double threshold,
                            nabla_tensor** out);
nabla_status nabla_elu(nabla_context* ctx, nabla_tensor* x, double alpha, nabla_tensor** out);
nabla_status nabla_leaky_relu(nabla_context* ctx, nabla_tensor* x, double slope, nabla_tensor** out);
nabla_status nabla_clamp(nabla_context* ctx, nabla_tensor* x, double lo, double hi, nabla_tensor** out);

/* Norms over the last axis. layer_norm: (x - mean) / sqrt(var + eps) * gamma
 * + beta; rms_norm: x / sqrt(mean(x^2) + eps) * gamma. gamma and beta are
 * [C] or NULL for none. */
nabla_status nabla_layer_norm(nabla_context* ctx, nabla_tensor* x, nabla_tensor* gamma,
                              nabla_tensor* beta, double eps, nabla_tensor** out);
nabla_status nabla_rms_norm(nabla_context* ctx, nabla_tensor* x, nabla_tensor* gamma, double eps,
                            nabla_tensor** out);

/* softmax(scale * x + mask) over the last axis; mask is additive (-inf
 * hides), broadcastable to x, or NULL; causal (nonzero) hides j > i + Tk - Tq
 * on x [..., Tq, Tk]. */
nabla_status nabla_softmax(nabla_context* ctx, nabla_tensor* x, double scale, nabla_tensor* mask,
                           int causal, nabla_tensor** out);
nabla_status nabla_log_softmax(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out);
/* Mean over rows of -log softmax(logits)[label]: logits [..., C], labels i32
 * [...]; rows labelled ignore_index are skipped (PyTorch uses -100). */
nabla_status nabla_cross_entropy(nabla_context* ctx, nabla_tensor* logits, nabla_tensor* labels,
                                 int64_t ignore_index, nabla_tensor** out);
/* Mean over rows of -sum(probs * log_softmax(logits)). */
nabla_status nabla_cross_entropy_soft(nabla_context* ctx, nabla_tensor* logits, nabla_tensor* probs,
                                      nabla_tensor** out);

/* Attention. scale <= 0 means 1/sqrt(D).
 * scaled_dot_product_attention: q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv]
 * -> [..., Tq, Dv]; mask as for nabla_softmax. Composed from matmul and softmax.
 * attention: the fused kernel on token-major operands q [B, Tq, H, D],
 * k [B, Tk, H, D], v [B, Tk, H, Dv] -> [B, Tq, H, Dv] (a qkv projection
 * reshaped to heads, with no permutes); the T x T scores are never stored. */
nabla_status nabla_scaled_dot_product_attention(nabla_context* ctx, nabla_tensor* q, nabla_tensor* k,
                                                nabla_tensor* v, nabla_tensor* mask, int causal,
                                                double scale, nabla_tensor** out);
nabla_status nabla_attention(nabla_context* ctx, nabla_tensor* q, nabla_tensor* k, nabla_tensor* v,
                             int causal, double scale, nabla_tensor** out);
/* The same, k and v with Hk heads dividing H (grouped-query), and what hides
 * keys beyond causality: segments (i32 [B, T], or NULL): query i sees key j
 * only where their ids are equal (packed documents); window > 0 (causal
 * only): a sliding window, query i sees the keys j with
 * 0 <= i + (Tk - Tq) - j < window (Mistral's, Gemma's); 0: none. */
nabla_status nabla_attention_within(nabla_context* ctx, nabla_tensor* q, nabla_tensor* k, nabla_tensor* v,
                                    int causal, double scale, nabla_tensor* segments, int64_t window,
                                    nabla_tensor** out);
/* The same with each score s = scale q.k soft-capped before the softmax,
 * to softcap tanh(s / softcap) (Gemma 2's attn_logit_softcapping); softcap
 * 0: none. Fused as the others, forward and backward. */
nabla_status nabla_attention_capped(nabla_context* ctx, nabla_tensor* q, nabla_tensor* k, nabla_tensor* v,
                                    int causal, double scale, nabla_tensor* segments, int64_t window,
                                    double softcap, nabla_tensor** out);
/* Rotary position embedding of x [..., T, D] at positions offset, offset+1, ...
 * mode 0: GPT-NeoX pairs (x[i], x[i + D/2]); 1: original pairs (x[2i], x[2i+1]). */
nabla_status nabla_rope(nabla_context* ctx, nabla_tensor* x, int64_t offset, double base, int mode,
                        nabla_tensor** out);
/* The same at positions (i32 [T]; NULL: offset, offset+1, ..., else offset
 * must be 0), the first dims elements of each row rotating and the rest
 * passing through (0: all D; Phi-3's partial_rotary_factor, llama.cpp's
 * n_rot), pair i's frequency divided by freq_factors[i] (n_factors = dims/2
 * positive values, or NULL and 0: Llama 3's scaling, longrope's factors),
 * cos and sin multiplied by scale (1: none; longrope's attention factor). */
nabla_status nabla_rope_at(nabla_context* ctx, nabla_tensor* x, nabla_tensor* positions, int64_t offset,
                           double base, int mode, const double* freq_factors, int64_t n_factors, int64_t dims,
                           double scale, nabla_tensor** out);
/* Zeroes elements with probability p and scales the rest by 1/(1-p); the mask
 * is a hash of seed (an i32 tensor of one element: write a new value into it
 * for new masks without recompiling) and salt. train == 0 returns x. */
nabla_status nabla_dropout(nabla_context* ctx, nabla_tensor* x, double p, nabla_tensor* seed, int train,
                           int64_t salt, nabla_tensor** out);

/* Images, NCHW, as PyTorch. Each of stride, padding, dilation, output_padding
 * and kernel is two values (height, width); NULL means the default (stride 1,
 * padding 0, dilation 1, output_padding 0; a pool's stride defaults to its
 * kernel).
 * conv_2d: x [N, C, H, W], w [O, C/groups, KH, KW], bias [O] or NULL.
 * conv_transpose_2d: w [C, O/groups, KH, KW], the adjoint of conv_2d in x. */
nabla_status nabla_conv_2d(nabla_context* ctx, nabla_tensor* x, nabla_tensor* w, nabla_tensor* bias,
                           const int64_t* stride, const int64_t* padding, const int64_t* dilation,
                           int64_t groups, nabla_tensor** out);
nabla_status nabla_conv_transpose_2d(nabla_context* ctx, nabla_tensor* x, nabla_tensor* w,
                                     nabla_tensor* bias, const int64_t* stride, const int64_t* padding,
                                     const int64_t* output_padding, const int64_t* dilation,
                                     int64_t groups, nabla_tensor** out);
nabla_status nabla_avg_pool_2d(nabla_context* ctx, nabla_tensor* x, const int64_t* kernel,
                               const int64_t* stride, const int64_t* padding, nabla_tensor** out);
nabla_status nabla_max_pool_2d(nabla_context* ctx, nabla_tensor* x, const int64_t* kernel,
                               const int64_t* stride, const int64_t* padding, nabla_tensor** out);

/* Shaping and indexing. pad: `rank` (before, after) pairs, 2 * rank values.
 * repeat: tiles x repeats[d] times along each axis (extra leading repeats add
 * axes). argmax and one_hot are not differentiable. */
nabla_status nabla_pad(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* pads, double value,
                       nabla_tensor** out);
nabla_status nabla_repeat(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* repeats,
                          nabla_tensor** out);
/* dst with rows indices[i] replaced by values[i]. */
nabla_status nabla_set_rows(nabla_context* ctx, nabla_tensor* dst, nabla_tensor* indices,
                            nabla_tensor* values, nabla_tensor** out);
nabla_status nabla_argmax(nabla_context* ctx, nabla_tensor* x, int64_t axis, int keepdim,
                          nabla_tensor** out);
nabla_status nabla_one_hot(nabla_context* ctx, nabla_tensor* indices, int64_t classes, nabla_dtype dtype,
                           nabla_tensor** out);

/* ---- Autodiff and running */

/* Records `loss` (one element, f32 or f64) and builds the gradient of every
 * parameter that reaches it. Replaces the loss and gradients of any earlier
 * nabla_backward; handles from earlier calls stay valid. A loss may itself be
 * built from gradients (higher-order derivatives). */
nabla_status nabla_backward(nabla_context* ctx, nabla_tensor* loss);
/* The gradient of parameter `t` from the last nabla_backward (same shape and
 * dtype as t). Its value is available after nabla_compute. */
nabla_status nabla_grad(nabla_context* ctx, nabla_tensor* t, nabla_tensor** out);
/* Plans and runs a graph of `outputs` (n handles; outputs may be NULL when n
 * is 0) plus the loss and gradients of the last nabla_backward. threads <= 0
 * means the default (hardware concurrency). Calling it again with the same
 * outputs and threads, and no nabla_backward in between, reuses the compiled
 * plan and only runs it. */
nabla_status nabla_compute(nabla_context* ctx, nabla_tensor* const* outputs, size_t n, int threads);
/* The bytes the last nabla_compute's plan keeps for intermediates (its
 * arena; leaves, parameters and outputs of their own not counted). */
nabla_status nabla_compute_arena_bytes(nabla_context* ctx, int64_t* out);
/* Gradient checkpointing (recompute() in include/nabla/graph.h) for graphs
 * built call by call: the ops made between nabla_recompute_begin and
 * nabla_recompute_end that `output` depends on are computed again in the
 * backward, from what they read from outside, instead of kept from the
 * forward pass: the same values and gradients in a fraction of the
 * activation memory, the region's forward work done twice (a region per
 * transformer block, say). begin gives the mark end takes; regions may
 * nest. Build the loss and call nabla_backward after. */
nabla_status nabla_recompute_begin(nabla_context* ctx, uint64_t* mark);
nabla_status nabla_recompute_end(nabla_context* ctx, uint64_t mark, nabla_tensor* output);
/* Copies t's value into dst, row-major; `bytes` must be numel * element size.
 * t is a leaf (any time), or an output, loss or gradient of the last
 * nabla_compute (or a view of one). */
nabla_status nabla_tensor_read(nabla_context* ctx, nabla_tensor* t, void* dst, size_t bytes);

/* ---- Checkpoints (safetensors, the format PyTorch, timm and Hugging Face
 * read; see docs/formats.md)
 *
 * nabla_save_safetensors writes leaves (parameters, or any tensor made by
 * nabla_tensor_from_data) under `names` (n of each), at their dtype: to a
 * temporary beside `path`, flushed, then renamed over it, so a crash leaves
 * the old file or the new one. nabla_load_safetensors reads the tensor named
 * names[i] into leaf tensors[i], which must have its shape (and, after the
 * widening that loading does: f16/bf16 to f32, integers to i32, its dtype).
 * Every name is checked before any leaf is written: a file that does not fit
 * changes nothing. */
nabla_status nabla_save_safetensors(nabla_context* ctx, const char* path, const char* const* names,
                                    nabla_tensor* const* tensors, size_t n);
nabla_status nabla_load_safetensors(nabla_context* ctx, const char* path, const char* const* names,
                                    nabla_tensor* const* tensors, size_t n);

/* ---- Training step
 *
 * A trainer compiles forward, loss, backward and a fused AdamW update over
 * every f32 parameter that reaches the loss, once; each step then runs it
 * with no per-tensor host work. This is the path nabla's own `nabla train`
 * takes, so an FFI training loop runs as fast as the C++ one:
 *
 *   nabla_trainer_create(ctx, loss, &logits, 1, 0.9, 0.999, 1e-8, 0.05,
 *                        NULL, 0, 0, 0, &trainer);
 *   for each batch: nabla_tensor_write(ctx, images, ...);
 *                   nabla_tensor_write(ctx, labels, ...);
 *                   nabla_trainer_run(trainer, &loss_value);
 *                   nabla_trainer_update(trainer, lr, 1.0, &grad_norm);
 *
 * Parameters are updated in place: nabla_tensor_read on one reads its new
 * value. Weight decay applies to parameters of rank >= 2 (weights), not to
 * biases and norm gains, nor to the `n_no_decay` parameters listed in
 * no_decay (position embeddings, class tokens). */
typedef struct nabla_trainer nabla_trainer;

/* Flags for nabla_trainer_create (bitwise or). */
enum {
  /* f32 matmuls round operands to bfloat16 and accumulate in f32. */
  NABLA_TRAIN_BF16_MATMUL = 1,
  /* Keeps weight gradients that are products of smaller factors as their
   * factors (linear layers over few tokens); see TrainStep in
   * include/nabla/trainer.h. */
  NABLA_TRAIN_LOW_MEMORY = 2,
  /* The step spans the job this process joined (nabla_job_join): see Jobs
   * below. */
  NABLA_TRAIN_JOB = 4,
  /* With NABLA_TRAIN_JOB: each process holds and updates its part of the
   * AdamW moments alone (ZeRO-1), the same parameters bit for bit in
   * 1/size of the moments' memory. */
  NABLA_TRAIN_SHARD_OPTIMIZER = 8
};
/* Data parallelism inside the process, or'ed into flags with r from 1 to
 * 255: the graph, built for one replica's share of the batch, runs as r
 * copies at once, each on one thread with memory of its own, sharing the
 * parameters, and the update averages their gradients (a batch r times the
 * graph's). Fill replica i's inputs through nabla_trainer_replica. Pays for
 * small models, whose kernels are too short to split well across cores
 * (TrainStep in include/nabla/trainer.h); not with NABLA_TRAIN_LOW_MEMORY. */
#define NABLA_TRAIN_REPLICAS(r) ((int)(r) << 8)

/* loss: one f32 element. extras: `n_extras` more tensors to compute each
 * step (logits for accuracy, say), read with nabla_trainer_read. threads <= 0
 * means the default. The trainer belongs to ctx: it is freed with it, or
 * earlier with nabla_trainer_free. */
nabla_status nabla_trainer_create(nabla_context* ctx, nabla_tensor* loss, nabla_tensor* const* extras,
                                  size_t n_extras, double beta1, double beta2, double eps,
                                  double weight_decay, nabla_tensor* const* no_decay, size_t n_no_decay,
                                  int threads, int flags, nabla_trainer** out);
/* Forward and backward on the values now in the leaves; the loss (the mean
 * over every replica, of every process in a job) goes to *loss when loss is
 * not NULL. In a job, a run that fails on one process (a label out of range)
 * fails on every process, the others with NABLA_ERROR_RUNTIME naming its
 * rank, and counts on none: the job can go on with the next batch. */
nabla_status nabla_trainer_run(nabla_trainer* trainer, float* loss);
/* Clips the gradients to global L2 norm `clip` (0: no clipping) and takes one
 * AdamW step at learning rate lr. The norm before clipping goes to
 * *grad_norm when it is not NULL. */
nabla_status nabla_trainer_update(nabla_trainer* trainer, double lr, double clip, double* grad_norm);
/* Copies the value of the loss, an extra, or a leaf (a parameter's current
 * value) into dst; `bytes` must be numel * element size. */
nabla_status nabla_trainer_read(nabla_trainer* trainer, nabla_tensor* t, void* dst, size_t bytes);
/* Replica `replica`'s copy of t, a tensor of the trainer's graph: an input
 * to fill with nabla_tensor_write before nabla_trainer_run, or an extra to
 * read with nabla_trainer_read after it. Replica 0's is t itself, and so is
 * a parameter's, which the replicas share. */
nabla_status nabla_trainer_replica(nabla_trainer* trainer, int replica, nabla_tensor* t, nabla_tensor** out);
/* How many parameters the trainer updates, their total element count, and
 * how many of their gradients NABLA_TRAIN_LOW_MEMORY keeps as factors (0
 * without the flag). Any out-pointer may be NULL. */
nabla_status nabla_trainer_parameters(nabla_trainer* trainer, int64_t* count, int64_t* elements,
                                      int64_t* factored);
/* The handle of the index-th parameter the trainer updates (0 <= index <
 * count), in the order the loss first reaches them: to save or inspect
 * every parameter without keeping track of them. */
nabla_status nabla_trainer_parameter(nabla_trainer* trainer, int64_t index, nabla_tensor** out);
/* A training checkpoint: every parameter the trainer updates, under
 * names[i] (one per parameter, in nabla_trainer_parameter's order; NULL for
 * "parameter.<i>"), AdamW's moments as "optimizer.exp_avg.<name>" and
 * "optimizer.exp_avg_sq.<name>", and its step count, in one safetensors
 * file written atomically. nabla_trainer_load restores all of it into a
 * trainer of the same model, so that training continues exactly as it would
 * have; a file missing any of it, or with another shape, changes nothing.
 * In a job every process calls both: rank 0 alone writes (the moments
 * gathered to it when sharded), and every process returns its outcome; each
 * process reads the file it names, and none changes anything unless every
 * one read it and they read the same values. */
nabla_status nabla_trainer_save(nabla_trainer* trainer, const char* path, const char* const* names);
nabla_status nabla_trainer_load(nabla_trainer* trainer, const char* path, const char* const* names);
/* Optimizer steps taken. */
nabla_status nabla_trainer_steps(nabla_trainer* trainer, int64_t* out);
void nabla_trainer_free(nabla_trainer* trainer);

/* ---- Fine-tuning
 *
 * A pretrained Llama-family model (a Hugging Face folder, a GGUF file or a
 * nabla checkpoint) with LoRA adapters on its frozen weights (PEFT's
 * formulation and names), or with every weight trained, over token batches
 * the caller makes; the same session `nabla finetune` runs
 * (include/nabla/models/finetune.h):
 *
 *   nabla_finetune_create("SmolLM2-135M", NULL, 16, 32.0, 0.05, 0, NULL,   LoRA r 16 on all seven projections
 *                         4, 256, 0.0, 0, 1, &ft);                       4 rows of 256 tokens a step
 *   nabla_finetune_encode(ft, "text", ids, capacity, &n);     the base's tokenizer
 *   for each batch: nabla_finetune_step(ft, ids, labels, NULL, 2e-4, 1.0, &loss);
 *   nabla_finetune_encode_prompt(ft, "{\"prompt\": \"Q: \"}", NULL, ids, capacity, &n);
 *   nabla_finetune_generate(ft, ids, n, 64, 0.0, 0, 1.0, 1, 0, out, NULL, &m);   the adapter as trained so far
 *   nabla_finetune_decode(ft, out, m, text, capacity, &length);
 *   nabla_finetune_save(ft, "adapter");           a PEFT folder
 *   nabla_finetune_save_gguf(ft, "adapter.gguf"); llama.cpp's adapter GGUF
 *
 * A session is not tied to a context; free it with nabla_finetune_free. */
typedef struct nabla_finetune nabla_finetune;
/* Options of nabla_finetune_create, or-ed together. RSLORA: scale alpha /
 * sqrt(r). GRADIENT_CHECKPOINTING: each block's activations and the logits
 * recomputed in the backward (a fraction of the memory, about a third more
 * time). DEQUANTIZE_BASE: read a GGUF or BF16 base's projections as f32
 * instead of computing in their storage type (QLoRA, the default). */
#define NABLA_FINETUNE_RSLORA 1
#define NABLA_FINETUNE_GRADIENT_CHECKPOINTING 2
#define NABLA_FINETUNE_DEQUANTIZE_BASE 4
/* JOB: the step spans the job this process joined (nabla_job_join; see Jobs
 * below), each process giving its batch / size rows a step.
 * SHARD_OPTIMIZER: with JOB, ZeRO-1 (as NABLA_TRAIN_SHARD_OPTIMIZER). */
#define NABLA_FINETUNE_JOB 8
#define NABLA_FINETUNE_SHARD_OPTIMIZER 16
/* DORA: weight-decomposed adapters (PEFT's use_dora): each adapted weight
 * becomes m * (W + scale B A) / ||W + scale B A|| per output row, the
 * magnitude m trained with A and B. Saved as PEFT writes it; llama.cpp's
 * adapter GGUF cannot hold it (nabla_finetune_save_gguf refuses). */
#define NABLA_FINETUNE_DORA 32
/* Data parallelism inside the process, or'ed into flags with r from 1 to
 * 255: the step's rows split among r copies of the model's graph, one per
 * thread (as NABLA_TRAIN_REPLICAS). */
#define NABLA_FINETUNE_REPLICAS(r) ((int)(r) << 8)
/* base: the pretrained model. adapter_dir: a PEFT folder to start from (its
 * r, alpha, dropout and targets replace the arguments'), or NULL for fresh
 * adapters. lora_r: the adapters' rank, 0 for full fine-tuning; their scale
 * alpha / r; flags: NABLA_FINETUNE_* (1 alone: rsLoRA); lora_dropout on their
 * inputs while training; lora_targets: comma-separated module names
 * (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; Phi-3's
 * qkv_proj, o_proj, gate_up_proj, down_proj), NULL for all of the model's. batch rows of context tokens a step (context 0: the model's
 * positions, at most 512). AdamW with weight_decay (betas 0.9, 0.999, eps
 * 1e-8). threads <= 0: every core. seed: the adapters' initialisation and
 * dropout masks. */
nabla_status nabla_finetune_create(const char* base, const char* adapter_dir, int64_t lora_r, double lora_alpha,
                                   double lora_dropout, int flags, const char* lora_targets, int64_t batch,
                                   int64_t context, double weight_decay, int threads, uint64_t seed,
                                   nabla_finetune** out);
/* The rows each nabla_finetune_step takes (the session's batch, divided
 * among a job's processes), tokens per row, vocabulary size and trained
 * element count. Any out-pointer may be NULL. */
nabla_status nabla_finetune_shape(nabla_finetune* ft, int64_t* batch, int64_t* context, int64_t* vocab,
                                  int64_t* trained);
/* text (UTF-8, NUL-terminated) in the base's tokenizer: up to `capacity`
 * ids into ids, their full count into *count (call again with more room
 * when it exceeds capacity). */
nabla_status nabla_finetune_encode(nabla_finetune* ft, const char* text, int32_t* ids, int64_t capacity,
                                   int64_t* count);
/* One example as `nabla finetune --data` reads a line (a JSON object:
 * {"text": S}, {"prompt": P, "completion": C} or {"messages": [{"role",
 * "content"}, ...]}, docs/formats.md): its ids and labels (-100 where the loss
 * does not count), up to `capacity` of each, the full count into *count.
 * Messages are rendered in chat_template ("chatml", "llama3", "llama3.1",
 * "llama3.2", "gemma", "phi3", "phi4", "smollm3", "qwen3"), or with NULL or
 * "auto" in the base's own (ChatML when it has none; a template nabla does
 * not render is refused); dated templates take today's date.
 * NABLA_ERROR_ARGUMENT naming what is wrong with the line. */
nabla_status nabla_finetune_encode_example(nabla_finetune* ft, const char* line, const char* chat_template,
                                           int32_t* ids, int32_t* labels, int64_t capacity, int64_t* count);
/* What a line's reply is generated from, as ids (for
 * nabla_finetune_generate): {"prompt": P} (a "completion", when given, left
 * out) and {"text": S} as the base's tokenizer starts a text; {"messages":
 * [...]} less a last assistant message, rendered as
 * nabla_finetune_encode_example renders it, then the template's generation
 * prompt (the assistant's header). Up to `capacity` ids, the full count into
 * *count. NABLA_ERROR_ARGUMENT naming what is wrong with the line. */
nabla_status nabla_finetune_encode_prompt(nabla_finetune* ft, const char* line, const char* chat_template,
                                          int32_t* ids, int64_t capacity, int64_t* count);
/* Options of nabla_finetune_generate. IGNORE_EOS: run to max_tokens, not
 * stopping at the end of text or of a chat turn. */
#define NABLA_GENERATE_IGNORE_EOS 1
/* The prompt's prompt_count ids continued by the session's model as it
 * stands (the adapters trained so far; no dropout), up to max_tokens new ids
 * into out (room for max_tokens), their count into *generated. Generation
 * stops before the tokenizer's end of text or a chat template's end of turn
 * ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"; `nabla sample`'s
 * set). Each id drawn from the softmax of logits / temperature (<= 0:
 * greedy) over the top_k likeliest (0: the whole vocabulary), within the
 * likeliest whose probability reaches top_p (in (0, 1]; 1: all); seed: the
 * draws. logprobs: NULL, or room for max_tokens log-probabilities, each new
 * id's under the model (before temperature and top-k). The model's context
 * bounds prompt and reply together. */
nabla_status nabla_finetune_generate(nabla_finetune* ft, const int32_t* prompt, int64_t prompt_count,
                                     int64_t max_tokens, double temperature, int64_t top_k, double top_p,
                                     uint64_t seed, int flags, int32_t* out, float* logprobs, int64_t* generated);
/* ids as UTF-8 text in the base's tokenizer: up to `capacity` bytes into
 * text, NUL-terminated when there is room, the full byte count (without the
 * NUL) into *length. */
nabla_status nabla_finetune_decode(nabla_finetune* ft, const int32_t* ids, int64_t count, char* text,
                                   int64_t capacity, int64_t* length);
/* One optimizer step on a batch of [batch, context] i32 input_ids and
 * labels (Hugging Face's: position t predicts labels[t + 1]; -100 is not
 * counted); segments NULL (a row is one sequence) or [batch, context] ids of
 * the documents packed in each row, attention staying within an id; batch
 * as nabla_finetune_shape says. AdamW at lr after clipping the global norm
 * to clip (0: none). The step's gradient is that of the mean loss over every
 * counted token of the step (of every replica and process): the mean goes
 * to *loss when it is not NULL. */
nabla_status nabla_finetune_step(nabla_finetune* ft, const int32_t* input_ids, const int32_t* labels,
                                 const int32_t* segments, double lr, double clip, float* loss);
/* The adapter as a PEFT folder (adapter_config.json,
 * adapter_model.safetensors), or with full fine-tuning the model as a
 * Hugging Face folder; the folder is created when missing. In a job, every
 * process calls it (and nabla_finetune_save_gguf): rank 0 alone writes, and
 * every process returns its outcome. */
nabla_status nabla_finetune_save(nabla_finetune* ft, const char* dir);
/* The adapter as llama.cpp's LoRA GGUF (llama-cli --lora). */
nabla_status nabla_finetune_save_gguf(nabla_finetune* ft, const char* path);
/* Accepts NULL. */
void nabla_finetune_free(nabla_finetune* ft);

/* ---- Jobs: training over processes and machines
 *
 * A program started by a launcher as several processes (Open MPI:
 * `mpirun -np 2 ruby train.rb`, on several machines with --host) joins their
 * job with nabla_job_join. A trainer created with NABLA_TRAIN_JOB, or a
 * fine-tuning session with NABLA_FINETUNE_JOB, then runs each step over all
 * of them: each process computes the gradients of its share of the batch,
 * and the shares are summed in rank order, so that every process updates
 * the same parameters, bit for bit as one process with size x r replicas
 * would (include/nabla/distributed.h). A trainer's replica i in rank k is
 * replica k x r + i of the whole step: give it that share of each batch.
 *
 *   nabla_job_join(&job);
 *   nabla_job_rank(job, &rank, &size);
 *   nabla_trainer_create(ctx, loss, ..., NABLA_TRAIN_JOB | NABLA_TRAIN_REPLICAS(r), &trainer);
 *
 * A process started alone joins a job of one (rank 0 of 1): the same program
 * runs with and without the launcher. There is one job per process: joining
 * again while a handle, trainer or session holds it gives another handle to
 * it; once all are freed the process has left it, and a process a launcher
 * started cannot join again (MPI's rule). Every process must make the same
 * job-wide calls (create, run, update, save, load, the nabla_job_*
 * functions) in the same order, from one thread at a time; processes that
 * build different steps (parameters, values, options) get an error from
 * the create, naming what differs. A process that dies ends the job: the
 * launcher stops the others. */
typedef struct nabla_job nabla_job;
nabla_status nabla_job_join(nabla_job** out);
/* This process's rank (0 to size - 1) and the job's process count. Either
 * out-pointer may be NULL. */
nabla_status nabla_job_rank(nabla_job* job, int* rank, int* size);
/* "MPI (Open MPI v4.1.4), 2 processes on 1 host", or "1 process (no
 * launcher)"; valid while the job is. */
nabla_status nabla_job_describe(nabla_job* job, const char** out);
/* values[0, n) on every process becomes the sum of every process's, added
 * in rank order (the same on every process): metrics such as correct
 * counts, losses or token counts. */
nabla_status nabla_job_sum(nabla_job* job, double* values, size_t n);
/* `bytes` of data from process `root` into every process's data: a seed, a
 * data order, weights made on one process. */
nabla_status nabla_job_broadcast(nabla_job* job, void* data, size_t bytes, int root);
/* Returns once every process has called it. */
nabla_status nabla_job_barrier(nabla_job* job);
/* Frees this handle; the process leaves the job when nothing holds it.
 * Accepts NULL. */
void nabla_job_free(nabla_job* job);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NABLA_H */
