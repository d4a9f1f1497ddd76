// Checkpoints as GGUF. The Llama mapping (add_llama) follows llama.cpp's
// llama, qwen2, qwen3, smollm3 and gemma3 architectures, the GPT-2 mapping its gpt2 architecture, so
// that llama.cpp loads and runs the file:
//
//   nabla (Hugging Face)        GGUF (llama.cpp)          NumPy shape -> ggml ne
//   wte.weight      [V, D]      token_embd.weight         {D, V}
//   wpe.weight      [P, D]      position_embd.weight      {D, P}
//   h.i.ln_1.*      [D]         blk.i.attn_norm.*         {D}
//   h.i.attn.c_attn.weight      blk.i.attn_qkv.weight     [D, 3D] transposed -> {D, 3D}
//   h.i.attn.c_attn.bias        blk.i.attn_qkv.bias       {3D}
//   h.i.attn.c_proj.weight      blk.i.attn_output.weight  [D, D] transposed -> {D, D}
//   h.i.attn.c_proj.bias        blk.i.attn_output.bias    {D}
//   h.i.ln_2.*                  blk.i.ffn_norm.*          {D}
//   h.i.mlp.c_fc.weight         blk.i.ffn_up.weight       [D, F] transposed -> {D, F}
//   h.i.mlp.c_fc.bias           blk.i.ffn_up.bias         {F}
//   h.i.mlp.c_proj.weight       blk.i.ffn_down.weight     [F, D] transposed -> {F, D}
//   h.i.mlp.c_proj.bias         blk.i.ffn_down.bias       {D}
//   ln_f.*                      output_norm.*             {D}
//   (tied head)                 no output.weight: llama.cpp reuses token_embd
//
// Conv1D keeps weights [in, out]; ggml's mul_mat wants a Linear weight
// [out, in] (ne {in, out}), so those four are transposed, as
// convert_hf_to_gguf.py does for c_attn, c_proj and c_fc.
#include "nabla/models/gguf.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <vector>

#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/models/vit.h"
#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/io.h"
#include "nabla/tokenizer.h"

