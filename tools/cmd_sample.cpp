// `nabla sample`: text from a GPT-2 or Llama checkpoint (a nabla checkpoint,
// a Hugging Face folder or a llama.cpp GGUF), continuing a prompt or
// replying to a chat message in the model's template. One compiled decoding
// step with a key/value cache: each new token costs one position's work,
// never the whole prefix again.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "commands.h"
#include "nabla/models/gguf.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/models/lora.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/finetune_data.h"
#include "nabla/tokenizer.h"

namespace nabla::cli {

namespace {

// Softmax of logits / temperature over the top k, then one draw.
int32_t sample_token(const std::vector<float>& logits, double temperature, int top_k, std::mt19937_64& rng) {
  std::vector<int32_t> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i);
  size_t k = top_k > 0 ? std::min<size_t>(size_t(top_k), idx.size()) : idx.size();
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (temperature <= 0) return idx[0];
  std::vector<double> w(k);
  for (size_t i = 0; i < k; ++i) w[i] = std::exp((logits[idx[i]] - logits[idx[0]]) / temperature);
  std::discrete_distribution<size_t> pick(w.begin(), w.end());
  return idx[pick(rng)];
}

}  // namespace

int run_sample(const SampleArgs& a) {
  Checkpoint ckpt = models::load_any_checkpoint(a.checkpoint);
  // The model, its tokenizer, context length and one decoding step.
  std::unique_ptr<models::Gpt2> gpt2;
  std::unique_ptr<models::Llama> llama;
  std::string tokenizer;
  int64_t context = 0;
  if (ckpt.architecture == "llama") {
    llama = std::make_unique<models::Llama>(models::llama_config_from_checkpoint(ckpt), 0);
    load_params(ckpt, llama->params());
    if (!a.adapter.empty()) models::attach_peft_adapter(*llama, a.adapter);
    tokenizer = llama->config().tokenizer;
    context = llama->config().max_position_embeddings;
  } else {
    if (!a.adapter.empty()) throw UsageError("sample: --adapter takes a Llama-family model, not " + ckpt.path);
    gpt2 = std::make_unique<models::Gpt2>(models::gpt2_config_from_checkpoint(ckpt), 0);
    load_params(ckpt, gpt2->params());
    tokenizer = gpt2->config().tokenizer;
    context = gpt2->config().n_positions;
  }
  std::unique_ptr<Tokenizer> tok = make_tokenizer(
      a.tokenizer.empty() ? models::checkpoint_tokenizer(a.checkpoint, tokenizer) : a.tokenizer, a.vocab);

  // The tokenizer's prefix (Llama 3's <|begin_of_text|>), then the prompt;
  // or the chat message in the template, up to the assistant's header, the
  // reply ending at the template's end of turn.
  std::vector<int32_t> ids, stop;
  if (!a.chat.empty()) {
    const FinetuneDataOptions chat =
        chat_template_options(a.chat_template, models::checkpoint_chat_template(a.checkpoint), a.checkpoint);
    std::vector<ChatMessage> messages;
    if (!a.system.empty()) messages.push_back({"system", a.system});
    messages.push_back({"user", a.chat});
    ids = chat_prompt_ids(messages, *tok, chat);
    stop = chat_stop_ids(*tok, chat.chat_template);
  } else {
    ids = tok->prefix_ids();
    for (int32_t id : tok->encode(a.prompt)) ids.push_back(id);
  }
  if (ids.empty()) ids.push_back(tok->eot_id() >= 0 ? tok->eot_id() : int32_t('\n'));
  int64_t max_len = std::min<int64_t>(context, int64_t(ids.size()) + a.tokens);
  if (int64_t(ids.size()) >= max_len) {
    throw UsageError(fmt::format("sample: the prompt's {} tokens fill the context of {}", ids.size(), context));
  }
  nn::DecodeStep s = llama ? llama->decode_step(max_len) : gpt2->decode_step(max_len);
  Executor ex(Graph(s.outputs()), {.threads = a.threads, .backend = a.backend});
  std::mt19937_64 rng(a.seed);
  const auto step = [&](int64_t p) {  // token ids[p] at position p
    s.token.data_as<int32_t>()[0] = ids[size_t(p)];
    s.position.data_as<int32_t>()[0] = int32_t(p);
    ex.run();
    s.remember(ex, p);
    return ex.read<float>(s.logits);
  };

  if (a.chat.empty()) fmt::print("{}", a.prompt);
  std::fflush(stdout);
  // The prompt: Llama's in one pass (matrix products), GPT-2's a token at a
  // time. Its compilation counts as prompt time.
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const int64_t n = int64_t(ids.size());
  std::vector<float> logits;
  if (llama) {
    nn::DecodeStep::Prompt prompt = llama->prompt(n, max_len);
    Executor pass(Graph(prompt.outputs()), {.threads = a.threads, .backend = a.backend});
    std::copy(ids.begin(), ids.end(), prompt.tokens.data_as<int32_t>());
    pass.run();
    s.remember_prompt(pass, prompt);
    logits = pass.read<float>(prompt.logits);
  } else {
    for (int64_t p = 0; p < n; ++p) logits = step(p);
  }
  const auto t1 = Clock::now();
  while (true) {
    ids.push_back(sample_token(logits, a.temperature, a.top_k, rng));
    if (std::find(stop.begin(), stop.end(), ids.back()) != stop.end()) break;
    fmt::print("{}", tok->decode(std::span<const int32_t>(&ids.back(), 1)));
    std::fflush(stdout);
    if (int64_t(ids.size()) >= max_len) break;
    logits = step(int64_t(ids.size()) - 1);
  }
  const auto t2 = Clock::now();
  fmt::print("\n");
  // NABLA_PROFILE=1: the decoding step's kernel time per op.
  if (std::string prof = ex.profile(); !prof.empty()) fmt::print(stderr, "{}", prof);
  if (a.timings) {
    const double prompt_s = std::chrono::duration<double>(t1 - t0).count();
    const double gen_s = std::chrono::duration<double>(t2 - t1).count();
    const int64_t generated = int64_t(ids.size()) - n;
    fmt::print(stderr, "prompt: {} tokens in {:.3f} s ({:.1f} tokens/s)\n", n, prompt_s, double(n) / prompt_s);
    // The first new token comes from the prompt's logits; each after it
    // takes a decoding step.
    fmt::print(stderr, "generation: {} tokens, {} decoding steps in {:.3f} s ({:.1f} tokens/s)\n", generated,
               generated - 1, gen_s, double(generated - 1) / gen_s);
  }
  return kExitOk;
}

}  // namespace nabla::cli
