// models::generate: the prompt's pass and cached decoding steps give the
// tokens the full forward pass picks; stop ids, lengths and bad input.
#include "nabla/models/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/io.h"
#include "small_llama.h"
#include "temp_dir.h"

namespace nabla {
namespace {

using models::GenerateOptions;
using models::Generation;
using Ids = std::vector<int32_t>;

// Greedy continuation by the full forward pass over the whole prefix each
// time, checking each token's log-probability as generate() gave it.
template <typename Forward>
void expect_greedy_by_full_forward(Ids ids, const Generation& g, int64_t V, Forward forward) {
  ASSERT_EQ(g.logprobs.size(), g.tokens.size());
  for (size_t k = 0; k < g.tokens.size(); ++k) {
    const std::vector<float> logits = eval(forward(Tensor::from_vector<int32_t>({1, int64_t(ids.size())}, ids)))
                                          .template to_vector<float>();
    const std::vector<float> last(logits.end() - V, logits.end());
    const int32_t best = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
    ASSERT_EQ(g.tokens[k], best) << "token " << k;
    double sum = 0;
    for (float l : last) sum += std::exp(double(l) - last[size_t(best)]);
    EXPECT_NEAR(g.logprobs[k], -std::log(sum), 1e-5) << "token " << k;
    ids.push_back(best);
  }
}

TEST(Generate, LlamaGreedyIsTheFullForwardsArgmax) {
  const models::LlamaConfig c = testing_models::small_llama();
  models::Llama m(c, 5);
  const Ids prompt = {3, 1, 4, 1, 5};
  Ids streamed;
  const Generation g = models::generate(m, prompt, {.max_new_tokens = 8, .sampling = {.temperature = 0}},
                                        [&](int32_t id) { streamed.push_back(id); });
  ASSERT_EQ(g.tokens.size(), 8u);
  expect_greedy_by_full_forward(prompt, g, c.vocab_size, [&](const Tensor& t) { return m.forward(t); });
  EXPECT_EQ(streamed, g.tokens);
  EXPECT_FALSE(g.stopped);
  EXPECT_EQ(g.decode_steps, 7);  // the first token comes from the prompt's pass
}

TEST(Generate, Gpt2GreedyIsTheFullForwardsArgmax) {
  models::Gpt2Config c;
  c.vocab_size = 11;
  c.n_positions = 12;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.tokenizer = "byte";
  models::Gpt2 m(c, 3);
  const Ids prompt = {3, 1, 4};
  const Generation g = models::generate(m, prompt, {.max_new_tokens = 6, .sampling = {.temperature = 0}});
  ASSERT_EQ(g.tokens.size(), 6u);
  expect_greedy_by_full_forward(prompt, g, c.vocab_size, [&](const Tensor& t) { return m.forward(t, false); });
  // The context ends it: 12 positions hold the prompt's 3 and 9 more.
  EXPECT_EQ(models::generate(m, prompt, {.max_new_tokens = 100, .sampling = {.temperature = 0}}).tokens.size(), 9u);
}

// A stop id ends generation before it; the tokens before it are the ones an
// unstopped run gives.
TEST(Generate, StopsAtAStopIdLeavingItOut) {
  const models::LlamaConfig c = testing_models::small_llama();
  models::Llama m(c, 5);
  const Ids prompt = {3, 1, 4, 1, 5};
  const Ids all = models::generate(m, prompt, {.max_new_tokens = 8, .sampling = {.temperature = 0}}).tokens;
  ASSERT_EQ(all.size(), 8u);
  // Stopping at the sixth token's id: generation ends where that id first comes.
  const size_t k = size_t(std::find(all.begin(), all.end(), all[5]) - all.begin());
  int32_t unseen = 0;
  while (std::find(all.begin(), all.end(), unseen) != all.end()) ++unseen;
  const Generation g =
      models::generate(m, prompt, {.max_new_tokens = 8, .sampling = {.temperature = 0}, .stop = {unseen, all[5]}});
  EXPECT_TRUE(g.stopped);
  EXPECT_EQ(g.tokens, Ids(all.begin(), all.begin() + std::ptrdiff_t(k)));
}

// Sampling draws from the seed alone; the top 1 is greedy.
TEST(Generate, SamplingFollowsTheSeed) {
  const models::LlamaConfig c = testing_models::small_llama();
  models::Llama m(c, 5);
  const Ids prompt = {3, 1, 4};
  const GenerateOptions o{.max_new_tokens = 12, .sampling = {.temperature = 1.5}, .seed = 9};
  EXPECT_EQ(models::generate(m, prompt, o).tokens, models::generate(m, prompt, o).tokens);
  GenerateOptions other = o;
  other.seed = 10;
  EXPECT_NE(models::generate(m, prompt, o).tokens, models::generate(m, prompt, other).tokens);
  GenerateOptions top1 = o;
  top1.sampling.top_k = 1;
  EXPECT_EQ(models::generate(m, prompt, top1).tokens,
            models::generate(m, prompt, {.max_new_tokens = 12, .sampling = {.temperature = 0}}).tokens);
}

// How often each token is drawn from logits of probabilities 0.6, 0.3, 0.1
// (at temperature 1), under `o`.
std::vector<double> frequencies(models::SamplingOptions o) {
  const std::vector<float> logits = {std::log(0.3f), std::log(0.6f), -100.0f, std::log(0.1f)};
  std::mt19937_64 rng(1);
  std::vector<double> seen(logits.size());
  constexpr int n = 20000;
  for (int i = 0; i < n; ++i) seen[size_t(models::sample_token(logits, o, rng))] += 1.0 / n;
  return seen;
}

TEST(Generate, SampleTokenDrawsInProportion) {
  const auto expect_near = [](const std::vector<double>& got, const std::vector<double>& want) {
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.01) << "token " << i;
  };
  expect_near(frequencies({}), {0.3, 0.6, 0, 0.1});
  expect_near(frequencies({.temperature = 0}), {0, 1, 0, 0});
  expect_near(frequencies({.top_k = 1}), {0, 1, 0, 0});
  expect_near(frequencies({.top_k = 2}), {1.0 / 3, 2.0 / 3, 0, 0});
  // Top-p: the likeliest whose mass reaches p (0.6 < 0.7: two tokens; 0.6 reaches 0.55: one).
  expect_near(frequencies({.top_p = 0.7}), {1.0 / 3, 2.0 / 3, 0, 0});
  expect_near(frequencies({.top_p = 0.55}), {0, 1, 0, 0});
  expect_near(frequencies({.top_p = 0.95}), {0.3, 0.6, 0, 0.1});
  // Min-p: tokens under p x 0.6 left out (0.1 < 0.2 x 0.6 <= 0.3).
  expect_near(frequencies({.min_p = 0.2}), {1.0 / 3, 2.0 / 3, 0, 0});
  expect_near(frequencies({.min_p = 0.6}), {0, 1, 0, 0});
  // Temperature 2 flattens: probabilities as the square roots of the above.
  const double z = std::sqrt(0.3) + std::sqrt(0.6) + std::sqrt(0.1);
  expect_near(frequencies({.temperature = 2}), {std::sqrt(0.3) / z, std::sqrt(0.6) / z, 0, std::sqrt(0.1) / z});
}

// generation_config.json as transformers reads it: greedy unless do_sample,
// then its values over transformers' defaults; eos ids; bad files named.
TEST(Generate, ReadsAFoldersGenerationConfig) {
  testing_support::TempDir dir;
  const auto with = [&](const std::string& json) {
    write_file_atomic(dir.file("generation_config.json"), json);
    return models::checkpoint_generation_config(dir.path());
  };
  EXPECT_FALSE(models::checkpoint_generation_config(dir.path()).has_value());  // no file
  EXPECT_FALSE(models::checkpoint_generation_config(dir.file("model.gguf")).has_value());  // not a folder
  auto g = with(R"({"bos_token_id": 1, "eos_token_id": 2})");  // SmolLM2-Instruct's: greedy
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->sampling.temperature, 0);
  EXPECT_EQ(g->eos, Ids{2});
  g = with(R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "eos_token_id": [128001, 128008, 128009]})");
  EXPECT_EQ(g->sampling.temperature, 0.6);
  EXPECT_EQ(g->sampling.top_k, 50);  // transformers' default
  EXPECT_EQ(g->sampling.top_p, 0.9);
  EXPECT_EQ(g->eos, (Ids{128001, 128008, 128009}));
  g = with(R"({"do_sample": true, "top_k": 20, "min_p": 0.05})");
  EXPECT_EQ(g->sampling.temperature, 1.0);
  EXPECT_EQ(g->sampling.top_k, 20);
  EXPECT_EQ(g->sampling.min_p, 0.05);
  for (const char* bad : {"[1]", R"({"do_sample": "yes"})", R"({"do_sample": true, "temperature": "hot"})",
                          R"({"eos_token_id": "2"})", R"({"do_sample": true, "top_p": 0})", "{"}) {
    try {
      with(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos) << e.what();
    }
  }
}