namespace nabla::models {

namespace {

// gguf-py's TokenType values, which llama.cpp maps to token attributes.
constexpr int32_t kTokenUnused = 5;  // GGUF's token type

void add_vit(const Checkpoint& ckpt, GgufWriter& w) {
  VitConfig c = vit_config_from_checkpoint(ckpt);
  w.set("vit.image_size", uint32_t(c.img_size));
  w.set("vit.patch_size", uint32_t(c.patch_size));
  w.set("vit.num_channels", uint32_t(c.in_chans));
  w.set("vit.embedding_length", uint32_t(c.embed_dim));
  w.set("vit.block_count", uint32_t(c.depth));
  w.set("vit.attention.head_count", uint32_t(c.num_heads));
  w.set("vit.feed_forward_length", uint32_t(c.mlp_hidden()));
  w.set("vit.attention.layer_norm_epsilon", float(c.norm_eps));
  w.set("vit.num_classes", uint32_t(c.num_classes));
  w.set("vit.global_pool", c.global_pool);
  w.set("vit.gelu", c.gelu);
  w.set("vit.qkv_bias", c.qkv_bias);
  Vit model(c, 0);
  load_params(ckpt, model.params());
  for (const auto& [name, t] : model.params().list()) w.add_tensor(name, t);
}

// A Conv1D weight [in, out] as the Linear weight [out, in].
Tensor transposed(const Tensor& w) {
  const int64_t in = w.dim(0), out = w.dim(1);
  std::vector<float> src = w.to_vector<float>(), dst(src.size());
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o) dst[o * in + i] = src[i * out + o];
  return Tensor::from_vector<float>({out, in}, dst);
}

// The tokenizer `name` (as make_tokenizer takes it) as tokenizer.ggml.*:
// byte-level BPE, or SentencePiece-style pieces with scores (model "llama",
// from a Llama-2-style tokenizer.json or GGUF). "byte" is a vocabulary of
// the 256 bytes without merges, so
// llama.cpp's BPE yields exactly the byte ids; it has no end-of-text token
// (nabla separates documents with '\n', so that is BOS, EOS and EOT).
// Otherwise the end-of-text token is EOS and EOT, and BOS unless the
// tokenizer starts inputs with a token of its own (add_bos_token), as
// convert_hf_to_gguf.py writes GPT-2 and Llama 3. llama.cpp takes the vocabulary size
// from the token list and requires token_embd to match it, so a padded
// embedding gets padding tokens.
void add_vocab(const Checkpoint& ckpt, const std::string& name, int64_t vocab_size, const GgufExportOptions& options,
               GgufWriter& w) {
  GgufVocabulary v;
  try {
    if (name == "byte") {
      v = BpeTokenizer::bytes_only()->gguf_vocabulary();
      v.eot = '\n';
    } else {
      std::unique_ptr<Tokenizer> tok = make_tokenizer(name, options.vocab_dir);
      const auto* bpe = dynamic_cast<const BpeTokenizer*>(tok.get());
      if (!bpe) throw UsageError("tokenizer " + name + " is not BPE");
      v = bpe->gguf_vocabulary();
    }
  } catch (const Error& e) {
    throw IoError(ckpt.path + ": its tokenizer: " + e.what());
  }
  if (int64_t(v.tokens.size()) > vocab_size) {
    throw IoError(ckpt.path + ": vocab_size is " + std::to_string(vocab_size) + ", smaller than the " + name +
                  " tokenizer's " + std::to_string(v.tokens.size()) + " tokens");
  }
  for (int64_t id = int64_t(v.tokens.size()); id < vocab_size; ++id) {
    v.tokens.push_back("[PAD" + std::to_string(id) + "]");
    v.types.push_back(kTokenUnused);
    if (!v.scores.empty()) v.scores.push_back(0.0f);
  }
  w.set("tokenizer.ggml.model", v.model);
  w.set("tokenizer.ggml.tokens", v.tokens);
  w.set("tokenizer.ggml.token_type", v.types);
  if (v.model == "llama") {
    w.set("tokenizer.ggml.scores", v.scores);
    w.set("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
    if (v.unk >= 0) w.set("tokenizer.ggml.unknown_token_id", uint32_t(v.unk));
  } else {
    w.set("tokenizer.ggml.pre", v.pre);
    w.set("tokenizer.ggml.merges", v.merges);
  }
  if (v.eot >= 0) {
    // llama.cpp ends generation at EOT and EOS; it finds GPT-2's EOT by its
    // text, the byte vocabulary's only from this key.
    for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) w.set(key, uint32_t(v.eot));
  }
  // BOS: the token every input starts with where the tokenizer has one
  // (add_bos_token), else the end-of-text token, as for GPT-2.
  if (v.add_bos || v.eot >= 0) w.set("tokenizer.ggml.bos_token_id", uint32_t(v.add_bos ? v.bos : v.eot));
  w.set("tokenizer.ggml.add_bos_token", v.add_bos);
}

void add_gpt2(const Checkpoint& ckpt, const GgufExportOptions& options, GgufWriter& w) {
  Gpt2Config c = gpt2_config_from_checkpoint(ckpt);
  // llama.cpp's gpt2 graph applies ggml_gelu, the tanh approximation.
  if (nn::parse_gelu(c.gelu) != nn::Gelu::tanh) {
    throw UsageError(ckpt.path +
                     ": llama.cpp's gpt2 architecture uses the tanh GELU (\"gelu\"), "
                     "this checkpoint was trained with \"" +
                     c.gelu + "\"");
  }
  const int64_t D = c.n_embd, F = 4 * c.n_embd;
  w.set("gpt2.context_length", uint32_t(c.n_positions));
  w.set("gpt2.embedding_length", uint32_t(D));
  w.set("gpt2.feed_forward_length", uint32_t(F));
  w.set("gpt2.block_count", uint32_t(c.n_layer));
  w.set("gpt2.attention.head_count", uint32_t(c.n_head));
  w.set("gpt2.attention.layer_norm_epsilon", float(c.layer_norm_epsilon));

  add_vocab(ckpt, options.tokenizer.empty() ? checkpoint_tokenizer(ckpt.path, c.tokenizer) : options.tokenizer,
            c.vocab_size, options, w);

  Gpt2 model(c, 0);
  load_params(ckpt, model.params());
  const nn::Params& p = model.params();
  // llama.cpp requires every bias; a bias-free GPT-2 gets zeros, which
  // computes the same.
  auto bias = [&](const std::string& name, int64_t n) {
    return c.bias ? p.get(name) : Tensor::zeros(DType::f32, {n});
  };
  w.add_tensor("token_embd.weight", p.get("wte.weight"));
  w.add_tensor("position_embd.weight", p.get("wpe.weight"));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".", blk = "blk." + std::to_string(i) + ".";
    w.add_tensor(blk + "attn_norm.weight", p.get(h + "ln_1.weight"));
    w.add_tensor(blk + "attn_norm.bias", p.get(h + "ln_1.bias"));
    w.add_tensor(blk + "attn_qkv.weight", transposed(p.get(h + "attn.c_attn.weight")));
    w.add_tensor(blk + "attn_qkv.bias", bias(h + "attn.c_attn.bias", 3 * D));
    w.add_tensor(blk + "attn_output.weight", transposed(p.get(h + "attn.c_proj.weight")));
    w.add_tensor(blk + "attn_output.bias", bias(h + "attn.c_proj.bias", D));
    w.add_tensor(blk + "ffn_norm.weight", p.get(h + "ln_2.weight"));
    w.add_tensor(blk + "ffn_norm.bias", p.get(h + "ln_2.bias"));
    w.add_tensor(blk + "ffn_up.weight", transposed(p.get(h + "mlp.c_fc.weight")));
    w.add_tensor(blk + "ffn_up.bias", bias(h + "mlp.c_fc.bias", F));
    w.add_tensor(blk + "ffn_down.weight", transposed(p.get(h + "mlp.c_proj.weight")));
    w.add_tensor(blk + "ffn_down.bias", bias(h + "mlp.c_proj.bias", D));
  }
  w.add_tensor("output_norm.weight", p.get("ln_f.weight"));
  w.add_tensor("output_norm.bias", p.get("ln_f.bias"));
}

// Hugging Face's q_proj / k_proj rows for llama.cpp's llama graph, which
// rotates interleaved pairs (x[2j], x[2j+1]) where Hugging Face rotates
// halves (x[j], x[j + hd/2]): within each head, row s * hd/2 + j moves to
// 2j + s (convert_hf_to_gguf.py's permute). Biases move with their rows.
// `back` undoes it (reading a GGUF).
Tensor interleave_heads(const Tensor& t, int64_t heads, bool back = false) {
  const int64_t rows = t.dim(0), hd = rows / heads, half = hd / 2;
  // Whole rows move, so a row of stored (u8) bytes moves the same way.
  const size_t row_bytes = rows ? size_t(t.numel() / rows) * dtype_size(t.dtype()) : 0;
  Tensor out = Tensor::empty(t.dtype(), t.shape());
  const auto* src = static_cast<const char*>(t.data());
  auto* dst = static_cast<char*>(out.data());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t j = 0; j < half; ++j) {
        const int64_t halves = h * hd + s * half + j, pairs = h * hd + 2 * j + s;
        std::memcpy(dst + (back ? halves : pairs) * row_bytes, src + (back ? pairs : halves) * row_bytes, row_bytes);
      }
    }
  }
  return out;
}

