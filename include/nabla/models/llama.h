// The Llama family (Llama 2/3, SmolLM2, SmolLM3, TinyLlama, Mistral, Qwen2,
// Qwen3, Gemma 2, Gemma 3's text model, Phi-3 / Phi-3.5 / Phi-4-mini), laid
// out as Hugging Face's LlamaForCausalLM / MistralForCausalLM /
// Qwen2ForCausalLM / Qwen3ForCausalLM / SmolLM3ForCausalLM /
// Gemma2ForCausalLM / Gemma3ForCausalLM / Phi3ForCausalLM so that parameter
// names and shapes match their checkpoints: RMSNorm, grouped-query attention
// with rotary positions (rotate-half), a SwiGLU (Gemma: GeGLU) MLP, an
// untied or tied head.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nabla/nn.h"

namespace nabla {
struct Checkpoint;
}

namespace nabla::models {

// Hugging Face's config.json keys.
struct LlamaConfig {
  std::string preset;
  // "llama", "mistral" (Llama's maths; sliding_window), "qwen2" (q/k/v
  // biases), "qwen3" (q/k heads RMS-normed), "smollm3" (Llama's maths, some
  // layers without rotary positions), "gemma3_text" (Gemma 3: norms scaled by
  // 1 + weight, also after attention and the MLP; q/k heads normed; GeGLU;
  // the embedding scaled by sqrt(hidden_size); sliding-window layers with
  // their own rotary base), "gemma2" (Gemma 3's block without q/k norms,
  // every other layer sliding, scores and logits soft-capped), "phi3"
  // (Phi-3, Phi-3.5, Phi-4-mini: q, k and v in one qkv_proj, gate and up in
  // one gate_up_proj; longrope; partial rotary; Mistral's sliding_window).
  std::string model_type = "llama";
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // 0: num_attention_heads
  int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double initializer_range = 0.02;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q, k and v biases (Qwen2's; set by model_type "qwen2")
  // Mistral's window (every layer) and that of the sliding_attention layers
  // of Gemma 3, and of Qwen2, Qwen3 and SmolLM3 with use_sliding_window:
  // each token attends to the last sliding_window tokens, itself included
  // (0: every earlier token).
  int64_t sliding_window = 0;
  // "sliding_attention" or "full_attention" per layer (config.json's
  // layer_types; without them Gemma 3's every sliding_window_pattern-th layer
  // is full, Qwen's layers from max_window_layers on slide, SmolLM3's NoPE
  // layers slide). Empty: no layer slides but Mistral's. Gemma 3: the sliding
  // layers' rotary base (no rope_scaling there); the scores' scale
  // 1/sqrt(query_pre_attn_scalar).
  std::vector<std::string> layer_types;
  double rope_local_base_freq = 10000.0;
  double query_pre_attn_scalar = 0;  // 0: head_size()
  // Gemma 2's soft caps (0: none): attention's scores cap * tanh(s / cap)
  // before the softmax, and the logits likewise.
  double attn_logit_softcapping = 0, final_logit_softcapping = 0;
  // SmolLM3: per layer, 1 where it rotates its queries and keys, 0 where it
  // has no positions at all (NoPE); config.json's no_rope_layers, or every
  // no_rope_layer_interval-th layer NoPE. Empty for the other model types.
  std::vector<int64_t> no_rope_layers;
  // Phi-3: the rotated share of each query and key head (Phi-4-mini: 0.75;
  // the rest passes through).
  double partial_rotary_factor = 1;
  std::string tokenizer = "byte";  // byte, gpt2, or the path of a tokenizer.json or GGUF model
  // Read from a multimodal Gemma 3's config.json (model_type "gemma3",
  // Gemma3ForConditionalGeneration): the text model alone is built, and
  // since Hugging Face names its layers model.language_model.layers.*
  // there, PEFT adapters for it are named so (save_peft_adapter). Not
  // written by to_json: what nabla saves of it is the text model.
  bool multimodal = false;
  // config.json's rope_scaling: none (type ""), "linear" (every frequency
  // divided by factor), "llama3" (Llama 3.1/3.2: low frequencies divided
  // by factor, high ones kept, a smooth blend between) or "longrope"
  // (Phi-3's: each frequency divided by its short_factor, or for rows longer
  // than original_max_position_embeddings by its long_factor; cos and sin
  // scaled by attention_factor, by default sqrt(1 + ln(factor) /
  // ln(original)) with factor = max_position_embeddings / original).
  struct RopeScaling {
    std::string type;
    double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
    int64_t original_max_position_embeddings = 8192;
    std::vector<double> short_factor, long_factor;
    double attention_factor = 0;  // longrope: 0 derives it
  } rope_scaling;

  int64_t kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  // Qwen3's q_norm and k_norm: each query and key head RMS-normed (weights
  // [head_size()]) before the rotary positions.
  bool qk_norm() const { return model_type == "qwen3" || gemma3(); }
  // Gemma's block (Gemma 2 and 3): norms scaled by 1 + weight around both
  // branches, GeGLU, the embedding scaled by sqrt(hidden_size), scores by
  // 1/sqrt(query_pre_attn_scalar), sliding and full layers.
  bool gemma() const { return gemma3() || model_type == "gemma2"; }
  bool gemma3() const { return model_type == "gemma3_text"; }
  bool phi3() const { return model_type == "phi3"; }
  // The rotated first part of each head: head_size() * partial_rotary_factor.
  int64_t rotary_dims() const { return int64_t(double(head_size()) * partial_rotary_factor); }
  // Whether layer i rotates its queries and keys (SmolLM3's NoPE layers do not).
  bool layer_rotates(int64_t i) const { return no_rope_layers.empty() || no_rope_layers[size_t(i)] != 0; }
  // The model types whose layers slide or not by layer_types.
  bool windows_by_layer() const {
    return gemma() || model_type == "qwen2" || model_type == "qwen3" || model_type == "smollm3";
  }
  // Layer i's sliding window (0: every earlier token).
  int64_t layer_window(int64_t i) const {
    if (!layer_types.empty()) return layer_types[size_t(i)] == "sliding_attention" ? sliding_window : 0;
    return model_type == "mistral" || phi3() ? sliding_window : 0;
  }
  // The divisor of each of the rotary_dims() / 2 rotary frequencies that
  // rope_scaling gives, as Hugging Face computes them (empty: none;
  // longrope: its short factors).
  std::vector<double> rope_freq_factors() const;
  // longrope's multiplier of cos and sin (1 for the other scalings).
  double rope_attention_factor() const;
  void validate() const;
  // Elements in the parameters Llama builds from this (valid) config
  // (saturates at INT64_MAX); known before anything is allocated.
  int64_t parameter_count() const;
  // Hugging Face's config.json (model_type, architectures) with nabla's
  // "architecture": "llama" beside it.
  std::string to_json() const;
  // A config.json of model_type "llama", "mistral", "qwen2", "qwen3",
  // "smollm3" or "gemma3_text" (keys it does not use are ignored), as
  // transformers 4 writes it (rope_theta, rope_scaling) or 5
  // (rope_parameters); of model_type "gemma3" (a multimodal Gemma 3), its
  // text_config, whose absent keys take Gemma3TextConfig's defaults; or a
  // nabla checkpoint's config. IoError naming the problem.
  static LlamaConfig from_json(const std::string& json);
};

// The config of a Llama checkpoint. IoError naming the file when it holds
// another architecture, a bad config, or fewer values than the config's
// parameters need.
LlamaConfig llama_config_from_checkpoint(const Checkpoint& ckpt);

// "smollm2-135m" (SmolLM2-135M's shape), "llama-tiny-byte" (a byte-vocabulary
// model that trains on the built-in text in minutes on 2 cores).
LlamaConfig llama_preset(const std::string& name);

class Llama {
 public:
  Llama(const LlamaConfig& config, uint64_t seed);
  // The checkpoint's model built on its tensors as they are, none allocated
  // or copied: projections read with keep_stored stay in their storage type
  // (QLoRA's base; checkpoint_from_gguf). IoError naming the file for a bad
  // config or a missing or mis-shaped tensor.
  explicit Llama(const Checkpoint& ckpt);