TEST(Generate, BadInputIsAUsageErrorNamingGenerate) {
  const models::LlamaConfig c = testing_models::small_llama();  // 32 positions, 37 tokens
  models::Llama m(c, 5);
  const auto expect_error = [&](const Ids& prompt, int64_t max_new, const std::string& says) {
    try {
      models::generate(m, prompt, {.max_new_tokens = max_new});
      ADD_FAILURE() << "no error: " << says;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("generate: " + says), std::string::npos) << e.what();
    }
  };
  expect_error({}, 4, "the prompt is empty");
  expect_error({1, 2}, 0, "max_new_tokens is 0");
  expect_error({1, 37}, 4, "token id 37 is outside the vocabulary of 37");
  expect_error({1, -1}, 4, "token id -1");
  expect_error(Ids(32, 1), 4, "the prompt's 32 tokens fill the context of 32");
  for (const models::SamplingOptions bad : {models::SamplingOptions{.top_k = -1}, models::SamplingOptions{.top_p = 0},
                                           models::SamplingOptions{.top_p = 1.5}, models::SamplingOptions{.min_p = 1},
                                           models::SamplingOptions{.temperature = NAN}}) {
    EXPECT_THROW(models::generate(m, Ids{1}, {.max_new_tokens = 2, .sampling = bad}), UsageError);
  }
}

}  // namespace
}  // namespace nabla