// llama.cpp's ftype for a file whose matrices are `t` (general.file_type).
uint32_t file_type(GgmlType t) {
  switch (t) {
    case GgmlType::f16:
      return 1;
    case GgmlType::q4_0:
      return 2;
    case GgmlType::q8_0:
      return 7;
    case GgmlType::q4_k:
      return 15;  // Q4_K_M's number; all matrices Q4_K here
    case GgmlType::q6_k:
      return 18;
    case GgmlType::bf16:
      return 32;
    default:
      return 0;
  }
}

// llama.cpp's architecture for a model_type: Mistral is llama.cpp's llama
// (as convert_hf_to_gguf.py writes it; the sliding window is not kept).
std::string gguf_architecture(const LlamaConfig& c) {
  if (c.gemma3()) return "gemma3";
  return c.model_type == "mistral" ? "llama" : c.model_type;
}

// llama.cpp's llama and smollm3 rotate adjacent pairs (convert_hf_to_gguf.py
// permutes their q/k rows to that order); the others rotate halves, as
// Hugging Face does.
bool interleaves_heads(const std::string& arch) { return arch == "llama" || arch == "smollm3"; }

// What llama.cpp's smollm3 fixes rather than reads: every fourth layer
// without rotary positions.
bool smollm3_llama_cpp_rotates(int64_t i) { return (i + 1) % 4 != 0; }

// What llama.cpp's gemma2 and gemma3 fix rather than read: the layers that
// slide (gemma2: the even ones; gemma3: all but every sixth, with rotary
// base 10000), scores scaled by 1/sqrt(head size) (the 27Bs, 46 and 62
// layers: 1/sqrt(hidden / heads)).
const char* gemma_llama_cpp_pattern(const std::string& arch) {
  return arch == "gemma2" ? "the even layers as sliding, the others full" : "every sixth layer as full, the others sliding";
}
bool gemma_llama_cpp_slides(const std::string& arch, int64_t i) { return arch == "gemma2" ? i % 2 == 0 : (i + 1) % 6 != 0; }
double gemma_llama_cpp_scalar(const std::string& arch, const LlamaConfig& c) {
  return c.num_hidden_layers == (arch == "gemma2" ? 46 : 62) ? double(c.hidden_size / c.num_attention_heads)
                                                             : double(c.head_size());
}

// A block's norms, Hugging Face's name and llama.cpp's; Gemma's gains are
// stored as 1 + weight in GGUF (kNormShift), as convert_hf_to_gguf.py writes them.
std::vector<std::pair<std::string, std::string>> block_norms(const LlamaConfig& c) {
  if (c.gemma()) {
    return {{"input_layernorm", "attn_norm"},
            {"post_attention_layernorm", "post_attention_norm"},
            {"pre_feedforward_layernorm", "ffn_norm"},
            {"post_feedforward_layernorm", "post_ffw_norm"}};
  }
  return {{"input_layernorm", "attn_norm"}, {"post_attention_layernorm", "ffn_norm"}};
}
double norm_shift(const LlamaConfig& c) { return c.gemma() ? 1.0 : 0.0; }

