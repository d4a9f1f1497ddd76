// Building blocks for models: named parameters, seeded initialisers, and the
// layers ViT and GPT-2 are made of. A layer holds its parameter leaves and
// builds graph ops when called; it computes nothing itself.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "nabla/ops.h"
#include "nabla/tensor.h"

namespace nabla {
class Executor;
}

namespace nabla::nn {

// A weight kept in one of ggml's storage types (a quantized or bf16 base
// under adapters, QLoRA's): the leaf is u8 [rows, row bytes], each row
// `cols` elements of `type`, computed with matmul_quantized.
struct StoredFormat {
  GgmlType type;
  int64_t cols = 0;
};

// Tensors a model takes as its parameters instead of drawing its own (a
// model built on a file's weights, allocating nothing of its own).
struct WeightSource {
  std::string origin;  // the file, named in errors
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<std::pair<std::string, StoredFormat>> formats;  // tensors kept in a storage type
};

// Parameters by name (timm / Hugging Face names), in creation order.
class Params {
 public:
  // Adds a leaf as a trainable parameter under `name`. With a source, the
  // source's tensor of that name is added instead: f32 of t's shape, or in
  // a storage format with t's rows and columns (IoError naming the origin
  // and the tensor when it is missing or differs). A stored one is frozen
  // from the start: no op differentiates a storage type.
  Tensor add(const std::string& name, Tensor t);
  // Takes parameters from `source` from now on (see add); init with
  // Init::placeholders() so that nothing is drawn or touched first. An
  // empty source ends it.
  void take_from(WeightSource source) { source_ = std::move(source); }
  // The storage format of a parameter kept in one; nullptr for f32 ones.
  const StoredFormat* format(const std::string& name) const;
  // Every parameter stops being one (no gradient is built for it) but stays
  // listed, to be loaded and saved: a base model under adapters.
  void freeze();
  const std::vector<std::pair<std::string, Tensor>>& list() const { return list_; }
  const Tensor& get(const std::string& name) const;  // UsageError naming it when absent
  int64_t count() const;                               // total elements (a stored weight's, not its bytes)

 private:
  std::vector<std::pair<std::string, Tensor>> list_;
  std::vector<std::pair<std::string, StoredFormat>> formats_;
  WeightSource source_;
};

// Seeded initialisers writing into f32 leaves. Linear layers draw their
// weights from weight(): truncated normal as timm, or plain normal as
// Hugging Face's GPT-2.
class Init {
 public:
  enum class Weights { trunc_normal, normal };
  explicit Init(uint64_t seed, Weights weights = Weights::trunc_normal) : rng_(seed), weights_(weights) {}
  // Tensors of the right shapes whose values are never written
  // (Tensor::empty): for a model whose Params take a WeightSource.
  static Init placeholders() {
    Init i(0);
    i.draw_ = false;
    return i;
  }
  // Normal(0, std) redrawn outside +-2 std (timm's trunc_normal_ with a = -2std, b = 2std).
  Tensor trunc_normal(Shape shape, double std);
  Tensor normal(Shape shape, double std);
  Tensor uniform(Shape shape, double lo, double hi);
  Tensor weight(Shape shape, double std) {
    return weights_ == Weights::normal ? normal(std::move(shape), std) : trunc_normal(std::move(shape), std);
  }
  Tensor zeros(Shape shape) { return draw_ ? Tensor::zeros(DType::f32, std::move(shape)) : placeholder(std::move(shape)); }
  Tensor ones(Shape shape) {
    return draw_ ? Tensor::full(DType::f32, std::move(shape), 1.0) : placeholder(std::move(shape));
  }