  // input_ids i32 [B, T] -> logits [B, T, V]. T may exceed
  // max_position_embeddings only as far as the positions' rotation allows
  // (no learned positions): it is refused beyond it, as Hugging Face warns.
  // `train` turns the adapters' dropout on (the model itself has none).
  // segments (i32 [B, T]): documents packed into a row, each token attending
  // within its own id only. Positions run on along the row: rotary
  // attention depends on positions' differences alone, so each document
  // computes as it would from position 0.
  Tensor forward(const Tensor& input_ids, bool train = false, const Tensor& segments = Tensor()) const;

  // Hugging Face's causal-LM loss: position t predicts labels[t + 1]
  // (labels i32 [B, T], -100 ignored), the mean over counted positions.
  Tensor loss(const Tensor& input_ids, const Tensor& labels, bool train = false,
              const Tensor& segments = Tensor()) const;
  // Mean next-token cross-entropy over all B * T positions of tokens i32
  // [B, T + 1] (GPT-2's training loss; no dropout, so `train` changes nothing).
  Tensor next_token_loss(const Tensor& tokens, bool train) const;
  // Gradient checkpointing (Hugging Face's name): each block's activations
  // are recomputed in the backward from the block's input (recompute()),
  // and loss() / next_token_loss() compute the head's logits and their
  // cross-entropy a chunk of rows at a time, each chunk recomputed likewise,
  // never all [B, T, V] at once. The same values and gradients, for a block's
  // forward work again and a fraction of the activation memory.
  // `chunk_logits`: logits per chunk (rows = chunk_logits / vocabulary).
  void set_gradient_checkpointing(bool on, int64_t chunk_logits = int64_t(8) << 20) {
    checkpointing_ = on;
    chunk_logits_ = chunk_logits;
    for (nn::TransformerBlock& b : layers_) b.checkpointed = on;
  }
  bool gradient_checkpointing() const { return checkpointing_; }

