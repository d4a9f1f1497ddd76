// GPT-2, Hugging Face layout.
//
// Dimensions:
//   B  batch            T  tokens per row (<= n_positions)
//   V  vocabulary       D  n_embd         L  n_layer
//   H  n_head           hd = D / H        F  MLP width = 4D
//
// Parameters (Hugging Face names; Conv1D weights are [in, out]):
//   wte.weight                 [V, D]      (also the output head: tied)
//   wpe.weight                 [n_positions, D]
//   h.i.ln_1.weight/bias       [D]
//   h.i.attn.c_attn.weight     [D, 3D]     h.i.attn.c_attn.bias  [3D]
//   h.i.attn.c_proj.weight     [D, D]      h.i.attn.c_proj.bias  [D]
//   h.i.ln_2.weight/bias       [D]
//   h.i.mlp.c_fc.weight        [D, F]      h.i.mlp.c_fc.bias     [F]
//   h.i.mlp.c_proj.weight      [F, D]      h.i.mlp.c_proj.bias   [D]
//   ln_f.weight/bias           [D]
#include "nabla/models/gpt2.h"

#include <cmath>
#include <limits>

#include "nabla/checkpoint.h"
#include "nabla/config.h"
#include "nabla/error.h"

namespace nabla::models {

void Gpt2Config::validate() const {
  auto fail = [](const std::string& m) { throw UsageError("gpt2 config: " + m); };
  if (vocab_size <= 0 || n_positions <= 0 || n_layer < 0 || n_head <= 0 || n_embd <= 0) {
    fail("sizes must be positive");
  }
  // Token ids and positions are i32; the bound also keeps sizes from overflowing.
  constexpr int64_t kMaxSize = std::numeric_limits<int32_t>::max();
  if (vocab_size > kMaxSize || n_positions > kMaxSize || n_layer > kMaxSize || n_embd > kMaxSize / 4) {
    fail("sizes must be at most 2^31 - 1 (n_embd at most 2^29 - 1)");
  }
  if (!(layer_norm_epsilon >= 0 && layer_norm_epsilon < 1)) fail("layer_norm_epsilon must be in [0, 1)");
  if (n_embd % n_head) {
    fail("n_embd " + std::to_string(n_embd) + " is not divisible by n_head " + std::to_string(n_head));
  }
  if (!(dropout >= 0 && dropout < 1)) fail("dropout must be in [0, 1)");
  if (tokenizer != "byte" && tokenizer != "gpt2" && !tokenizer.ends_with(".json") && !tokenizer.ends_with(".gguf")) {
    fail("tokenizer must be \"byte\", \"gpt2\" or the path of a tokenizer.json or .gguf");
  }
  nn::parse_gelu(gelu);
}

namespace {

// The checkpoint's "nabla.config": Hugging Face's names.
ConfigFields fields_of(Gpt2Config& c) {
  ConfigFields f("gpt2 config", "gpt2");
  f.optional("preset", c.preset)
      .required("vocab_size", c.vocab_size)
      .required("n_positions", c.n_positions)
      .required("n_layer", c.n_layer)
      .required("n_head", c.n_head)
      .required("n_embd", c.n_embd)
      .optional("layer_norm_epsilon", c.layer_norm_epsilon)
      .optional("dropout", c.dropout)
      .optional("bias", c.bias)
      .optional("gelu", c.gelu)
      .optional("tokenizer", c.tokenizer);
  return f;
}

}  // namespace

std::string Gpt2Config::to_json() const {
  Gpt2Config c = *this;
  return fields_of(c).to_json();
}

Gpt2Config Gpt2Config::from_json(const std::string& text) {
  Gpt2Config c;
  fields_of(c).from_json(text);
  c.validate();
  return c;
}

int64_t Gpt2Config::parameter_count() const {
  // Mirrors Gpt2::Gpt2 (a test compares it with the built model), in double
  // so that no config can overflow it.
  const double D = double(n_embd), b = bias ? 1 : 0;
  const double block = 2 * D + 3 * D * D + b * 3 * D + D * D + b * D + 2 * D + 4 * D * D + b * 4 * D + 4 * D * D + b * D;
  const double n = double(vocab_size) * D + double(n_positions) * D + double(n_layer) * block + 2 * D;
  return n >= 9.2e18 ? INT64_MAX : int64_t(n);
}

Gpt2Config gpt2_config_from_checkpoint(const Checkpoint& ckpt) { return config_from_checkpoint<Gpt2Config>(ckpt); }

Gpt2Config gpt2_preset(const std::string& name) {
  Gpt2Config c;
  c.preset = name;
  if (name == "gpt2") return c;  // the 124M model
  if (name == "gpt2-small-byte") {
    // Bytes as tokens, 6 layers of width 384, 256 tokens of context: small
    // enough to learn English spelling and words from fortunes in minutes on
    // two cores (nanoGPT's character-level shape).
    c.vocab_size = 256;
    c.n_positions = 256;
    c.n_layer = 6;
    c.n_head = 6;
    c.n_embd = 384;
    c.dropout = 0.0;
    c.tokenizer = "byte";
    return c;
  }
  throw UsageError("gpt2: unknown preset '" + name + "' (presets: gpt2, gpt2-small-byte)");
}

Gpt2::Gpt2(const Gpt2Config& config, uint64_t seed) : config_(config) {
  config_.validate();
  const Gpt2Config& c = config_;
  nn::Init init(seed, nn::Init::Weights::normal);
  int64_t D = c.n_embd;
  dropout_seed = Tensor::zeros(DType::i32, {});
  drop_ = nn::Dropout{c.dropout, dropout_seed};
  wte_ = nn::Embedding(params_, "wte.weight", c.vocab_size, D, init);
  wpe_ = nn::Embedding(params_, "wpe.weight", c.n_positions, D, init, 0.01);
  nn::BlockConfig block;
  block.dim = D;
  block.heads = c.n_head;
  block.mlp_hidden = 4 * D;
  block.norm_eps = c.layer_norm_epsilon;
  block.gelu = nn::parse_gelu(c.gelu);
  block.causal = true;
  block.qkv_bias = block.bias = c.bias;
  block.layout = nn::WeightLayout::in_out;  // Conv1D
  // GPT-2 scales the residual projections' init by 1/sqrt(2 L).
  block.resid_std = 0.02 / std::sqrt(2.0 * std::max<int64_t>(1, c.n_layer));
  block.dropout = c.dropout;
  block.dropout_seed = dropout_seed;
  block.norm1 = "ln_1";
  block.qkv = "attn.c_attn";
  block.proj = "attn.c_proj";
  block.norm2 = "ln_2";
  block.fc1 = "mlp.c_fc";
  block.fc2 = "mlp.c_proj";
  for (int64_t i = 0; i < c.n_layer; ++i) blocks_.emplace_back(params_, "h." + std::to_string(i), block, init);
  ln_f_ = nn::Norm(params_, "ln_f", D, c.layer_norm_epsilon, init);
}

Tensor Gpt2::forward(const Tensor& tokens, bool train) const {
  return matmul(hidden(tokens, train), transpose(wte_.weight));  // tied head: [B, T, V]
}

Tensor Gpt2::hidden(const Tensor& tokens, bool train) const {
  const Gpt2Config& c = config_;
  if (tokens.rank() != 2 || tokens.dtype() != DType::i32) {
    throw ShapeError("gpt2: tokens must be i32 [B, T], got " + to_string(tokens));
  }
  int64_t T = tokens.dim(1);
  if (T > c.n_positions) {
    throw ShapeError("gpt2: " + std::to_string(T) + " tokens exceed the context of " + std::to_string(c.n_positions));
  }
  Tensor positions = slice(wpe_.weight, 0, 0, T);                 // [T, D]
  Tensor x = drop_(wte_(tokens) + positions, train, 1000);        // [B, T, D]
  for (size_t i = 0; i < blocks_.size(); ++i) x = blocks_[i](x, train, int64_t(2 * i));
  return ln_f_(x);
}

Tensor Gpt2::next_token_loss(const Tensor& tokens, bool train) const {
  if (tokens.rank() != 2 || tokens.dim(1) < 2) {
    throw ShapeError("gpt2: next-token loss needs tokens [B, T + 1] with T >= 1, got " + to_string(tokens));
  }
  int64_t T = tokens.dim(1) - 1;
  const Tensor targets = slice(tokens, 1, 1, T + 1);
  if (!checkpointing_) return cross_entropy(forward(slice(tokens, 1, 0, T), train), targets);  // mean over B * T
  return nn::chunked_cross_entropy(
      hidden(slice(tokens, 1, 0, T), train), targets,
      [&](const Tensor& rows) { return matmul(rows, transpose(wte_.weight)); },
      std::max<int64_t>(1, chunk_logits_ / config_.vocab_size));
}

// Decoding with a key/value cache: each block's attention reads the keys and
// values of earlier positions from leaves that the caller fills after each
// step from k_new/v_new, so a new token costs one position's projections.
// One compiled graph serves every position.
Gpt2::DecodeStep Gpt2::decode_step(int64_t max_tokens) const {
  const Gpt2Config& c = config_;
  const int64_t D = c.n_embd;
  DecodeStep s(std::min(max_tokens, c.n_positions));
  const Tensor x = s.through(blocks_, reshape(wte_(s.token) + wpe_(s.position), {1, 1, D}), c.n_head, D / c.n_head);
  s.logits = reshape(matmul(ln_f_(x), transpose(wte_.weight)), {1, c.vocab_size});
  return s;
}

}  // namespace nabla::models
