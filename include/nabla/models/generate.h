// Text generation from a GPT-2 or Llama model: the prompt's pass, then one
// compiled decoding step per new token with a key/value cache, so each token
// costs one position's work. `nabla sample` and the C API's
// nabla_finetune_generate run it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "nabla/executor.h"

namespace nabla::models {

class Gpt2;
class Llama;

// How each token is drawn (as Hugging Face's and llama.cpp's samplers): the
// softmax of logits / temperature over the top_k likeliest tokens, less
// those under min_p times the likeliest's probability, less those past the
// smallest set of likeliest whose mass reaches top_p (the likeliest always
// stays). The defaults sample the whole distribution.
struct SamplingOptions {
  double temperature = 1.0;  // <= 0: greedy
  int top_k = 0;             // 0: every token
  double top_p = 1.0;        // in (0, 1]
  double min_p = 0.0;        // in [0, 1)
};

struct GenerateOptions {
  int64_t max_new_tokens = 64;  // at most; fewer when the model's context ends first
  SamplingOptions sampling;
  uint64_t seed = 1;
  // Ids that end generation, not themselves part of it
  // (end_of_generation_ids(tokenizer); empty: run to max_new_tokens).
  std::vector<int32_t> stop;
  ExecOptions exec;
};

struct Generation {
  std::vector<int32_t> tokens;  // the new ids, without the stop id
  // Each one's log-probability under the model (the log-softmax of its
  // logits, before temperature and top-k).
  std::vector<double> logprobs;
  bool stopped = false;         // ended at a stop id
  // The prompt's pass with its compilation, and the decoding steps after
  // (the first new token comes from the prompt's logits).
  double prompt_seconds = 0, decode_seconds = 0;
  int64_t decode_steps = 0;
  std::string profile;  // the decoding step's time per op (ExecOptions::profile, NABLA_PROFILE=1)
};

// A Hugging Face folder's generation_config.json, as transformers'
// generate() reads it: greedy unless "do_sample" is true, then its
// "temperature" (default 1), "top_k" (50), "top_p" (1) and "min_p" (0);
// "eos_token_id" (a number or a list) ends generation too.
struct GenerationConfig {
  SamplingOptions sampling;
  std::vector<int32_t> eos;
};
// std::nullopt when `path` is not a folder or has no generation_config.json;
// IoError naming the file for bad JSON or a field of the wrong type.
std::optional<GenerationConfig> checkpoint_generation_config(const std::string& path);

// One token drawn from logits as `o` says (the likeliest when temperature <= 0).
int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng);

// The prompt continued by up to max_new_tokens tokens, each passed to
// on_token as it comes. The model as it stands (a LoRA adapter attached and
// trained so far included; no dropout). UsageError naming `generate` for an
// empty prompt, an id outside the vocabulary, max_new_tokens < 1, sampling
// options outside their ranges, or a prompt that fills the model's context.
Generation generate(const Llama& model, std::span<const int32_t> prompt, const GenerateOptions& options,
                    const std::function<void(int32_t)>& on_token = {});
Generation generate(const Gpt2& model, std::span<const int32_t> prompt, const GenerateOptions& options,
                    const std::function<void(int32_t)>& on_token = {});

}  // namespace nabla::models