 private:
  static Tensor placeholder(Shape shape) { return Tensor::empty(DType::f32, std::move(shape)); }
  std::mt19937_64 rng_;
  Weights weights_;
  bool draw_ = true;
};

enum class Gelu { tanh, erf, quick };
Gelu parse_gelu(const std::string& name);  // "gelu" (tanh), "gelu_erf", "gelu_quick"
const char* gelu_name(Gelu g);
Tensor apply_gelu(Gelu g, const Tensor& x);

// How a linear layer stores its weight: [out, in] as PyTorch's nn.Linear
// (timm, Llama), or [in, out] as Hugging Face's Conv1D (GPT-2).
enum class WeightLayout { out_in, in_out };

// A low-rank adapter on a linear layer (LoRA, as PEFT computes it): the
// layer's output gains scale * dropout(x) A^T B^T, A [r, in], B [out, r].
// With a magnitude m [out] (DoRA, PEFT's use_dora): the weight becomes
// m * (W + scale B A) / ||W + scale B A|| per output row, the norm a
// constant to the backward; with dropout on x_d, PEFT's
// x W^T + (m / n - 1) x_d W^T + (m / n) scale x_d A^T B^T (+ bias).
struct LoraAdapter {
  Tensor a, b;
  Tensor magnitude;  // DoRA's [out], when defined
  double scale = 1;
  double dropout = 0;  // on the adapter's input, while training
  Tensor dropout_seed;  // i32 [1] leaf (nn::Dropout's), when dropout > 0
  int64_t salt = 0;     // the adapter's own mask stream
  bool defined() const { return a.defined(); }
};

// y = x W^T + b (out_in) or x W + b (in_out), plus the adapter's term.
struct Linear {
  Tensor weight, bias;  // bias undefined when not used
  WeightLayout layout = WeightLayout::out_in;
  std::optional<StoredFormat> stored;  // weight u8 in this format (out_in), when Params took it so
  std::string name;  // the module's path ("model.layers.0.self_attn.q_proj")
  LoraAdapter lora;  // undefined unless add_lora gave it one
  Linear() = default;
  Linear(Params& p, const std::string& prefix, int64_t in, int64_t out, bool bias, Init& init, double std = 0.02,
         WeightLayout layout = WeightLayout::out_in);
  // `train` turns the adapter's dropout on.
  Tensor operator()(const Tensor& x, bool train = false) const;
  // Folds the adapter into the weight (W += scale B A, summed in double;
  // DoRA's rows then scaled by m / ||row||) and drops it: the layer computes
  // the same without it. UsageError for a stored (quantized) weight: merge
  // into the f32 base instead.
  void merge_adapter();
  // DoRA's ||W + scale B A|| per output row [out], detached.
  Tensor dora_norm() const;
  int64_t in_features() const { return stored ? stored->cols : weight.dim(layout == WeightLayout::out_in ? 1 : 0); }
  int64_t out_features() const { return weight.dim(layout == WeightLayout::out_in ? 0 : 1); }
  // The layer restricted to output features [begin, end): views of the
  // weight, bias and adapter's B that the products read in place, so
  // gradients land in the whole tensors (a fused q/k/v projection split
  // three ways).
  Linear outputs(int64_t begin, int64_t end) const;
};

// LoRA's settings, as PEFT's LoraConfig names them.
struct LoraConfig {
  int64_t r = 8;
  double alpha = 8;
  double dropout = 0;
  bool rslora = false;               // scale alpha / sqrt(r) instead of alpha / r
  bool dora = false;                 // PEFT's use_dora: a trained magnitude per output row
  std::vector<std::string> targets;  // module names' last parts (q_proj, ...) that get an adapter
  double scale() const;
  void validate() const;  // UsageError naming the bad setting
};

// Gives every layer whose name's last part is one of c.targets an adapter:
// A drawn as PEFT does (kaiming_uniform_ with a = sqrt(5): U(+-1/sqrt(in))),
// B zero, so the model starts as it was. A and B join `adapters` as PEFT
// names them: "base_model.model." + name + ".lora_A.weight" / ".lora_B.weight";
// with c.dora the magnitude too, ".lora_magnitude_vector", set to the
// weight's row norms (the layers' weights must be loaded by then).
// Layers in the given order; UsageError when a target matches no layer.
void add_lora(const std::vector<Linear*>& layers, const LoraConfig& c, Params& adapters, Init& init,
              const Tensor& dropout_seed);

// Over the last axis: LayerNorm with weight (ones) and bias (zeros), or
// RMSNorm (Llama's) with weight alone.
// rms_unit_offset: RMSNorm scaled by 1 + weight, the weight starting at 0
// (Gemma's).
enum class NormKind { layer, rms, rms_unit_offset };
struct Norm {
  Tensor weight, bias;  // bias undefined for RMSNorm
  double eps = 1e-5;
  NormKind kind = NormKind::layer;
  Norm() = default;
  Norm(Params& p, const std::string& prefix, int64_t dim, double eps, Init& init, NormKind kind = NormKind::layer);
  Tensor operator()(const Tensor& x) const;
};

// Rows of weight [vocab, dim] by i32 index; a stored weight's rows are
// gathered as bytes and dequantized.
struct Embedding {
  Tensor weight;
  std::optional<StoredFormat> stored;  // weight u8 in this format, when Params took it so
  Embedding() = default;
  Embedding(Params& p, const std::string& name, int64_t vocab, int64_t dim, Init& init, double std = 0.02);
  Tensor operator()(const Tensor& indices) const;
  // x [..., dim] against every row: the tied head's logits [..., vocab].
  Tensor logits(const Tensor& x) const {
    return stored ? matmul_quantized(x, weight, stored->type, stored->cols) : matmul(x, transpose(weight));
  }
};

// Zeroes activations with probability p while training. The seed is an i32
// leaf the trainer rewrites every step, so one compiled graph draws new masks.
struct Dropout {
  double p = 0;
  Tensor seed;
  Tensor operator()(const Tensor& x, bool train, int64_t salt) const;
};

// Rotary positions as Hugging Face rotates them (rotate-half pairs) with
// base theta (0: none), on each query and key head.
struct Rotary {
  double theta = 0;
  int64_t dims = 0;  // the rotated first part of each head (Phi-3's partial_rotary_factor); 0: all of it
  // dims / 2 divisors of the frequencies (Llama 3's scaled ones, longrope's
  // short ones); empty: none.
  std::vector<double> freq_factors;
  // longrope's: the divisors for rows (a decoding session: its cache)
  // longer than long_after positions, as transformers switches at
  // original_max_position_embeddings.
  std::vector<double> long_factors;
  int64_t long_after = 0;
  double scale = 1;  // on cos and sin: longrope's attention factor