// llama.cpp's llama architecture (llama, SmolLM2, TinyLlama, Llama 3,
// Mistral), qwen2 (q/k/v biases), qwen3 (q/k head norms), smollm3 (llama's
// tensors, NoPE layers) and gemma3 (norms around both branches,
// block_norms); llama and smollm3 rotate adjacent pairs, so their q/k rows
// are interleaved (interleaves_heads):
//   model.embed_tokens.weight                 token_embd.weight
//   model.layers.i.input_layernorm.weight     blk.i.attn_norm.weight
//   model.layers.i.self_attn.{q,k}_proj.*     blk.i.attn_{q,k}.*  (llama, smollm3: rows interleaved)
//   model.layers.i.self_attn.v_proj.*         blk.i.attn_v.*
//   model.layers.i.self_attn.o_proj.weight    blk.i.attn_output.weight
//   model.layers.i.self_attn.{q,k}_norm       blk.i.attn_{q,k}_norm.weight (qwen3)
//   model.layers.i.post_attention_layernorm   blk.i.ffn_norm.weight (gemma3: block_norms)
//   model.layers.i.mlp.{gate,up,down}_proj    blk.i.ffn_{gate,up,down}.weight
//   model.norm.weight                         output_norm.weight
//   lm_head.weight (untied)                   output.weight
//   rope_scaling llama3                       rope_freqs.weight [hd / 2], the frequency divisors
// and phi3 (Phi-3, Phi-4-mini: q/k/v and gate/up fused, rows as Hugging Face
// has them; llama.cpp's phi3 ignores the sliding window):
//   model.layers.i.self_attn.qkv_proj.weight  blk.i.attn_qkv.weight
//   model.layers.i.mlp.gate_up_proj.weight    blk.i.ffn_up.weight
//   rope_scaling longrope                     rope_factors_short.weight, rope_factors_long.weight [rotary / 2],
//                                             rope.scaling.attn_factor, rope.scaling.original_context_length
void add_llama(const Checkpoint& ckpt, const GgufExportOptions& options, GgufWriter& w) {
  const LlamaConfig c = llama_config_from_checkpoint(ckpt);
  const std::string arch = gguf_architecture(c), a = arch + ".";
  const bool interleave = interleaves_heads(arch);
  const int64_t hd = c.head_size();
  if (arch != "llama" && c.rope_scaling.type == "llama3") {
    throw UsageError(ckpt.path + ": llama.cpp's " + arch + " architecture has no llama3 rope scaling");
  }
  if (c.qk_norm() && c.attention_bias) {
    throw UsageError(ckpt.path + ": llama.cpp's qwen3 architecture has no q/k/v biases");
  }
  if (c.phi3() && c.num_attention_heads * hd != c.hidden_size) {
    throw UsageError(ckpt.path + ": llama.cpp's phi3 takes heads x head size = hidden size; this model's are " +
                     std::to_string(c.num_attention_heads) + " x " + std::to_string(hd) + " and " +
                     std::to_string(c.hidden_size));
  }
  if (c.gemma()) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      if ((c.layer_window(i) > 0) != gemma_llama_cpp_slides(arch, i)) {
        throw UsageError(ckpt.path + ": llama.cpp's " + arch + " takes " + gemma_llama_cpp_pattern(arch) +
                         "; this model's layer " + std::to_string(i) + " is " + c.layer_types[size_t(i)]);
      }
    }
    const double scalar = gemma_llama_cpp_scalar(arch, c);
    if ((c.gemma3() && c.rope_local_base_freq != 10000) ||
        (c.query_pre_attn_scalar > 0 && c.query_pre_attn_scalar != scalar)) {
      throw UsageError(ckpt.path + ": llama.cpp's " + arch + " fixes query_pre_attn_scalar " +
                       std::to_string(int64_t(scalar)) + " for this model" +
                       (c.gemma3() ? " and rope_local_base_freq 10000" : ""));
    }
  }
  for (int64_t i = 0; i < c.num_hidden_layers && c.windows_by_layer() && !c.gemma(); ++i) {
    if (c.layer_window(i) > 0) {
      throw UsageError(ckpt.path + ": llama.cpp's " + arch + " architecture has no sliding window; this model's layer " +
                       std::to_string(i) + " slides");
    }
  }
  for (int64_t i = 0; i < c.num_hidden_layers && arch == "smollm3"; ++i) {
    if (c.layer_rotates(i) != smollm3_llama_cpp_rotates(i)) {
      throw UsageError(ckpt.path + ": llama.cpp's smollm3 takes every fourth layer without rotary positions, the "
                       "others with; this model's layer " + std::to_string(i) + (c.layer_rotates(i) ? " rotates" : " does not"));
    }
  }
  w.set("general.architecture", arch);
  w.set(a + "context_length", uint32_t(c.max_position_embeddings));
  w.set(a + "embedding_length", uint32_t(c.hidden_size));
  w.set(a + "feed_forward_length", uint32_t(c.intermediate_size));
  w.set(a + "block_count", uint32_t(c.num_hidden_layers));
  w.set(a + "attention.head_count", uint32_t(c.num_attention_heads));
  w.set(a + "attention.head_count_kv", uint32_t(c.kv_heads()));
  w.set(a + "attention.key_length", uint32_t(hd));
  w.set(a + "attention.value_length", uint32_t(hd));
  w.set(a + "rope.dimension_count", uint32_t(c.rotary_dims()));
  w.set(a + "rope.freq_base", float(c.rope_theta));
  w.set(a + "attention.layer_norm_rms_epsilon", float(c.rms_norm_eps));
  w.set(a + "vocab_size", uint32_t(c.vocab_size));
  if (c.rope_scaling.type == "linear") {
    w.set(a + "rope.scaling.type", "linear");
    w.set(a + "rope.scaling.factor", float(c.rope_scaling.factor));
  }
  if (c.gemma() || c.phi3()) w.set(a + "attention.sliding_window", uint32_t(c.sliding_window));
  const bool longrope = c.rope_scaling.type == "longrope";
  if (c.phi3()) {
    w.set(a + "rope.scaling.original_context_length",
          uint32_t(longrope ? c.rope_scaling.original_max_position_embeddings : c.max_position_embeddings));
  }
  if (longrope) w.set(a + "rope.scaling.attn_factor", float(c.rope_attention_factor()));
  if (c.attn_logit_softcapping > 0) w.set(a + "attn_logit_softcapping", float(c.attn_logit_softcapping));
  if (c.final_logit_softcapping > 0) w.set(a + "final_logit_softcapping", float(c.final_logit_softcapping));
  add_vocab(ckpt, options.tokenizer.empty() ? checkpoint_tokenizer(ckpt.path, c.tokenizer) : options.tokenizer,
            c.vocab_size, options, w);
  // The model's chat template, which llama.cpp's chat formats its prompts with.
  if (const std::string jinja = checkpoint_chat_template(ckpt.path); !jinja.empty()) {
    w.set("tokenizer.chat_template", jinja);
  }

  Llama model(c, 0);
  load_params(ckpt, model.params());
  const nn::Params& p = model.params();
  auto rows = [&](const Tensor& t, int64_t heads) { return interleave ? interleave_heads(t, heads) : t; };
  const GgmlType type = options.matrix_type;
  w.set("general.file_type", file_type(type));
  // Weight matrices in the chosen type where their rows are whole blocks.
  auto add = [&](const std::string& name, const Tensor& t) {
    if (t.rank() == 2 && t.dim(1) % ggml_block_elements(type) == 0) {
      w.add_tensor(name, t, type);
    } else {
      w.add_tensor(name, t);
    }
  };
  add("token_embd.weight", p.get("model.embed_tokens.weight"));
  if (c.rope_scaling.type == "llama3") {
    const std::vector<double> f = c.rope_freq_factors();
    w.add_tensor("rope_freqs.weight", Tensor::from_vector<float>({int64_t(f.size())}, std::vector<float>(f.begin(), f.end())));
  }
  if (longrope) {
    for (auto [name, f] : {std::pair{"rope_factors_short.weight", &c.rope_scaling.short_factor},
                           std::pair{"rope_factors_long.weight", &c.rope_scaling.long_factor}}) {
      w.add_tensor(name, Tensor::from_vector<float>({int64_t(f->size())}, std::vector<float>(f->begin(), f->end())));
    }
  }
  const auto norm = [&](const std::string& name) {
    return norm_shift(c) == 0 ? p.get(name) : eval(p.get(name) + norm_shift(c));
  };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string h = "model.layers." + std::to_string(i) + ".", blk = "blk." + std::to_string(i) + ".";
    for (const auto& [hf, gguf] : block_norms(c)) w.add_tensor(blk + gguf + ".weight", norm(h + hf + ".weight"));
    if (c.phi3()) {
      add(blk + "attn_qkv.weight", p.get(h + "self_attn.qkv_proj.weight"));
      add(blk + "attn_output.weight", p.get(h + "self_attn.o_proj.weight"));
      add(blk + "ffn_up.weight", p.get(h + "mlp.gate_up_proj.weight"));
      add(blk + "ffn_down.weight", p.get(h + "mlp.down_proj.weight"));
      continue;
    }
    add(blk + "attn_q.weight", rows(p.get(h + "self_attn.q_proj.weight"), c.num_attention_heads));
    add(blk + "attn_k.weight", rows(p.get(h + "self_attn.k_proj.weight"), c.kv_heads()));
    add(blk + "attn_v.weight", p.get(h + "self_attn.v_proj.weight"));
    if (c.attention_bias) {
      w.add_tensor(blk + "attn_q.bias", rows(p.get(h + "self_attn.q_proj.bias"), c.num_attention_heads));
      w.add_tensor(blk + "attn_k.bias", rows(p.get(h + "self_attn.k_proj.bias"), c.kv_heads()));
      w.add_tensor(blk + "attn_v.bias", p.get(h + "self_attn.v_proj.bias"));
    }
    if (c.qk_norm()) {
      w.add_tensor(blk + "attn_q_norm.weight", norm(h + "self_attn.q_norm.weight"));
      w.add_tensor(blk + "attn_k_norm.weight", norm(h + "self_attn.k_norm.weight"));
    }
    add(blk + "attn_output.weight", p.get(h + "self_attn.o_proj.weight"));
    add(blk + "ffn_gate.weight", p.get(h + "mlp.gate_proj.weight"));
    add(blk + "ffn_up.weight", p.get(h + "mlp.up_proj.weight"));
    add(blk + "ffn_down.weight", p.get(h + "mlp.down_proj.weight"));
  }
  w.add_tensor("output_norm.weight", norm("model.norm.weight"));
  if (!c.tie_word_embeddings) add("output.weight", p.get("lm_head.weight"));
}

