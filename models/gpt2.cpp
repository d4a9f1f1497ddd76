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
#include "models/gpt2.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/json_fields.h"
#include "nabla/checkpoint.h"
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
  if (tokenizer != "byte" && tokenizer != "gpt2") fail("tokenizer must be \"byte\" or \"gpt2\"");
  nn::parse_gelu(gelu);
}

std::string Gpt2Config::to_json() const {
  nlohmann::json j = {{"architecture", "gpt2"},
                      {"vocab_size", vocab_size},
                      {"n_positions", n_positions},
                      {"n_layer", n_layer},
                      {"n_head", n_head},
                      {"n_embd", n_embd},
                      {"layer_norm_epsilon", layer_norm_epsilon},
                      {"dropout", dropout},
                      {"bias", bias},
                      {"gelu", gelu},
                      {"tokenizer", tokenizer},
                      {"preset", preset}};
  return j.dump();
}

Gpt2Config Gpt2Config::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw IoError(std::string("gpt2 config: not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw IoError("gpt2 config: not a JSON object");
  auto arch = j.find("architecture");
  if (arch == j.end() || *arch != "gpt2") {
    throw IoError("gpt2 config: architecture is " + (arch == j.end() ? "missing" : io::json_text(*arch)) +
                  ", expected \"gpt2\"");
  }
  Gpt2Config c;
  try {
    c.preset = j.value("preset", "");
    c.vocab_size = io::json_int(j, "vocab_size");
    c.n_positions = io::json_int(j, "n_positions");
    c.n_layer = io::json_int(j, "n_layer");
    c.n_head = io::json_int(j, "n_head");
    c.n_embd = io::json_int(j, "n_embd");
    c.layer_norm_epsilon = j.value("layer_norm_epsilon", 1e-5);
    c.dropout = j.value("dropout", 0.0);
    c.bias = j.value("bias", true);
    c.gelu = j.value("gelu", "gelu");
    c.tokenizer = j.value("tokenizer", "gpt2");
  } catch (const nlohmann::json::exception& e) {
    throw IoError(std::string("gpt2 config: ") + e.what());
  } catch (const IoError& e) {
    throw IoError(std::string("gpt2 config: ") + e.what());
  }
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

Gpt2Config gpt2_config_from_checkpoint(const Checkpoint& ckpt) {
  Gpt2Config c;
  try {
    c = Gpt2Config::from_json(ckpt.config_json);
  } catch (const Error& e) {
    throw IoError(ckpt.path + ": " + e.what());
  }
  check_holds_parameters(ckpt, c.parameter_count());
  return c;
}

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

Conv1D::Conv1D(nn::Params& p, const std::string& prefix, int64_t in, int64_t out, bool with_bias, nn::Init& init,
               double std) {
  weight = p.add(prefix + ".weight", init.normal({in, out}, std));
  if (with_bias) bias = p.add(prefix + ".bias", init.zeros({out}));
}

Tensor Conv1D::operator()(const Tensor& x) const {
  return bias.defined() ? matmul_add(x, weight, bias) : matmul(x, weight);
}

Gpt2::Gpt2(const Gpt2Config& config, uint64_t seed) : config_(config) {
  config_.validate();
  const Gpt2Config& c = config_;
  nn::Init init(seed);
  int64_t D = c.n_embd;
  // GPT-2 scales the residual projections' init by 1/sqrt(2 L).
  double resid_std = 0.02 / std::sqrt(2.0 * std::max<int64_t>(1, c.n_layer));
  dropout_seed = Tensor::zeros(DType::i32, {});
  drop_ = nn::Dropout{c.dropout, dropout_seed};
  wte_ = nn::Embedding(params_, "wte.weight", c.vocab_size, D, init);
  wpe_ = nn::Embedding(params_, "wpe.weight", c.n_positions, D, init, 0.01);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    std::string p = "h." + std::to_string(i);
    Block b;
    b.ln_1 = nn::LayerNorm(params_, p + ".ln_1", D, c.layer_norm_epsilon, init);
    b.c_attn = Conv1D(params_, p + ".attn.c_attn", D, 3 * D, c.bias, init);
    b.attn_proj = Conv1D(params_, p + ".attn.c_proj", D, D, c.bias, init, resid_std);
    b.ln_2 = nn::LayerNorm(params_, p + ".ln_2", D, c.layer_norm_epsilon, init);
    b.c_fc = Conv1D(params_, p + ".mlp.c_fc", D, 4 * D, c.bias, init);
    b.mlp_proj = Conv1D(params_, p + ".mlp.c_proj", 4 * D, D, c.bias, init, resid_std);
    blocks_.push_back(b);
  }
  ln_f_ = nn::LayerNorm(params_, "ln_f", D, c.layer_norm_epsilon, init);
}

namespace {

// Column block i (of width D) of a fused [D, 3D] Conv1D: a strided view the
// GEMM reads in place; its gradient lands in the fused weight's columns.
Tensor column_block(const Conv1D& fused, const Tensor& x, int64_t i, int64_t D) {
  Tensor w = slice(fused.weight, 1, i * D, (i + 1) * D);
  return fused.bias.defined() ? matmul_add(x, w, slice(fused.bias, 0, i * D, (i + 1) * D)) : matmul(x, w);
}

}  // namespace

// x [B, T, D] -> x + attn(ln_1(x)) -> + mlp(ln_2(.)), causal attention.
Tensor Gpt2::block_forward(const Block& b, const Tensor& x, bool train, int64_t salt) const {
  int64_t B = x.dim(0), T = x.dim(1), D = x.dim(2), H = config_.n_head, hd = D / H;
  Tensor h = b.ln_1(x);
  auto heads = [&](int64_t i) { return reshape(column_block(b.c_attn, h, i, D), {B, T, H, hd}); };
  Tensor o = attention(heads(0), heads(1), heads(2), /*causal=*/true);  // [B, T, H, hd]
  Tensor a = b.attn_proj(reshape(o, {B, T, D}));
  Tensor r = x + drop_(a, train, salt);
  Tensor m = b.mlp_proj(nn::apply_gelu(nn::parse_gelu(config_.gelu), b.c_fc(b.ln_2(r))));
  return r + drop_(m, train, salt + 1);
}

Tensor Gpt2::forward(const Tensor& tokens, bool train) const {
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
  for (size_t i = 0; i < blocks_.size(); ++i) x = block_forward(blocks_[i], x, train, int64_t(2 * i));
  x = ln_f_(x);
  return matmul(x, transpose(wte_.weight));                        // tied head: [B, T, V]
}

Tensor Gpt2::next_token_loss(const Tensor& tokens, bool train) const {
  if (tokens.rank() != 2 || tokens.dim(1) < 2) {
    throw ShapeError("gpt2: next-token loss needs tokens [B, T + 1] with T >= 1, got " + to_string(tokens));
  }
  int64_t T = tokens.dim(1) - 1;
  Tensor logits = forward(slice(tokens, 1, 0, T), train);     // [B, T, V]
  return cross_entropy(logits, slice(tokens, 1, 1, T + 1));  // mean over B * T
}

// Decoding with a key/value cache: the keys and values of earlier positions
// live in leaves [1, H, Tmax, hd] that the caller fills after each step from
// k_new/v_new, so a new token costs one position's projections. Attention
// covers the cache (masked to the positions written so far) plus the new
// token itself; one compiled graph serves every position.
Gpt2::DecodeStep Gpt2::decode_step(int64_t max_tokens) const {
  const Gpt2Config& c = config_;
  int64_t D = c.n_embd, H = c.n_head, hd = D / H, Tm = std::min(max_tokens, c.n_positions);
  DecodeStep s;
  s.token = Tensor::zeros(DType::i32, {1});
  s.position = Tensor::zeros(DType::i32, {1});
  s.mask = Tensor::full(DType::f32, {1, Tm + 1}, -std::numeric_limits<double>::infinity());
  s.mask.data_as<float>()[Tm] = 0;  // the new token always sees itself
  Tensor x = reshape(wte_(s.token) + wpe_(s.position), {1, 1, D});
  double scale = 1.0 / std::sqrt(double(hd));
  for (const Block& b : blocks_) {
    Tensor h = b.ln_1(x);
    auto head = [&](int64_t i) { return permute(reshape(column_block(b.c_attn, h, i, D), {1, 1, H, hd}), {0, 2, 1, 3}); };
    Tensor q = head(0), k = head(1), v = head(2);  // [1, H, 1, hd]
    Tensor kc = Tensor::zeros(DType::f32, {1, H, Tm, hd}), vc = Tensor::zeros(DType::f32, {1, H, Tm, hd});
    s.k_cache.push_back(kc);
    s.v_cache.push_back(vc);
    s.k_new.push_back(k);
    s.v_new.push_back(v);
    Tensor scores = concat({matmul(q, transpose(kc)), sum(q * k, {-1}, true)}, -1);  // [1, H, 1, Tm + 1]
    Tensor p = softmax(scores, scale, s.mask);
    Tensor o = matmul(slice(p, -1, 0, Tm), vc) + slice(p, -1, Tm, Tm + 1) * v;   // [1, H, 1, hd]
    Tensor r = x + b.attn_proj(reshape(permute(o, {0, 2, 1, 3}), {1, 1, D}));
    x = r + b.mlp_proj(nn::apply_gelu(nn::parse_gelu(c.gelu), b.c_fc(b.ln_2(r))));
  }
  s.logits = reshape(matmul(ln_f_(x), transpose(wte_.weight)), {1, c.vocab_size});
  return s;
}

}  // namespace nabla::models
