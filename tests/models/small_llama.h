// A small Llama for tests: GQA 3 (6 query heads, 2 key/value heads), a head
// size that is not hidden / heads, q/k/v biases, an untied head.
#pragma once

#include <string>

#include "nabla/checkpoint.h"
#include "nabla/models/llama.h"

namespace nabla::testing_models {

inline models::LlamaConfig small_llama() {
  models::LlamaConfig c;
  c.vocab_size = 37;
  c.hidden_size = 24;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 6;
  c.max_position_embeddings = 32;
  c.rope_theta = 500.0;
  c.attention_bias = true;
  c.tie_word_embeddings = false;
  return c;
}

// A model of config c with weights drawn from `seed`, saved as a nabla
// checkpoint at `path` (a base for fine-tuning tests).
inline void save_llama(const std::string& path, const models::LlamaConfig& c, uint64_t seed = 5) {
  models::Llama model(c, seed);
  save_checkpoint(path, c.to_json(), model.params());
}

}  // namespace nabla::testing_models