  bool on() const { return theta > 0; }
  // t [..., T, hd] at positions i32 [T] (or offset, offset + 1, ...), in a
  // row or session of `length` positions.
  Tensor operator()(const Tensor& t, const Tensor& positions, int64_t length) const;
  Tensor operator()(const Tensor& t, int64_t offset, int64_t length) const;

 private:
  const std::vector<double>& factors_for(int64_t length) const {
    return !long_factors.empty() && length > long_after ? long_factors : freq_factors;
  }
};

// What a pre-norm transformer block is made of; each model fills it from
// its own config. Parameter names are relative to the block's prefix.
// ViT's and GPT-2's: LayerNorm, one fused qkv projection, a GELU MLP.
// Llama's: RMSNorm, q, k and v projections of their own with kv_heads
// key/value heads shared by groups of query heads (grouped-query attention),
// rotary positions, and a SwiGLU MLP (gate set).
struct BlockConfig {
  int64_t dim = 0, heads = 1, mlp_hidden = 0;
  int64_t kv_heads = 0;  // 0: heads
  int64_t head_dim = 0;  // 0: dim / heads
  double norm_eps = 1e-5;
  NormKind norm = NormKind::layer;
  Gelu gelu = Gelu::erf;
  Rotary rope;  // rotary positions; none by default
  bool causal = false;
  int64_t window = 0;    // causal only: each token attends to its last `window` tokens (a sliding window); 0: all
  double attn_scale = 0;  // the scores' scale; 0: 1/sqrt(head size)
  // Gemma 2's soft-capped scores, cap * tanh(scale q k / cap) before the
  // softmax (0: none).
  double attn_softcap = 0;
  bool qkv_bias = true;  // the q/k/v projections' biases
  bool bias = true;      // the other projections' biases
  WeightLayout layout = WeightLayout::out_in;
  double init_std = 0.02;   // init of the projections
  double resid_std = 0.02;  // init of those that write into the residual stream (attention's and the MLP's output)
  double dropout = 0;       // after attention and after the MLP
  Tensor dropout_seed;
  std::string norm1 = "norm1", qkv = "attn.qkv", proj = "attn.proj", norm2 = "norm2", fc1 = "mlp.fc1",
              fc2 = "mlp.fc2";  // timm's names
  // qkv holds the queries' heads * head size rows, then the keys' and the
  // values' kv_heads * head size each (Phi-3's qkv_proj). Separate q, k, v
  // projections where qkv is empty (Llama's q_proj, ...).
  std::string q, k, v;
  // SwiGLU where set: fc2(silu(gate(x)) * fc1(x)), fc1 being Llama's up_proj;
  // with gate_gelu, GeGLU: the gate through `gelu` instead (Gemma's).
  // gate_up instead: one projection holding the gate's rows then fc1's
  // (Phi-3's gate_up_proj).
  std::string gate, gate_up;
  bool gate_gelu = false;
  // Where set, norms of attention's and the MLP's outputs before each joins
  // the residual stream (Gemma's post_attention / post_feedforward norms).
  std::string post_norm1, post_norm2;
  // Where set, an RMSNorm (norm's kind where that is one) of each query / key
  // head (weights [hd]) before the rotary positions: Qwen3's and Gemma 3's
  // q_norm and k_norm.
  std::string q_norm, k_norm;

