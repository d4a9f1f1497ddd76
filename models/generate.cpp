#include "nabla/models/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "nabla/error.h"
#include "nabla/graph.h"
#include "nabla/io.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"

namespace nabla::models {

int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng) {
  std::vector<int32_t> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i);
  size_t k = o.top_k > 0 ? std::min<size_t>(size_t(o.top_k), idx.size()) : idx.size();
  if (o.temperature <= 0) k = 1;
  std::partial_sort(idx.begin(), idx.begin() + std::ptrdiff_t(k), idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (k == 1) return idx[0];
  // Probabilities at the temperature (relative to the likeliest's), then
  // min-p's floor and top-p's nucleus: the likeliest tokens whose mass
  // reaches top_p, the first always.
  std::vector<double> w(k);
  double total = 0;
  for (size_t i = 0; i < k; ++i) total += w[i] = std::exp((logits[idx[i]] - logits[idx[0]]) / o.temperature);
  size_t kept = 1;
  for (double mass = w[0]; kept < k && mass < o.top_p * total && w[kept] >= o.min_p; ++kept) mass += w[kept];
  std::discrete_distribution<size_t> pick(w.begin(), w.begin() + std::ptrdiff_t(kept));
  return idx[pick(rng)];
}

std::optional<GenerationConfig> checkpoint_generation_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file = fs::path(path) / "generation_config.json";
  if (!fs::is_directory(path, ec) || !fs::is_regular_file(file, ec)) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(read_file(file.string()), nullptr, false);
  const auto fail = [&](const std::string& what) { throw IoError(file.string() + ": " + what); };
  if (!j.is_object()) fail("not a JSON object");
  const auto number = [&](const char* key, double fallback) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_number()) fail(std::string("\"") + key + "\" is " + it->dump() + ", expected a number");
    return it->get<double>();
  };
  GenerationConfig g;
  const auto sample = j.find("do_sample");
  if (sample != j.end() && !sample->is_boolean() && !sample->is_null()) fail("\"do_sample\" must be true or false");
  if (sample != j.end() && sample->is_boolean() && sample->get<bool>()) {
    g.sampling = {.temperature = number("temperature", 1.0),
                  .top_k = int(number("top_k", 50)),
                  .top_p = number("top_p", 1.0),
                  .min_p = number("min_p", 0.0)};
  } else {
    g.sampling = {.temperature = 0};
  }
  const SamplingOptions& o = g.sampling;
  if (!(o.temperature >= 0 && std::isfinite(o.temperature)) || o.top_k < 0 || !(o.top_p > 0 && o.top_p <= 1) ||
      !(o.min_p >= 0 && o.min_p < 1)) {
    fail("expected a temperature >= 0, top_k >= 0, top_p in (0, 1] and min_p in [0, 1)");
  }
  if (const auto eos = j.find("eos_token_id"); eos != j.end() && !eos->is_null()) {
    for (const nlohmann::json& id : eos->is_array() ? *eos : nlohmann::json::array({*eos})) {
      if (!id.is_number_integer()) fail("\"eos_token_id\" must be a token id or a list of them");
      g.eos.push_back(id.get<int32_t>());
    }
  }
  return g;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// log softmax(logits)[id], in double.
double log_softmax_at(std::span<const float> logits, int32_t id) {
  const float top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - top);
  return double(logits[size_t(id)]) - top - std::log(sum);
}