// The double with the shortest decimal form that rounds to f: what a config
// held (1e-06) before it was stored as an f32 key (9.99999997e-07).
double shortest_decimal(float f) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
}

// Llama 3's rope_scaling from llama.cpp's rope_freqs.weight (the divisor of
// each frequency). Only the ratios of original_max_position_embeddings,
// low_freq_factor and high_freq_factor show in the divisors, so the last two
// are taken as every Llama 3.x release has them (1 and 4) and the first is
// solved from a blended frequency; the result must give every divisor back.
LlamaConfig::RopeScaling llama3_from_factors(const std::string& path, const std::vector<float>& f, double theta) {
  LlamaConfig::RopeScaling s{.type = "llama3", .factor = *std::max_element(f.begin(), f.end()), .low_freq_factor = 1,
                             .high_freq_factor = 4, .original_max_position_embeddings = 8192};
  const int64_t hd = int64_t(f.size()) * 2;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] > 1.0001 && f[i] < s.factor * 0.9999) {
      const double blend = (1 / double(f[i]) - 1 / s.factor) / (1 - 1 / s.factor);
      const double wavelen = 2 * M_PI * std::pow(theta, 2.0 * double(i) / double(hd));
      s.original_max_position_embeddings = std::llround(wavelen * (blend * 3 + 1));
      break;
    }
  }
  LlamaConfig probe;
  probe.hidden_size = hd;
  probe.num_attention_heads = 1;
  probe.rope_theta = theta;
  probe.rope_scaling = s;
  const std::vector<double> back = probe.rope_freq_factors();
  for (size_t i = 0; i < f.size(); ++i) {
    if (std::fabs(back[i] - f[i]) > 1e-3 * f[i]) {
      throw IoError(path + ": rope_freqs.weight is not Llama 3's scaling with low_freq_factor 1 and "
                    "high_freq_factor 4 (divisor " + std::to_string(i) + " is " + std::to_string(f[i]) + ")");
    }
  }
  return s;
}

}  // namespace