  int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : dim / heads; }
};

// Keys and values of the positions decoded so far, for one block's
// attention to take one new token at a time (TransformerBlock::decode).
// A prompt's pass records into one (Attention::operator()'s `record`);
// `positions` then says how many the decoding session spans (longrope's
// factors depend on it; 0: the prompt's).
struct KvCache {
  Tensor keys, values;          // leaves [N, kv heads, Tmax, hd], filled by the caller from new_keys / new_values
  Tensor mask;                  // [N or 1, Tmax + 1]: 0 where a position is written (and at Tmax, the new
                                // token itself), -inf elsewhere; one mask may serve every block
  Tensor new_keys, new_values;  // outputs [N, kv heads, 1, hd]: the new token's, set by decode
  Tensor position;              // i32 [1]: the new token's position, for rotary positions
  int64_t positions = 0;        // a prompt's record: the session's length
};

struct TransformerBlock;

// One step of a decoder with key/value caches (sampling): the new token and
// its position in, its logits and every block's new keys and values out.
// After running it (compiled with every k_new and v_new as outputs),
// `remember` writes the new keys and values into the caches at the position
// and opens the mask there for the steps after.
struct DecodeStep {
  Tensor token, position, mask;          // inputs: i32 [1], i32 [1], f32 [1, Tmax + 1] (0 or -inf)
  std::vector<Tensor> k_cache, v_cache;  // per block [1, kv heads, Tmax, hd] leaves
  std::vector<Tensor> k_new, v_new;      // per block [1, kv heads, 1, hd] outputs
  Tensor logits;                         // [1, V]

  std::vector<Tensor> outputs() const;  // logits, then each block's k_new and v_new
  void remember(const Executor& ex, int64_t position);

  // The inputs of a step over `max_tokens` positions, the mask all closed.
  explicit DecodeStep(int64_t max_tokens);
  // x [1, 1, D] through `blocks`, each with a cache of its own recorded here.
  Tensor through(const std::vector<TransformerBlock>& blocks, Tensor x, int64_t kv_heads, int64_t head_dim);

  // A prompt's pass: its P tokens at once (causal attention, matrix
  // products), then decoding steps from position P. Its graph takes tokens
  // i32 [1, P] and gives the last token's logits [1, V] and each block's
  // keys and values [1, P, kv heads, hd] (as a step's new ones, rotated).
  struct Prompt {
    int64_t positions = 0;  // the decoding session's length (0: the prompt's)
    Tensor tokens, logits;
    std::vector<Tensor> keys, values;
    std::vector<Tensor> outputs() const;  // logits, then each block's keys and values
  };
  // x [1, P, D] through `blocks`, recording their keys and values in `p`.
  static Tensor prompt_through(const std::vector<TransformerBlock>& blocks, Tensor x, Prompt& p);
  // After the prompt's graph ran: its keys and values into the caches at
  // positions [0, P), and the mask opened there. UsageError when P exceeds
  // the caches or the blocks differ.
  void remember_prompt(const Executor& ex, const Prompt& p);
};

// Multi-head self-attention with one fused qkv projection (timm's Attention,
// GPT-2's c_attn) or three (Llama's), kv_heads <= heads key/value heads,
// optionally rotary positions. x [N, T, D] -> [N, T, D]; with queries > 0,
// only the first `queries` tokens' outputs, [N, queries, D] (all T tokens
// are keys and values; not causal).
struct Attention {
  Linear qkv, q, k, v, proj;  // qkv, or q, k and v
  Norm q_norm, k_norm;        // per head, when the config names them
  int64_t heads = 1, kv_heads = 1, head_dim = 0;
  Rotary rope;
  bool causal = false;
  int64_t window = 0;  // a sliding window (BlockConfig::window)
  double scale = 0;    // the scores' scale
  double softcap = 0;  // BlockConfig::attn_softcap
  Attention() = default;
  Attention(Params& p, const std::string& prefix, const BlockConfig& c, Init& init);
  // With `record`, its new_keys and new_values are set to the keys (rotated)
  // and values of every token, [N, T, kv heads, hd] (a prompt's pass).
  // `train` turns the projections' adapter dropout on. segments (i32 [N, T]):
  // each token attends within its segment id only (packed documents).
  Tensor operator()(const Tensor& x, int64_t queries = 0, KvCache* record = nullptr, bool train = false,
                    const Tensor& segments = Tensor()) const;
  // One new token per row, x [N, 1, D], attending to the cache and itself.
  Tensor decode(const Tensor& x, KvCache& cache) const;
  std::vector<Linear*> linears();  // qkv or q, k, v; then proj