  // A decoding step over at most max_tokens positions (sampling). longrope
  // rotates by the factors for max_tokens positions throughout (llama.cpp
  // chooses by its context so too).
  nn::DecodeStep decode_step(int64_t max_tokens) const;
  // A prompt of `tokens` tokens in one pass, for the decoding steps after
  // (DecodeStep::remember_prompt) of a decode_step(max_tokens).
  nn::DecodeStep::Prompt prompt(int64_t tokens, int64_t max_tokens = 0) const;

  // LoRA: freezes the model's parameters (params() still lists them, for
  // loading) and gives the targeted projections adapters, whose A and B
  // are adapter()'s parameters under PEFT's names. Targets are Hugging
  // Face's module names (llama_lora_modules); none: all of them. With
  // dropout, its seed is lora_dropout_seed(), to be rewritten every step.
  // UsageError for bad settings or a second call.
  void add_lora(const nn::LoraConfig& config, uint64_t seed);
  const nn::LoraConfig& lora() const { return lora_; }  // r 0: no adapters
  // Folds every adapter into its base weight and drops the adapters: the
  // merged model, as PEFT's merge_and_unload gives it.
  void merge_lora();
  nn::Params& adapter() { return adapter_; }
  const nn::Params& adapter() const { return adapter_; }
  const Tensor& lora_dropout_seed() const { return lora_seed_; }

  const LlamaConfig& config() const { return config_; }
  nn::Params& params() { return params_; }
  const nn::Params& params() const { return params_; }

 private:
  void build(nn::Init& init);
  // The token embeddings of ids, scaled by sqrt(hidden_size) for Gemma.
  Tensor embed(const Tensor& ids) const;
  // The final norm's output for input_ids, [B, T, D].
  Tensor hidden(const Tensor& input_ids, bool train, const Tensor& segments) const;
  // The head's logits of h [.., D] (Gemma 2: soft-capped).
  Tensor logits(const Tensor& h) const;
  // Mean cross-entropy of h [B, T', D]'s logits against targets i32 [B, T']
  // (-100 not counted), in chunks of rows when checkpointing.
  Tensor head_loss(const Tensor& h, const Tensor& targets) const;

  LlamaConfig config_;
  nn::Params params_;
  nn::Embedding embed_;
  std::vector<nn::TransformerBlock> layers_;
  nn::Norm norm_;
  nn::Embedding lm_head_;  // [V, D] rows against which the head's logits are taken: embed_ when tied
  nn::LoraConfig lora_{.r = 0};
  nn::Params adapter_;
  Tensor lora_seed_;
  bool checkpointing_ = false;
  int64_t chunk_logits_ = 0;
};

// Hugging Face's names of the projections LoRA can target, in the order
// PEFT's docs list them: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
// down_proj; Phi-3's qkv_proj, o_proj, gate_up_proj, down_proj.
const std::vector<std::string>& llama_lora_modules(const LlamaConfig& c);

}  // namespace nabla::models
