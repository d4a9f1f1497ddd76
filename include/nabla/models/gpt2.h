// GPT-2 (Radford et al. 2019), laid out as Hugging Face's GPT2Model so that
// parameter names and shapes match its checkpoints (Conv1D weights [in, out]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nabla/nn.h"

namespace nabla {
struct Checkpoint;
}

namespace nabla::models {

struct Gpt2Config {
  std::string preset;
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;  // context length
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double layer_norm_epsilon = 1e-5;
  double dropout = 0.0;  // residual and embedding dropout (resid_pdrop, embd_pdrop)
  bool bias = true;
  std::string gelu = "gelu";  // GPT-2's gelu_new: the tanh approximation
  std::string tokenizer = "gpt2";  // byte, gpt2, or the path of a tokenizer.json or GGUF model

  void validate() const;
  // Elements in the parameters Gpt2 builds from this (valid) config (saturates at
  // INT64_MAX); known before anything is allocated.
  int64_t parameter_count() const;
  std::string to_json() const;  // Hugging Face names, architecture "gpt2"
  static Gpt2Config from_json(const std::string& json);
};

// "gpt2" (124M), "gpt2-small-byte" (byte vocabulary, for 2 cores; see gpt2.cpp).
Gpt2Config gpt2_preset(const std::string& name);

// The config of a GPT-2 checkpoint. IoError naming the file when it holds
// another architecture, a bad config, or fewer values than the config's
// parameters need (so a damaged config cannot make Gpt2 allocate without bound).
Gpt2Config gpt2_config_from_checkpoint(const Checkpoint& ckpt);

class Gpt2 {
 public:
  Gpt2(const Gpt2Config& config, uint64_t seed);

  // tokens i32 [B, T] -> logits [B, T, V]. With train, dropout draws from
  // `dropout_seed` (an i32 leaf the trainer rewrites).
  Tensor forward(const Tensor& tokens, bool train) const;

  // Mean next-token cross-entropy over all B * T positions of tokens i32
  // [B, T + 1]: inputs tokens[:, :-1], targets tokens[:, 1:]. The training
  // loss, also used by validation and `nabla grad`.
  Tensor next_token_loss(const Tensor& tokens, bool train) const;

  // Gradient checkpointing, as Llama's: each block recomputed in the
  // backward from its input, and next_token_loss's logits and their
  // cross-entropy taken `chunk_logits` logits at a time, each chunk
  // recomputed likewise. The same values and gradients for a fraction of the
  // activation memory (a block's forward runs twice).
  void set_gradient_checkpointing(bool on, int64_t chunk_logits = int64_t(8) << 20) {
    checkpointing_ = on;
    chunk_logits_ = chunk_logits;
    for (nn::TransformerBlock& b : blocks_) b.checkpointed = on;
  }
  bool gradient_checkpointing() const { return checkpointing_; }

  // One decoding step with a key/value cache (see gpt2.cpp): built once,
  // run once per generated token.
  using DecodeStep = nn::DecodeStep;
  DecodeStep decode_step(int64_t max_tokens) const;

  const Gpt2Config& config() const { return config_; }
  nn::Params& params() { return params_; }
  const nn::Params& params() const { return params_; }
  Tensor dropout_seed;

 private:
  Gpt2Config config_;
  nn::Params params_;
  nn::Embedding wte_, wpe_;
  std::vector<nn::TransformerBlock> blocks_;
  nn::Norm ln_f_;
  nn::Dropout drop_;
  bool checkpointing_ = false;
  int64_t chunk_logits_ = int64_t(8) << 20;
  Tensor hidden(const Tensor& tokens, bool train) const;  // forward's, before the head
};

}  // namespace nabla::models