 private:
  Tensor project(int64_t i, const Tensor& x, bool train = false) const;  // q, k or v: [N, T, heads (kv_heads), hd]
  // t [N, T, h, hd] rotated at positions 0.. in a row or session of `length`.
  Tensor rotary(const Tensor& t, int64_t length) const;
  Tensor per_query_head(const Tensor& t) const;  // [N, T, kv_heads, hd] -> [N, T, heads, hd]
  Tensor window_mask(const KvCache& cache, int64_t Tm) const;
  // A decoded token's probabilities from soft-capped scores (softcap > 0).
  Tensor capped_probs(const Tensor& scores, const Tensor& mask) const;
};

// fc1 -> GELU -> fc2, SwiGLU: fc2(silu(gate(x)) * fc1(x)), or GeGLU:
// fc2(gelu(gate(x)) * fc1(x)).
struct Mlp {
  Linear fc1, fc2, gate;  // gate: SwiGLU's or GeGLU's, when defined
  Linear gate_up;         // or gate and fc1 in one (BlockConfig::gate_up), when defined
  Gelu gelu = Gelu::erf;
  bool gate_gelu = false;  // GeGLU
  Mlp() = default;
  Mlp(Params& p, const std::string& prefix, const BlockConfig& c, Init& init);
  Tensor operator()(const Tensor& x, bool train = false) const;
  std::vector<Linear*> linears();  // gate_up or gate (when gated) and fc1; then fc2
};

// Pre-LN transformer block: x + attn(norm1(x)), then + mlp(norm2(.)): ViT's
// and GPT-2's. With keep > 0, only the first `keep` tokens' outputs
// [N, keep, D], the other tokens serving as keys and values only: a last
// block whose output feeds a class token alone computes no other token's
// rows (the same values and gradients as the whole block sliced, without
// dropout; dropout then draws its masks over the smaller tensor).
struct TransformerBlock {
  Norm norm1, norm2;
  Norm post_norm1, post_norm2;  // where BlockConfig names them
  Attention attn;
  Mlp mlp;
  Dropout drop;
  // Gradient checkpointing: operator()'s activations are recomputed in the
  // backward from the block's input (recompute()), not kept.
  bool checkpointed = false;
  TransformerBlock() = default;
  TransformerBlock(Params& p, const std::string& prefix, const BlockConfig& c, Init& init);
  // segments: as Attention's.
  Tensor operator()(const Tensor& x, bool train, int64_t salt, int64_t keep = 0,
                    const Tensor& segments = Tensor()) const;
  // The same block for one new token per row, x [N, 1, D], with a key/value
  // cache of the earlier positions (inference: no dropout).
  Tensor decode(const Tensor& x, KvCache& cache) const;
  // Inference over every token of x [N, T, D], its keys and values recorded
  // in `record` (Attention::operator()'s).
  Tensor prompt(const Tensor& x, KvCache& record) const;
  // Its linear layers, attention's then the MLP's (add_lora's order).
  std::vector<Linear*> linears();

 private:
  // The two residual branches around attention's output a.
  Tensor residuals(const Tensor& x, const Tensor& a, bool train, int64_t salt) const;
};

// A language model's loss under gradient checkpointing: the cross-entropy of
// logits(rows of h) against targets (h [..., D], targets i32 [...],
// ignore_index not counted), the mean over counted rows, taken `chunk_rows`
// rows at a time, each chunk's logits recomputed in the backward: never all
// [rows, V] logits at once. The unchunked loss's value and gradients.
Tensor chunked_cross_entropy(const Tensor& h, const Tensor& targets, const std::function<Tensor(const Tensor&)>& logits,
                             int64_t chunk_rows, int64_t ignore_index = -100);

// Non-overlapping patches by a conv with stride = kernel = patch:
// [N, C, H, W] -> tokens [N, (H/P)(W/P), D].
struct PatchEmbed {
  Tensor weight, bias;  // [D, C, P, P], [D]
  int64_t patch = 16;
  PatchEmbed() = default;
  PatchEmbed(Params& p, const std::string& prefix, int64_t in_chans, int64_t dim, int64_t patch, Init& init);
  Tensor operator()(const Tensor& images) const;
};

}  // namespace nabla::nn