Checkpoint checkpoint_from_gguf(const std::string& path, bool keep_stored) {
  const GgufFile file = read_gguf(path, keep_stored);
  auto fail = [&](const std::string& what) { return IoError(path + ": " + what); };
  const GgufValue* arch_value = file.find_value("general.architecture");
  const std::string arch =
      arch_value && arch_value->type() == GgufType::string ? arch_value->get<std::string>() : "";
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "smollm3" && arch != "gemma2" && arch != "gemma3" &&
      arch != "phi3") {
    throw fail("general.architecture is " + (arch.empty() ? std::string("missing") : "\"" + arch + "\"") +
               ", nabla reads \"llama\", \"qwen2\", \"qwen3\", \"smollm3\", \"gemma2\", \"gemma3\" and \"phi3\" GGUF "
               "files");
  }
  // Integer keys as any unsigned or signed type the writer chose.
  auto integer = [&](const std::string& key, std::optional<int64_t> fallback = {}) -> int64_t {
    const GgufValue* v = file.find_value(arch + "." + key);
    if (!v) {
      if (fallback) return *fallback;
      throw fail("no metadata key '" + arch + "." + key + "'");
    }
    return std::visit(
        [&](const auto& x) -> int64_t {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
            if (std::is_unsigned_v<T> && uint64_t(x) > uint64_t(INT64_MAX)) throw fail(arch + "." + key + " is too large");
            return int64_t(x);
          }
          throw fail(arch + "." + key + " is " + gguf_type_name(v->type()) + ", expected an integer");
        },
        v->value);
  };
  auto real = [&](const std::string& key, double fallback) -> double {
    const GgufValue* v = file.find_value(arch + "." + key);
    if (!v) return fallback;
    if (v->type() == GgufType::f32) return shortest_decimal(v->get<float>());
    if (v->type() == GgufType::f64) return v->get<double>();
    throw fail(arch + "." + key + " is " + gguf_type_name(v->type()) + ", expected a float");
  };
  auto entry = [&](const std::string& name) -> const GgufTensor& {
    const GgufTensor* t = file.find(name);
    if (!t) throw fail("no tensor '" + name + "'");
    return *t;
  };
  // As f32, whether or not the file was read keeping storage types.
  auto tensor = [&](const std::string& name) { return entry(name).values(); };

  LlamaConfig c;
  c.model_type = arch == "gemma3" ? "gemma3_text" : arch;
  // The name is kept where it can be (config JSON holds UTF-8 only).
  if (const GgufValue* name = file.find_value("general.name");
      name && name->type() == GgufType::string && valid_utf8(name->get<std::string>())) {
    c.preset = name->get<std::string>();
  }
  c.attention_bias = file.find("blk.0.attn_q.bias") != nullptr;
  c.hidden_size = integer("embedding_length");
  c.intermediate_size = integer("feed_forward_length");
  c.num_hidden_layers = integer("block_count");
  c.num_attention_heads = integer("attention.head_count");
  c.num_key_value_heads = integer("attention.head_count_kv", c.num_attention_heads);
  c.max_position_embeddings = integer("context_length");
  const Shape& embed_shape = entry("token_embd.weight").shape;
  if (embed_shape.size() != 2) throw fail("token_embd.weight is " + to_string(embed_shape) + ", expected [vocab, hidden]");
  c.vocab_size = integer("vocab_size", embed_shape[0]);
  // Without key_length, a qwen3 head's size is its q norm's (Qwen3's heads are not hidden / heads wide).
  const GgufTensor* q_norm = file.find("blk.0.attn_q_norm.weight");
  c.head_dim = integer("attention.key_length", q_norm && q_norm->shape.size() == 1 ? q_norm->shape[0]
                                               : c.num_attention_heads > 0       ? c.hidden_size / c.num_attention_heads
                                                                                 : 0);
  const int64_t rotary = integer("rope.dimension_count", c.head_dim);
  if (integer("attention.value_length", c.head_dim) != c.head_dim || (rotary != c.head_dim && arch != "phi3")) {
    throw fail("key, value and rotary sizes differ; nabla's " + arch + " rotates the whole head");
  }
  // Phi-4-mini's partial rotation: Hugging Face's int(head_dim * factor) gives the rotated size back.
  if (c.head_dim > 0 && rotary != c.head_dim) {
    c.partial_rotary_factor = double(rotary) / double(c.head_dim);
    if (c.rotary_dims() != rotary) c.partial_rotary_factor = (double(rotary) + 0.5) / double(c.head_dim);
  }
  c.rms_norm_eps = real("attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = real("rope.freq_base", 10000.0);
  c.tie_word_embeddings = file.find("output.weight") == nullptr;
  if (const GgufValue* type = file.find_value(arch + ".rope.scaling.type")) {
    const std::string t = type->type() == GgufType::string ? type->get<std::string>() : "";
    if (t == "linear") {
      c.rope_scaling = {.type = "linear", .factor = real("rope.scaling.factor", 1.0)};
    } else if (t != "none") {
      throw fail(arch + ".rope.scaling.type \"" + t + "\" is not supported (linear, or rope_freqs.weight)");
    }
  }
  if (const GgufTensor* freqs = file.find("rope_freqs.weight")) {
    c.rope_scaling = llama3_from_factors(path, freqs->tensor.to_vector<float>(), c.rope_theta);
  }
  if (arch == "phi3") {
    c.sliding_window = integer("attention.sliding_window", 0);
    const GgufTensor *short_f = file.find("rope_factors_short.weight"), *long_f = file.find("rope_factors_long.weight");
    if ((short_f != nullptr) != (long_f != nullptr)) throw fail("one of rope_factors_short and rope_factors_long is missing");
    if (short_f) {  // longrope; the attention factor as llama.cpp applies it (1 without the key)
      const std::vector<float> s = short_f->tensor.to_vector<float>(), l = long_f->tensor.to_vector<float>();
      c.rope_scaling = {.type = "longrope",
                        .original_max_position_embeddings = integer("rope.scaling.original_context_length"),
                        .short_factor = std::vector<double>(s.begin(), s.end()),
                        .long_factor = std::vector<double>(l.begin(), l.end()),
                        .attention_factor = real("rope.scaling.attn_factor", 1.0)};
      if (c.rope_scaling.original_max_position_embeddings > 0) {
        c.rope_scaling.factor = double(c.max_position_embeddings) / double(c.rope_scaling.original_max_position_embeddings);
      }
      LlamaConfig derived = c;  // a factor the default gives stays implied, as config.json has it
      derived.rope_scaling.attention_factor = 0;
      if (std::fabs(derived.rope_attention_factor() - c.rope_scaling.attention_factor) <= 1e-6 * c.rope_scaling.attention_factor) {
        c.rope_scaling.attention_factor = 0;
      }
    }
  }
  if (c.gemma()) {  // what llama.cpp's gemma3 fixes
    c.sliding_window = integer("attention.sliding_window", arch == "gemma2" ? std::optional<int64_t>(4096) : std::nullopt);
    for (int64_t i = 0; i < std::min<int64_t>(c.num_hidden_layers, 1 << 20); ++i) {
      c.layer_types.push_back(gemma_llama_cpp_slides(arch, i) ? "sliding_attention" : "full_attention");
    }
    c.query_pre_attn_scalar = c.num_attention_heads > 0 ? gemma_llama_cpp_scalar(arch, c) : 0;
  }
  if (arch == "gemma2") {  // llama.cpp's defaults, Gemma 2's caps
    c.attn_logit_softcapping = real("attn_logit_softcapping", 50.0);
    c.final_logit_softcapping = real("final_logit_softcapping", 30.0);
  }
  for (int64_t i = 0; i < std::min<int64_t>(c.num_hidden_layers, 1 << 20) && arch == "smollm3"; ++i) {
    c.no_rope_layers.push_back(smollm3_llama_cpp_rotates(i) ? 1 : 0);
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw fail(e.what());
  }

  Checkpoint ckpt;
  ckpt.path = path;
  ckpt.architecture = "llama";
  ckpt.config_json = c.to_json();
  auto& out = ckpt.file.tensors;
  auto rows = [&](const Tensor& t, int64_t heads) {
    if (!interleaves_heads(arch)) return t;
    if (t.rank() < 1 || t.dim(0) != heads * c.head_size()) {
      throw fail("a q/k tensor is " + to_string(t.shape()) + ", expected " + std::to_string(heads * c.head_size()) + " rows");
    }
    return interleave_heads(t, heads, /*back=*/true);
  };
  // A weight matrix under its Hugging Face name, kept in its storage type
  // when read so; `heads` > 0: a q/k matrix, its rows back in rotate-half order.
  auto matrix = [&](const std::string& hf_name, const std::string& name, int64_t heads = 0) {
    const GgufTensor& t = entry(name);
    const bool stored = t.tensor.dtype() == DType::u8 && t.shape.size() == 2;
    if (stored) ckpt.formats.emplace_back(hf_name, nn::StoredFormat{t.type, t.shape[1]});
    const Tensor m = stored ? t.tensor : tensor(name);
    out.emplace_back(hf_name, heads > 0 ? rows(m, heads) : m);
  };
  matrix("model.embed_tokens.weight", "token_embd.weight");
  const auto norm = [&](const std::string& name) {
    const Tensor t = tensor(name);
    return norm_shift(c) == 0 ? t : eval(t - norm_shift(c));
  };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string h = "model.layers." + std::to_string(i) + ".", blk = "blk." + std::to_string(i) + ".";
    for (const auto& [hf, gguf] : block_norms(c)) out.emplace_back(h + hf + ".weight", norm(blk + gguf + ".weight"));
    if (c.phi3()) {
      matrix(h + "self_attn.qkv_proj.weight", blk + "attn_qkv.weight");
      matrix(h + "self_attn.o_proj.weight", blk + "attn_output.weight");
      matrix(h + "mlp.gate_up_proj.weight", blk + "ffn_up.weight");
      matrix(h + "mlp.down_proj.weight", blk + "ffn_down.weight");
      continue;
    }
    matrix(h + "self_attn.q_proj.weight", blk + "attn_q.weight", c.num_attention_heads);
    matrix(h + "self_attn.k_proj.weight", blk + "attn_k.weight", c.kv_heads());
    matrix(h + "self_attn.v_proj.weight", blk + "attn_v.weight");
    if (c.attention_bias) {
      out.emplace_back(h + "self_attn.q_proj.bias", rows(tensor(blk + "attn_q.bias"), c.num_attention_heads));
      out.emplace_back(h + "self_attn.k_proj.bias", rows(tensor(blk + "attn_k.bias"), c.kv_heads()));
      out.emplace_back(h + "self_attn.v_proj.bias", tensor(blk + "attn_v.bias"));
    }
    if (c.qk_norm()) {
      out.emplace_back(h + "self_attn.q_norm.weight", norm(blk + "attn_q_norm.weight"));
      out.emplace_back(h + "self_attn.k_norm.weight", norm(blk + "attn_k_norm.weight"));
    }
    matrix(h + "self_attn.o_proj.weight", blk + "attn_output.weight");
    matrix(h + "mlp.gate_proj.weight", blk + "ffn_gate.weight");
    matrix(h + "mlp.up_proj.weight", blk + "ffn_up.weight");
    matrix(h + "mlp.down_proj.weight", blk + "ffn_down.weight");
  }
  out.emplace_back("model.norm.weight", norm("output_norm.weight"));
  if (!c.tie_word_embeddings) matrix("lm_head.weight", "output.weight");
  check_holds_parameters(ckpt, c.parameter_count());  // a model is built from it next
  return ckpt;
}

