// `nabla sample`: text from a GPT-2 or Llama checkpoint (a nabla checkpoint,
// a Hugging Face folder or a llama.cpp GGUF), continuing a prompt or
// replying to a chat message in the model's template. One compiled decoding
// step with a key/value cache: each new token costs one position's work,
// never the whole prefix again.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "commands.h"
#include "nabla/models/generate.h"
#include "nabla/models/gguf.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/models/lora.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/finetune_data.h"
#include "nabla/tokenizer.h"

namespace nabla::cli {

int run_sample(const SampleArgs& a) {
  Checkpoint ckpt = models::load_any_checkpoint(a.checkpoint);
  // The model and its tokenizer.
  std::unique_ptr<models::Gpt2> gpt2;
  std::unique_ptr<models::Llama> llama;
  std::string tokenizer;
  if (ckpt.architecture == "llama") {
    llama = std::make_unique<models::Llama>(models::llama_config_from_checkpoint(ckpt), 0);
    load_params(ckpt, llama->params());
    if (!a.adapter.empty()) {
      models::attach_peft_adapter(*llama, a.adapter);
      // DoRA's norms would be recomputed every token; merged, they are not.
      if (llama->lora().dora) llama->merge_lora();
    }
    tokenizer = llama->config().tokenizer;
  } else {
    if (!a.adapter.empty()) throw UsageError("sample: --adapter takes a Llama-family model, not " + ckpt.path);
    gpt2 = std::make_unique<models::Gpt2>(models::gpt2_config_from_checkpoint(ckpt), 0);
    load_params(ckpt, gpt2->params());
    tokenizer = gpt2->config().tokenizer;
  }
  std::unique_ptr<Tokenizer> tok = make_tokenizer(
      a.tokenizer.empty() ? models::checkpoint_tokenizer(a.checkpoint, tokenizer) : a.tokenizer, a.vocab);

  // The tokenizer's prefix (Llama 3's <|begin_of_text|>), then the prompt;
  // or the chat message in the template, up to the assistant's header.
  // generate() checks that it leaves room in the context.
  std::vector<int32_t> ids;
  if (!a.chat.empty()) {
    const FinetuneDataOptions chat =
        chat_template_options(a.chat_template, models::checkpoint_chat_template(a.checkpoint), a.checkpoint);
    std::vector<ChatMessage> messages;
    if (!a.system.empty()) messages.push_back({"system", a.system});
    messages.push_back({"user", a.chat});
    ids = chat_prompt_ids(messages, *tok, chat);
  } else {
    ids = tok->prefix_ids();
    for (int32_t id : tok->encode(a.prompt)) ids.push_back(id);
  }
  if (ids.empty()) ids.push_back(tok->eot_id() >= 0 ? tok->eot_id() : int32_t('\n'));
  models::GenerateOptions options{.max_new_tokens = a.tokens,
                                  .sampling = {.temperature = a.temperature,
                                               .top_k = a.top_k,
                                               .top_p = a.top_p,
                                               .min_p = a.min_p},
                                  .seed = a.seed,
                                  .stop = a.ignore_eos ? std::vector<int32_t>{} : end_of_generation_ids(*tok),
                                  .exec = {.threads = a.threads, .backend = a.backend}};
  // A folder's generation_config.json, as transformers' generate() reads it,
  // for what the command line leaves unsaid.
  if (const std::optional<models::GenerationConfig> g = models::checkpoint_generation_config(a.checkpoint)) {
    const auto given = [&](const char* o) { return std::ranges::count(a.sampling_given, o) > 0; };
    models::SamplingOptions& s = options.sampling;
    if (!given("--temperature")) s.temperature = g->sampling.temperature;
    if (!given("--top-k")) s.top_k = g->sampling.top_k;
    if (!given("--top-p")) s.top_p = g->sampling.top_p;
    if (!given("--min-p")) s.min_p = g->sampling.min_p;
    if (!a.ignore_eos) options.stop.insert(options.stop.end(), g->eos.begin(), g->eos.end());
  }
  // The prompt is echoed once generate() has accepted it (nothing printed
  // before an error), then each token as it comes.
  bool echoed = !a.chat.empty();
  const auto echo_prompt = [&] {
    if (!echoed) fmt::print("{}", a.prompt);
    echoed = true;
  };
  const auto print = [&](int32_t id) {
    echo_prompt();
    fmt::print("{}", tok->decode(std::span<const int32_t>(&id, 1)));
    std::fflush(stdout);
  };
  const models::Generation g =
      llama ? models::generate(*llama, ids, options, print) : models::generate(*gpt2, ids, options, print);
  echo_prompt();
  fmt::print("\n");
  std::fflush(stdout);  // the text before the timings on a shared stream
  if (!g.profile.empty()) fmt::print(stderr, "{}", g.profile);
  if (a.timings) {
    const auto n = ids.size();
    fmt::print(stderr, "prompt: {} tokens in {:.3f} s ({:.1f} tokens/s)\n", n, g.prompt_seconds,
               double(n) / g.prompt_seconds);
    fmt::print(stderr, "generation: {} tokens, {} decoding steps in {:.3f} s ({:.1f} tokens/s){}\n", g.tokens.size(),
               g.decode_steps, g.decode_seconds, double(g.decode_steps) / g.decode_seconds,
               g.stopped ? ", stopped at the end of text" : "");
  }
  return kExitOk;
}

}  // namespace nabla::cli