// The length a generation's decoding step spans, after checking its inputs.
int64_t decoding_length(std::span<const int32_t> prompt, const GenerateOptions& o, int64_t vocab, int64_t context) {
  if (prompt.empty()) throw UsageError("generate: the prompt is empty (give at least one token)");
  if (o.max_new_tokens < 1) throw UsageError("generate: max_new_tokens is " + std::to_string(o.max_new_tokens) + ", expected >= 1");
  const SamplingOptions& p = o.sampling;
  if (!std::isfinite(p.temperature) || p.top_k < 0 || !(p.top_p > 0 && p.top_p <= 1) || !(p.min_p >= 0 && p.min_p < 1)) {
    throw UsageError("generate: sampling with temperature " + std::to_string(p.temperature) + ", top_k " +
                     std::to_string(p.top_k) + ", top_p " + std::to_string(p.top_p) + ", min_p " +
                     std::to_string(p.min_p) + "; expected a finite temperature, top_k >= 0, top_p in (0, 1] and "
                     "min_p in [0, 1)");
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= vocab) {
      throw UsageError("generate: token id " + std::to_string(id) + " is outside the vocabulary of " +
                       std::to_string(vocab));
    }
  }
  const auto n = int64_t(prompt.size());
  if (n >= context) {
    throw UsageError("generate: the prompt's " + std::to_string(n) + " tokens fill the context of " +
                     std::to_string(context));
  }
  return std::min(context, n + o.max_new_tokens);
}

// Samples from the prompt's logits, then a decoding step per token after.
// prompt_pass: the prompt's keys and values into s's caches; returns its last logits.
Generation decode(nn::DecodeStep s, std::span<const int32_t> prompt, int64_t max_len, const GenerateOptions& o,
                  const std::function<std::vector<float>(nn::DecodeStep&, Executor&)>& prompt_pass,
                  const std::function<void(int32_t)>& on_token) {
  Executor ex(Graph(s.outputs()), o.exec);
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  Generation g;
  const auto t0 = Clock::now();
  std::vector<float> logits = prompt_pass(s, ex);
  g.prompt_seconds = seconds_since(t0);
  const auto t1 = Clock::now();
  std::mt19937_64 rng(o.seed);
  while (true) {
    const int32_t id = sample_token(logits, o.sampling, rng);
    if (std::find(o.stop.begin(), o.stop.end(), id) != o.stop.end()) {
      g.stopped = true;
      break;
    }
    ids.push_back(id);
    g.tokens.push_back(id);
    g.logprobs.push_back(log_softmax_at(logits, id));
    if (on_token) on_token(id);
    if (int64_t(ids.size()) >= max_len) break;
    const int64_t p = int64_t(ids.size()) - 1;  // the new token, at its position
    s.token.data_as<int32_t>()[0] = id;
    s.position.data_as<int32_t>()[0] = int32_t(p);
    ex.run();
    s.remember(ex, p);
    logits = ex.read<float>(s.logits);
    ++g.decode_steps;
  }
  g.decode_seconds = seconds_since(t1);
  g.profile = ex.profile();
  return g;
}

}  // namespace

Generation generate(const Llama& model, std::span<const int32_t> prompt, const GenerateOptions& options,
                    const std::function<void(int32_t)>& on_token) {
  const int64_t max_len =
      decoding_length(prompt, options, model.config().vocab_size, model.config().max_position_embeddings);
  // The prompt in one pass (matrix products, not a step per token).
  return decode(
      model.decode_step(max_len), prompt, max_len, options,
      [&](nn::DecodeStep& s, Executor&) {
        nn::DecodeStep::Prompt p = model.prompt(int64_t(prompt.size()), max_len);
        Executor pass(Graph(p.outputs()), options.exec);
        std::copy(prompt.begin(), prompt.end(), p.tokens.data_as<int32_t>());
        pass.run();
        s.remember_prompt(pass, p);
        return pass.read<float>(p.logits);
      },
      on_token);
}

Generation generate(const Gpt2& model, std::span<const int32_t> prompt, const GenerateOptions& options,
                    const std::function<void(int32_t)>& on_token) {
  const int64_t max_len = decoding_length(prompt, options, model.config().vocab_size, model.config().n_positions);
  // GPT-2 has no prompt graph: the decoding step, a token at a time.
  return decode(
      model.decode_step(max_len), prompt, max_len, options,
      [&](nn::DecodeStep& s, Executor& ex) {
        for (size_t p = 0; p < prompt.size(); ++p) {
          s.token.data_as<int32_t>()[0] = prompt[p];
          s.position.data_as<int32_t>()[0] = int32_t(p);
          ex.run();
          s.remember(ex, int64_t(p));
        }
        return ex.read<float>(s.logits);
      },
      on_token);
}

}  // namespace nabla::models