Checkpoint load_any_checkpoint(const std::string& path, bool keep_stored) {
  if (is_gguf_file(path)) return checkpoint_from_gguf(path, keep_stored);
  // A Hugging Face folder's F16 / BF16 matrices, as the GGUF's.
  auto matrix = [](const std::string& name) {
    return (name.starts_with("model.layers.") && name.ends_with("_proj.weight")) ||
           name == "model.embed_tokens.weight" || name == "lm_head.weight";
  };
  return keep_stored ? load_checkpoint(path, matrix) : load_checkpoint(path);
}

std::string checkpoint_tokenizer(const std::string& path, const std::string& configured) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const std::string json = (std::filesystem::path(path) / "tokenizer.json").string();
    return std::filesystem::is_regular_file(json, ec) ? json : configured;
  }
  if (is_gguf_file(path) && read_gguf_metadata(path).find_value("tokenizer.ggml.model")) return path;
  const std::filesystem::path file(configured);
  if (configured != "byte" && configured != "gpt2" && !configured.empty() && file.is_relative()) {
    const std::filesystem::path beside = std::filesystem::path(path).parent_path() / file;
    if (std::filesystem::is_regular_file(beside, ec)) return beside.string();
  }
  return configured;
}

std::string checkpoint_chat_template(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (const fs::path jinja = fs::path(path) / "chat_template.jinja"; fs::exists(jinja, ec)) {
      return read_file(jinja.string());
    }
    const fs::path config = fs::path(path) / "tokenizer_config.json";
    if (!fs::exists(config, ec)) return "";
    const nlohmann::json j = nlohmann::json::parse(read_file(config.string()), nullptr, false);
    if (!j.is_object()) throw IoError(config.string() + ": not a JSON object");
    const auto t = j.find("chat_template");
    if (t != j.end() && t->is_array()) {
      for (const nlohmann::json& named : *t) {
        if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
            named["template"].is_string()) {
          return named["template"].get<std::string>();
        }
      }
    }
    return t != j.end() && t->is_string() ? t->get<std::string>() : "";
  }
  if (!is_gguf_file(path)) return "";
  const GgufFile gguf = read_gguf_metadata(path);
  const GgufValue* v = gguf.find_value("tokenizer.chat_template");
  return v && v->type() == GgufType::string ? v->get<std::string>() : "";
}

