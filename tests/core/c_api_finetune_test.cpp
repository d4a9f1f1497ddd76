// The C API's generation from a fine-tuning session: the model as trained so
// far (its replicas' shared weights), the same as a session that starts from
// the adapter it saved; decoding into a caller's buffer.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "models/small_llama.h"
#include "nabla.h"
#include "nabla/checkpoint.h"
#include "nabla/models/llama.h"
#include "temp_dir.h"

namespace {

std::string error() { return nabla_last_error(); }

struct Reply {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};

Reply greedy(nabla_finetune* ft, const std::vector<int32_t>& prompt, int64_t n) {
  Reply r{std::vector<int32_t>(size_t(n)), std::vector<float>(size_t(n))};
  int64_t generated = -1;
  EXPECT_EQ(nabla_finetune_generate(ft, prompt.data(), int64_t(prompt.size()), n, 0.0, 0, 1.0, 1, NABLA_GENERATE_IGNORE_EOS,
                                    r.ids.data(), r.logprobs.data(), &generated),
            NABLA_OK)
      << error();
  EXPECT_EQ(generated, n);
  return r;
}

TEST(CApiFinetune, GeneratesFromTheModelAsTrained) {
  nabla::testing_support::TempDir dir;
  const nabla::models::LlamaConfig c = nabla::testing_models::small_llama();
  const std::string base = dir.file("base.safetensors");
  nabla::testing_models::save_llama(base, c);

  constexpr int64_t B = 4, T = 8;
  std::vector<int32_t> ids(B * T), labels(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[size_t(i)] = int32_t((i * 7 + 3) % c.vocab_size);
    labels[size_t(i)] = int32_t((i * 5 + 1) % c.vocab_size);
  }
  nabla_finetune* ft = nullptr;
  ASSERT_EQ(nabla_finetune_create(base.c_str(), nullptr, 4, 8.0, 0.0, NABLA_FINETUNE_REPLICAS(2), nullptr, B, T, 0.0,
                                  1, 3, &ft),
            NABLA_OK)
      << error();
  const std::vector<int32_t> prompt = {3, 1, 4};
  const Reply before = greedy(ft, prompt, 6);
  for (int step = 0; step < 3; ++step) {
    float loss = 0;
    ASSERT_EQ(nabla_finetune_step(ft, ids.data(), labels.data(), nullptr, 1e-2, 1.0, &loss), NABLA_OK) << error();
  }
  const Reply after = greedy(ft, prompt, 6);
  EXPECT_NE(after.logprobs, before.logprobs) << "generation does not see the trained adapters";
  for (float l : after.logprobs) EXPECT_LE(l, 0.0f);
  ASSERT_EQ(nabla_finetune_save(ft, dir.file("adapter").c_str()), NABLA_OK) << error();

  // A session started from the saved adapter generates the same.
  nabla_finetune* resumed = nullptr;
  ASSERT_EQ(nabla_finetune_create(base.c_str(), dir.file("adapter").c_str(), 4, 8.0, 0.0, 0, nullptr, B, T, 0.0, 1, 3,
                                  &resumed),
            NABLA_OK)
      << error();
  const Reply again = greedy(resumed, prompt, 6);
  EXPECT_EQ(again.ids, after.ids);
  for (size_t i = 0; i < after.logprobs.size(); ++i) EXPECT_NEAR(again.logprobs[i], after.logprobs[i], 1e-5) << i;

  // Sampling draws from the seed; without logprobs.
  std::vector<int32_t> a(5), b(5);
  int64_t na = 0, nb = 0;
  ASSERT_EQ(nabla_finetune_generate(ft, prompt.data(), 3, 5, 1.0, 10, 0.9, 42, 0, a.data(), nullptr, &na), NABLA_OK);
  ASSERT_EQ(nabla_finetune_generate(ft, prompt.data(), 3, 5, 1.0, 10, 0.9, 42, 0, b.data(), nullptr, &nb), NABLA_OK);
  EXPECT_EQ(a, b);
  EXPECT_EQ(na, nb);

  // Bad arguments name the function and what is wrong; nothing is written.
  int64_t generated = -7;
  EXPECT_EQ(nabla_finetune_generate(ft, prompt.data(), 3, 5, 0.0, -1, 1.0, 1, 0, a.data(), nullptr, &generated),
            NABLA_ERROR_ARGUMENT);
  EXPECT_NE(error().find("nabla_finetune_generate: top_k is -1"), std::string::npos) << error();
  EXPECT_EQ(nabla_finetune_generate(ft, prompt.data(), 3, 5, NAN, 0, 1.0, 1, 0, a.data(), nullptr, &generated),
            NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(nabla_finetune_generate(ft, prompt.data(), 3, 5, 0.5, 0, 0.0, 1, 0, a.data(), nullptr, &generated),
            NABLA_ERROR_ARGUMENT);
  EXPECT_NE(error().find("top_p 0.0"), std::string::npos) << error();
  EXPECT_EQ(nabla_finetune_generate(ft, prompt.data(), 3, 5, 0.0, 0, 1.0, 1, 2, a.data(), nullptr, &generated),
            NABLA_ERROR_ARGUMENT);
  EXPECT_NE(error().find("flags 2"), std::string::npos) << error();
  EXPECT_EQ(nabla_finetune_generate(ft, prompt.data(), 3, 5, 0.0, 0, 1.0, 1, 0, nullptr, nullptr, &generated),
            NABLA_ERROR_ARGUMENT);
  const std::vector<int32_t> too_long(size_t(c.max_position_embeddings), 1);
  EXPECT_EQ(nabla_finetune_generate(ft, too_long.data(), int64_t(too_long.size()), 5, 0.0, 0, 1.0, 1, 0, a.data(), nullptr,
                                    &generated),
            NABLA_ERROR_ARGUMENT);
  EXPECT_NE(error().find("fill the context of 32"), std::string::npos) << error();
  EXPECT_EQ(generated, -7);
  EXPECT_EQ(nabla_finetune_generate(nullptr, prompt.data(), 3, 5, 0.0, 0, 1.0, 1, 0, a.data(), nullptr, &generated),
            NABLA_ERROR_ARGUMENT);
  nabla_finetune_free(resumed);
  nabla_finetune_free(ft);
}

// Decoding into a caller's buffer: the full length always, a NUL when there
// is room; a length query with no buffer.
TEST(CApiFinetune, DecodesIntoABuffer) {
  nabla::testing_support::TempDir dir;
  nabla::models::LlamaConfig c = nabla::testing_models::small_llama();
  c.vocab_size = 256;  // the byte tokenizer's
  c.tokenizer = "byte";
  const std::string base = dir.file("base.safetensors");
  nabla::testing_models::save_llama(base, c);
  nabla_finetune* ft = nullptr;
  ASSERT_EQ(nabla_finetune_create(base.c_str(), nullptr, 2, 4.0, 0.0, 0, nullptr, 1, 8, 0.0, 1, 3, &ft), NABLA_OK)
      << error();
  const std::vector<int32_t> ids = {'H', 'i', '!'};
  int64_t length = -1;
  ASSERT_EQ(nabla_finetune_decode(ft, ids.data(), 3, nullptr, 0, &length), NABLA_OK) << error();
  EXPECT_EQ(length, 3);
  char text[8] = "xxxxxxx";
  ASSERT_EQ(nabla_finetune_decode(ft, ids.data(), 3, text, 2, &length), NABLA_OK);
  EXPECT_EQ(std::string(text, 3), "Hix");  // two bytes, no room for the NUL
  ASSERT_EQ(nabla_finetune_decode(ft, ids.data(), 3, text, 8, &length), NABLA_OK);
  EXPECT_STREQ(text, "Hi!");
  // The prompt of a data line, then its text.
  std::vector<int32_t> prompt(64);
  int64_t count = 0;
  ASSERT_EQ(nabla_finetune_encode_prompt(ft, R"({"prompt": "Q: ", "completion": "A"})", nullptr, prompt.data(), 64,
                                         &count),
            NABLA_OK)
      << error();
  ASSERT_EQ(nabla_finetune_decode(ft, prompt.data(), count, text, 8, &length), NABLA_OK);
  EXPECT_STREQ(text, "Q: ");
  EXPECT_EQ(nabla_finetune_encode_prompt(ft, R"({"messages": []})", nullptr, prompt.data(), 64, &count),
            NABLA_ERROR_ARGUMENT);
  EXPECT_NE(error().find("nabla_finetune_encode_prompt: prompt: \"messages\" is empty"), std::string::npos) << error();
  const int32_t bad = 300;
  EXPECT_EQ(nabla_finetune_decode(ft, &bad, 1, text, 8, &length), NABLA_ERROR_ARGUMENT);
  EXPECT_EQ(nabla_finetune_decode(ft, ids.data(), -1, text, 8, &length), NABLA_ERROR_ARGUMENT);
  nabla_finetune_free(ft);
}

}  // namespace