GgufWriter gguf_from_checkpoint(const Checkpoint& ckpt, const GgufExportOptions& options) {
  nlohmann::json cfg = nlohmann::json::parse(ckpt.config_json, nullptr, /*allow_exceptions=*/false);
  if (!cfg.is_object()) throw IoError(ckpt.path + ": nabla.config is not a JSON object");
  const std::string& arch = ckpt.architecture;
  if (arch != "vit" && arch != "gpt2" && arch != "llama") {
    throw UsageError(ckpt.path + ": GGUF export supports the architectures \"vit\", \"gpt2\" and \"llama\", got " +
                     (arch.empty() ? std::string("none") : "\"" + arch + "\""));
  }
  nlohmann::json preset = cfg.value("preset", nlohmann::json());
  std::string name =
      preset.is_string() && !preset.get<std::string>().empty() ? preset.get<std::string>() : arch;
  GgufWriter w;
  w.set("general.architecture", arch);
  w.set("general.name", name);
  w.set("general.file_type", uint32_t(0));  // all tensors F32 (ggml's LLAMA_FTYPE_ALL_F32)
  if (arch == "vit") {
    add_vit(ckpt, w);
  } else if (arch == "gpt2") {
    add_gpt2(ckpt, options, w);
  } else {
    add_llama(ckpt, options, w);  // general.architecture "llama", "qwen2", "qwen3", "smollm3" or "gemma3"
  }
  return w;
}

GgufWriter gguf_lora_adapter(const LlamaConfig& c, const PeftAdapter& adapter) {
  if (adapter.config.dora) {
    throw UsageError(adapter.path + ": a DoRA adapter (use_dora), which llama.cpp's LoRA adapters cannot hold; "
                     "merge it into the model instead (nabla export gguf --adapter)");
  }
  const std::string arch = gguf_architecture(c);
  const bool interleave = interleaves_heads(arch);
  GgufWriter w;
  w.set("general.architecture", arch);
  w.set("general.type", "adapter");
  w.set("general.name", "nabla LoRA adapter");
  w.set("adapter.type", "lora");
  const nn::LoraConfig& l = adapter.config;
  w.set("adapter.lora.alpha", float(l.rslora ? l.alpha * std::sqrt(double(l.r)) : l.alpha));
  const std::map<std::string, std::pair<std::string, int64_t>> gguf_names{
      {"q_proj", {"attn_q", c.num_attention_heads}}, {"k_proj", {"attn_k", c.kv_heads()}},
      {"v_proj", {"attn_v", 0}},          {"o_proj", {"attn_output", 0}},
      {"gate_proj", {"ffn_gate", 0}},     {"up_proj", {"ffn_up", 0}},
      {"down_proj", {"ffn_down", 0}},     {"qkv_proj", {"attn_qkv", 0}},  // phi3's fused ones
      {"gate_up_proj", {"ffn_up", 0}}};
  const std::string prefix = "base_model.model.model.layers.";
  for (const auto& [name, t] : adapter.weights.tensors) {
    // base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight
    const bool is_a = name.ends_with(".lora_A.weight"), is_b = name.ends_with(".lora_B.weight");
    const size_t dot = name.find('.', prefix.size());
    if (!name.starts_with(prefix) || !(is_a || is_b) || dot == std::string::npos) {
      throw UsageError(adapter.path + ": tensor '" + name + "' is not a Llama layer's lora_A or lora_B");
    }
    const std::string layer = name.substr(prefix.size(), dot - prefix.size());
    const std::string path = name.substr(0, name.size() - std::string(".lora_A.weight").size());
    const std::string module = path.substr(path.find_last_of('.') + 1);
    const auto g = gguf_names.find(module);
    if (g == gguf_names.end()) throw UsageError(adapter.path + ": llama.cpp has no tensor for module '" + module + "'");
    const auto [gguf, heads] = g->second;
    const std::string base = "blk." + layer + "." + gguf + ".weight";
    if (is_a) {
      w.add_tensor(base + ".lora_a", t);
    } else {
      w.add_tensor(base + ".lora_b", heads > 0 && interleave ? interleave_heads(t, heads) : t);
    }
  }
  return w;
}

void write_tokenizer_json(const std::string& source, const BpeTokenizer& tok, const std::string& target) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(source, ec) && !is_gguf_file(source)) {
    write_file_atomic(target, read_file(source));
  } else {
    tok.save_json(target);
  }
}

std::vector<std::string> save_llama_folder(const std::string& dir, const LlamaConfig& config, const nn::Params& params,
                                           const std::string& tokenizer, const std::string& chat_template,
                                           const std::string& vocab) {
  std::unique_ptr<Tokenizer> tok = tokenizer == "byte" ? nullptr : make_tokenizer(tokenizer, vocab);
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(tok.get());
  if (tok && !bpe) throw UsageError("Hugging Face folder " + dir + ": tokenizer " + tokenizer + " is not BPE");
  save_hf_folder(dir, config.to_json(), params);
  std::vector<std::string> written = {"config.json", "model.safetensors"};
  if (bpe) {
    write_tokenizer_json(tokenizer, *bpe, dir + "/tokenizer.json");
    written.push_back("tokenizer.json");
  }
  // The chat template, as transformers saves it.
  if (!chat_template.empty()) {
    write_file_atomic(dir + "/chat_template.jinja", chat_template);
    written.push_back("chat_template.jinja");
  }
  return written;
}

}  // namespace nabla::models
