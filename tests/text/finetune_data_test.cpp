// Fine-tuning data: each JSONL form's ids and labels, chat markers as single
// ids, errors naming file and line, the held-out split, and FinetuneBatcher's
// packing, padding, truncation and determinism.
#include "nabla/finetune_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "nabla/error.h"
#include "nabla/io.h"

#include "temp_dir.h"

using namespace nabla;

namespace {

using nabla::testing_support::TempDir;
using Ids = std::vector<int32_t>;

constexpr int32_t X = -100;  // a label the loss does not count

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The bytes of `s` as ids: what ByteTokenizer, and a BPE vocabulary of bytes
// without merges, encode `s` to.
Ids bytes(std::string_view s) {
  Ids ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

Ids ignored(size_t n) { return Ids(n, X); }

Ids cat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// A byte-level BPE tokenizer with no merges (ids 0..255 are the bytes) whose
// added tokens are `added`, ids 256 onwards in order, and whose input starts
// with `prefix` (an added token) when it is not empty.
std::unique_ptr<BpeTokenizer> bytes_with(const TempDir& dir, const std::vector<std::string>& added,
                                         const std::string& prefix = "") {
  BpeTokenizer::bytes_only()->save_json(dir.file("bytes.json"));
  nlohmann::json j = nlohmann::json::parse(read_file(dir.file("bytes.json")));
  j["added_tokens"] = nlohmann::json::array();
  for (size_t k = 0; k < added.size(); ++k) {
    j["added_tokens"].push_back({{"id", 256 + k}, {"content", added[k]}, {"special", true}});
  }
  if (!prefix.empty()) {
    const int64_t id = 256 + (std::find(added.begin(), added.end(), prefix) - added.begin());
    using nlohmann::json;
    const json special = {{"SpecialToken", {{"id", prefix}, {"type_id", 0}}}};
    const json sequence = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
    const json entry = {
        {"id", prefix}, {"ids", json::array({id})}, {"tokens", json::array({prefix})}};
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", json::array({special, sequence})},
                           {"pair", json::array()},
                           {"special_tokens", {{prefix, entry}}}};
  }
  write_text(dir.file("tokenizer.json"), j.dump());
  return BpeTokenizer::from_json(dir.file("tokenizer.json"));
}

// SmolLM2's and Qwen2's markers, and GPT-2's end of text as SmolLM2 has it.
constexpr int32_t kEndOfText = 256, kImStart = 257, kImEnd = 258;
std::unique_ptr<BpeTokenizer> chatml_tokenizer(const TempDir& dir) {
  return bytes_with(dir, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
}

// Llama 3's markers, with <|begin_of_text|> as its post-processor's prefix.
constexpr int32_t kBeginOfText = 256, kEndOfTextL3 = 257, kStartHeader = 258, kEndHeader = 259,
                  kEotId = 260;
std::unique_ptr<BpeTokenizer> llama3_tokenizer(const TempDir& dir) {
  return bytes_with(dir,
                    {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                     "<|end_header_id|>", "<|eot_id|>"},
                    "<|begin_of_text|>");
}

// Gemma's markers (ids as its own: <bos> 2, the turn markers 105 and 106
// there; here after the bytes).
constexpr int32_t kBos = 256, kStartOfTurn = 257, kEndOfTurn = 258;
std::unique_ptr<BpeTokenizer> gemma_tokenizer(const TempDir& dir) {
  return bytes_with(dir, {"<bos>", "<start_of_turn>", "<end_of_turn>"}, "<bos>");
}

// Phi-3's markers and end of text (ids 32000 and up there).
constexpr int32_t kPhiEndOfText = 256, kPhiSystem = 257, kPhiUser = 258, kPhiAssistant = 259, kPhiEnd = 260;
std::unique_ptr<BpeTokenizer> phi_tokenizer(const TempDir& dir) {
  return bytes_with(dir, {"<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"});
}

std::vector<FinetuneExample> read_lines(const TempDir& dir, const std::string& text,
                                        const Tokenizer& tok,
                                        const FinetuneDataOptions& options = {}) {
  write_text(dir.file("data.jsonl"), text);
  return read_finetune_jsonl(dir.file("data.jsonl"), tok, options);
}

const char* kConversation =
    R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},)"
    R"( {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"},)"
    R"( {"role": "assistant", "content": " Bye. "}]})";

// The chat_template in tokenizer_config.json of HuggingFaceTB/SmolLM2-135M-Instruct
// and of meta-llama/Meta-Llama-3-8B-Instruct, verbatim.
const char* kSmolLM2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
    "}}{% endif %}";
const char* kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif "
    "%}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

// Gemma 3's chat template, its text branch (google/gemma-3-1b-it's
// tokenizer_config.json has image branches and a role check besides).
const char* kGemma3Template =
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = "
    "messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set "
    "first_user_prefix = \"\" -%}{%- set loop_messages = messages -%}{%- endif -%}{%- for message in "
    "loop_messages -%}{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else "
    "-%}{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\n' + "
    "(first_user_prefix if loop.first else \"\") }}{{ message['content'] | trim }}{{ '<end_of_turn>\n' "
    "}}{%- endfor -%}{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}";

// Reading `text` fails with an IoError naming data.jsonl:`line` and saying `says`.
void expect_line_error(const std::string& text, int line, const std::string& says) {
  TempDir dir;
  ByteTokenizer tok;
  try {
    read_lines(dir, text, tok);
    ADD_FAILURE() << "no error; expected " << says;
  } catch (const IoError& e) {
    const std::string where = dir.file("data.jsonl") + ":" + std::to_string(line) + ": ";
    EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

const std::string kGood = "{\"text\": \"fine\"}\n\n";  // lines 1 and 2 (blank)

// Example k has lengths[k] tokens, ids 100 k + 1, 100 k + 2, ..., all counted.
std::vector<FinetuneExample> numbered(const std::vector<int>& lengths) {
  std::vector<FinetuneExample> out;
  for (size_t k = 0; k < lengths.size(); ++k) {
    FinetuneExample e;
    for (int i = 0; i < lengths[k]; ++i) e.ids.push_back(int32_t(100 * k + i + 1));
    e.labels = e.ids;
    out.push_back(e);
  }
  return out;
}

// Expected ids and labels, piece by piece.
struct Want {
  Ids ids, labels;
  Want& skip(const Ids& piece) {  // not counted
    ids.insert(ids.end(), piece.begin(), piece.end());
    labels.insert(labels.end(), piece.size(), X);
    return *this;
  }
  Want& learn(const Ids& piece) {  // counted
    ids.insert(ids.end(), piece.begin(), piece.end());
    labels.insert(labels.end(), piece.begin(), piece.end());
    return *this;
  }
};

struct Batch {
  Ids ids, labels, positions, segments;
  bool operator==(const Batch&) const = default;
};

Batch batch_of(const FinetuneBatcher& b, int64_t index) {
  const size_t n = size_t(b.batch_size() * b.context());
  Batch out{Ids(n), Ids(n), Ids(n), Ids(n)};
  b.batch(index, out.ids.data(), out.labels.data(), out.positions.data(), out.segments.data());
  return out;
}

// The first id of each example in the epoch, in the order the batches hold them.
Ids epoch_order(const FinetuneBatcher& b) {
  Ids firsts;
  for (int64_t i = 0; i < b.batches_per_epoch(); ++i) {
    const Batch batch = batch_of(b, i);
    for (size_t t = 0; t < batch.ids.size(); ++t)
      if (batch.segments[t] >= 0 && batch.positions[t] == 0) firsts.push_back(batch.ids[t]);
  }
  return firsts;
}

}  // namespace

TEST(FinetuneData, TextFormCountsEveryToken) {
  TempDir dir;
  ByteTokenizer tok;
  // Blank lines are skipped, CRLF endings and extra keys accepted.
  const auto ex =
      read_lines(dir, "{\"text\": \"hi\"}\r\n\n  \n{\"text\": \"a\\nb\", \"id\": 7}", tok);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].ids, bytes("hi"));
  EXPECT_EQ(ex[0].labels, bytes("hi"));
  EXPECT_EQ(ex[1].ids, bytes("a\nb"));
  EXPECT_EQ(ex[1].labels, bytes("a\nb"));
}

TEST(FinetuneData, TextFormAddsPrefixAndEndOfText) {
  TempDir dir;
  auto tok = llama3_tokenizer(dir);
  ASSERT_EQ(tok->prefix_ids(), Ids{kBeginOfText});
  ASSERT_EQ(tok->eot_id(), kEndOfTextL3);
  const auto ex = read_lines(dir, "{\"text\": \"ok\"}\n", *tok);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].ids, cat({{kBeginOfText}, bytes("ok"), {kEndOfTextL3}}));
  EXPECT_EQ(ex[0].labels, ex[0].ids);
}

TEST(FinetuneData, PromptCompletionCountsOnlyTheCompletion) {
  TempDir dir;
  ByteTokenizer bytes_tok;
  auto ex = read_lines(dir, R"({"prompt": "Q: 2+2?", "completion": " 4"})", bytes_tok);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].ids, bytes("Q: 2+2? 4"));
  EXPECT_EQ(ex[0].labels, cat({ignored(7), bytes(" 4")}));

  auto tok = chatml_tokenizer(dir);
  ex = read_lines(dir, R"({"completion": "yes", "prompt": "ok?"})", *tok);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].ids, cat({bytes("ok?yes"), {kEndOfText}}));
  EXPECT_EQ(ex[0].labels, cat({ignored(3), bytes("yes"), {kEndOfText}}));
}

// With a tokenizer that lacks the markers, they are their bytes.
TEST(FinetuneData, ChatMLMessagesWithByteTokenizer) {
  TempDir dir;
  ByteTokenizer tok;
  const auto ex = read_lines(dir, kConversation, tok);
  ASSERT_EQ(ex.size(), 1u);
  Want want;
  want.skip(bytes("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"))
      .skip(bytes("<|im_start|>assistant\n"))
      .learn(bytes("Hello!<|im_end|>"))
      .skip(bytes("\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"))
      .learn(bytes(" Bye. <|im_end|>"))
      .skip(bytes("\n"));
  EXPECT_EQ(ex[0].ids, want.ids);
  EXPECT_EQ(ex[0].labels, want.labels);
}

// No end-of-text id: <|im_end|> ends the conversation.
TEST(FinetuneData, ChatMLMarkersAreSingleIds) {
  TempDir dir;
  auto tok = chatml_tokenizer(dir);
  const auto ex = read_lines(dir, kConversation, *tok);
  ASSERT_EQ(ex.size(), 1u);
  Want want;
  want.skip({kImStart}).skip(bytes("system\nBe brief.")).skip({kImEnd}).skip(bytes("\n"));
  want.skip({kImStart}).skip(bytes("user\nHi")).skip({kImEnd}).skip(bytes("\n"));
  want.skip({kImStart})
      .skip(bytes("assistant\n"))
      .learn(bytes("Hello!"))
      .learn({kImEnd})
      .skip(bytes("\n"));
  want.skip({kImStart}).skip(bytes("user\nBye")).skip({kImEnd}).skip(bytes("\n"));
  want.skip({kImStart})
      .skip(bytes("assistant\n"))
      .learn(bytes(" Bye. "))
      .learn({kImEnd})
      .skip(bytes("\n"));
  EXPECT_EQ(ex[0].ids, want.ids);
  EXPECT_EQ(ex[0].labels, want.labels);
}

// <|begin_of_text|> once (not again from the post-processor), content
// trimmed as the template's `| trim` does, <|eot_id|> counted.
TEST(FinetuneData, Llama3MessagesWithItsMarkers) {
  TempDir dir;
  auto tok = llama3_tokenizer(dir);
  FinetuneDataOptions options;
  options.chat_template = ChatTemplate::llama3;
  const auto ex = read_lines(dir, kConversation, *tok, options);
  ASSERT_EQ(ex.size(), 1u);
  auto header = [](const char* role) {
    return cat({{kStartHeader}, bytes(role), {kEndHeader}, bytes("\n\n")});
  };
  Want want;
  want.skip({kBeginOfText});
  want.skip(header("system")).skip(bytes("Be brief.")).skip({kEotId});
  want.skip(header("user")).skip(bytes("Hi")).skip({kEotId});
  want.skip(header("assistant")).learn(bytes("Hello!")).learn({kEotId});
  want.skip(header("user")).skip(bytes("Bye")).skip({kEotId});
  want.skip(header("assistant")).learn(bytes("Bye.")).learn({kEotId});
  EXPECT_EQ(ex[0].ids, want.ids);
  EXPECT_EQ(ex[0].labels, want.labels);
}

// Gemma 3's template: <bos> once, the system message opening the first user
// turn, the assistant as "model", content trimmed, <end_of_turn> counted;
// turns out of order are refused as the template refuses them.
TEST(FinetuneData, GemmaMessagesWithItsMarkers) {
  TempDir dir;
  auto tok = gemma_tokenizer(dir);
  FinetuneDataOptions options;
  options.chat_template = ChatTemplate::gemma;
  const auto ex = read_lines(dir, kConversation, *tok, options);
  ASSERT_EQ(ex.size(), 1u);
  auto turn = [](const char* role) { return cat({{kStartOfTurn}, bytes(role), bytes("\n")}); };
  Want want;
  want.skip({kBos});
  want.skip(turn("user")).skip(bytes("Be brief.\n\nHi")).skip({kEndOfTurn}).skip(bytes("\n"));
  want.skip(turn("model")).learn(bytes("Hello!")).learn({kEndOfTurn}).skip(bytes("\n"));
  want.skip(turn("user")).skip(bytes("Bye")).skip({kEndOfTurn}).skip(bytes("\n"));
  want.skip(turn("model")).learn(bytes("Bye.")).learn({kEndOfTurn}).skip(bytes("\n"));
  EXPECT_EQ(ex[0].ids, want.ids);
  EXPECT_EQ(ex[0].labels, want.labels);
  for (const char* bad :
       {R"({"messages": [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Yo"}]})",
        R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Yo"}]})",
        R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Yo"}]})"}) {
    try {
      read_lines(dir, bad, *tok, options);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("Gemma's template takes user and assistant messages by turns"),
                std::string::npos)
          << e.what();
    }
  }
}

// Phi-3's template: "<|role|>\n" content "<|end|>\n" per message, the
// end-of-text token after the last (counted after an assistant's); Phi-4-mini's
// without the newlines.
TEST(FinetuneData, PhiMessagesWithTheirMarkers) {
  TempDir dir;
  auto tok = phi_tokenizer(dir);
  ASSERT_EQ(tok->eot_id(), kPhiEndOfText);
  for (ChatTemplate t : {ChatTemplate::phi3, ChatTemplate::phi4}) {
    FinetuneDataOptions options;
    options.chat_template = t;
    const auto ex = read_lines(dir, kConversation, *tok, options);
    ASSERT_EQ(ex.size(), 1u);
    const std::vector<int32_t> nl = t == ChatTemplate::phi3 ? bytes("\n") : std::vector<int32_t>{};
    auto role = [&](int32_t marker) { return cat({{marker}, nl}); };
    Want want;
    want.skip(role(kPhiSystem)).skip(bytes("Be brief.")).skip({kPhiEnd}).skip(nl);
    want.skip(role(kPhiUser)).skip(bytes("Hi")).skip({kPhiEnd}).skip(nl);
    want.skip(role(kPhiAssistant)).learn(bytes("Hello!")).learn({kPhiEnd}).skip(nl);
    want.skip(role(kPhiUser)).skip(bytes("Bye")).skip({kPhiEnd}).skip(nl);
    want.skip(role(kPhiAssistant)).learn(bytes(" Bye. ")).learn({kPhiEnd}).skip(nl).learn({kPhiEndOfText});
    EXPECT_EQ(ex[0].ids, want.ids) << chat_template_name(t);
    EXPECT_EQ(ex[0].labels, want.labels) << chat_template_name(t);
  }
  // Phi-3.5's template skips an empty system message; the end of text after a
  // user's last message is not learned.
  FinetuneDataOptions options;
  options.chat_template = ChatTemplate::phi3;
  const auto ex = read_lines(dir,
                             R"({"messages": [{"role": "system", "content": ""}, {"role": "assistant", "content": "Yo"},)"
                             R"( {"role": "user", "content": "Hi"}]})",
                             *tok, options);
  Want want;
  want.skip(cat({{kPhiAssistant}, bytes("\n")})).learn(bytes("Yo")).learn({kPhiEnd}).skip(bytes("\n"));
  want.skip(cat({{kPhiUser}, bytes("\n")})).skip(bytes("Hi")).skip({kPhiEnd}).skip(bytes("\n")).skip({kPhiEndOfText});
  EXPECT_EQ(ex[0].ids, want.ids);
  EXPECT_EQ(ex[0].labels, want.labels);
}

// SmolLM2's template adds its system message to a conversation without one.
TEST(FinetuneData, DefaultSystemMessage) {
  TempDir dir;
  ByteTokenizer tok;
  FinetuneDataOptions options;
  options.default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
  const auto ex = read_lines(
      dir,
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})"
      "\n" +
          std::string(kConversation),
      tok, options);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(
      tok.decode(ex[0].ids),
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n");
  EXPECT_TRUE(tok.decode(ex[1].ids).starts_with(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user"));
}

// What a line's ids decode to, and what its counted ids decode to, with the
// byte tokenizer (the rendered text, and the part of it that is learned).
std::pair<std::string, std::string> rendered(const FinetuneExample& ex) {
  Ids learned;
  for (int32_t l : ex.labels)
    if (l != X) learned.push_back(l);
  ByteTokenizer tok;
  return {tok.decode(ex.ids), tok.decode(learned)};
}

// A line, the text it renders to and the part of it learned.
struct Rendering {
  std::string line, text, learned;
};
void expect_renderings(const TempDir& dir, const Tokenizer& tok, const FinetuneDataOptions& options,
                       const std::vector<Rendering>& cases) {
  for (const Rendering& c : cases) {
    const auto ex = read_lines(dir, c.line, tok, options);
    ASSERT_EQ(ex.size(), 1u);
    EXPECT_EQ(rendered(ex[0]), std::make_pair(c.text, c.learned)) << chat_template_name(options.chat_template)
                                                                   << ": " << c.line;
  }
}

// SmolLM3's template (its chat_template.jinja rendered by jinja2 as
// transformers does, strftime_now giving the date below): the system block's
// modes, flags, override and defaults; the empty think block not learned.
TEST(FinetuneData, SmolLM3MessagesAsItsTemplateRendersThem) {
  TempDir dir;
  ByteTokenizer tok;
  FinetuneDataOptions options;
  options.chat_template = ChatTemplate::smollm3;
  options.today = "2026-12-07";
  const std::string head = "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: 07 December "
                           "2026\nReasoning Mode: ";
  const std::string smol = "You are a helpful AI assistant named SmolLM, trained by Hugging Face.";
  const std::vector<Rendering> cases = {
      {kConversation,
       head + "/think\n\n## Custom Instructions\n\nBe brief.\n\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
              "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n Bye. <|im_end|>\n",
       "Hello!<|im_end|> Bye. <|im_end|>"},
      {R"({"messages": [{"role": "system", "content": "Be brief. /no_think  "}, {"role": "user", "content": "Hi"},)"
       R"( {"role": "assistant", "content": "Yo"}]})",
       head + "/no_think\n\n## Custom Instructions\n\nBe brief.\n\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n<think>\n\n</think>\nYo<|im_end|>\n",
       "Yo<|im_end|>"},
      {R"({"messages": [{"role": "system", "content": "/no_think"}, {"role": "user", "content": "Hi"},)"
       R"( {"role": "assistant", "content": "Yo"}]})",
       head + "/no_think\n\n## Custom Instructions\n\n" + smol +
           "\n\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\nYo<|im_end|>\n",
       "Yo<|im_end|>"},
      {R"({"messages": [{"role": "system", "content": "Pirate. /system_override /think "},)"
       R"( {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nhm\n</think>\nArr"}]})",
       "<|im_start|>system\nPirate.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n"
       "</think>\nArr<|im_end|>\n",
       "<think>\nhm\n</think>\nArr<|im_end|>"},
      {R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],)"
       R"( "chat_template_kwargs": {"enable_thinking": false}})",
       head + "/no_think\n\n## Custom Instructions\n\n" + smol +
           "\n\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\nYo<|im_end|>\n",
       "Yo<|im_end|>"},
      {R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}],)"
       R"( "chat_template_kwargs": {"enable_thinking": false, "custom_instructions": "Vampire."}})",
       head + "/no_think\n\n## Custom Instructions\n\nVampire.\n\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n<think>\n\n</think>\nYo<|im_end|>\n",
       "Yo<|im_end|>"},
  };
  expect_renderings(dir, tok, options, cases);
  // No system message, thinking: the template's long default instructions.
  const auto ex = read_lines(dir, R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\n\nYo"}]})",
                             tok, options);
  const auto [text, learned] = rendered(ex[0]);
  const std::string start = head + "/think\n\n## Custom Instructions\n\n" + smol + " Your role as an assistant involves ";
  const std::string end = "necessary steps needed to reach the conclusion.\n\n<|im_start|>user\nHi<|im_end|>\n"
                          "<|im_start|>assistant\nYo<|im_end|>\n";
  EXPECT_EQ(text.substr(0, start.size()), start);
  EXPECT_EQ(text.substr(text.size() - std::min(text.size(), end.size())), end);
  EXPECT_EQ(text.size(), 1371u);  // jinja2's rendering's length
  EXPECT_EQ(learned, "Yo<|im_end|>");
  // The template drops a later system message; nabla refuses it.
  for (const auto& [line, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Yo"}, {"role": "assistant", "content": "A"}]})",
            "SmolLM3's template renders one system message, the first"},
           {R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "A"}], "chat_template_kwargs": {"enable_thinking": "no"}})",
            "\"chat_template_kwargs\".enable_thinking is \"no\", expected true or false"},
           {R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "A"}], "chat_template_kwargs": [1]})",
            "\"chat_template_kwargs\" is [1], expected an object"}}) {
    try {
      read_lines(dir, line, tok, options);
      ADD_FAILURE() << "no error for " << line;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

// Llama 3.1's and 3.2's templates (rendered by jinja2 as above; 3.1's is
// 3.2's without strftime_now): the system block always there, dated.
TEST(FinetuneData, Llama31And32MessagesAsTheirTemplatesRenderThem) {
  TempDir dir;
  ByteTokenizer tok;
  auto head = [](const std::string& date) {
    return "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
           "Today Date: " + date + "\n\n";
  };
  const std::string conversation =
      "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
      "<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nBye.<|eot_id|>";
  const std::string short_one =
      "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
      "<|end_header_id|>\n\nYo<|eot_id|>";
  const std::string late_system =
      "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>system<|end_header_id|>"
      "\n\nlate<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|>";
  const std::string short_line =
      R"({"messages": [{"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Yo\n"}]})";
  const std::string late_line =
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": " late "},)"
      R"( {"role": "assistant", "content": "Yo"}], "chat_template_kwargs": {"date_string": "01 Jan 2025"}})";
  for (ChatTemplate t : {ChatTemplate::llama3_1, ChatTemplate::llama3_2}) {
    FinetuneDataOptions options;
    options.chat_template = t;
    options.today = "2026-12-07";
    const std::string date = t == ChatTemplate::llama3_1 ? "26 Jul 2024" : "07 Dec 2026";
    expect_renderings(dir, tok, options,
                      {{kConversation, head(date) + conversation, "Hello!<|eot_id|>Bye.<|eot_id|>"},
                       {short_line, head(date) + short_one, "Yo<|eot_id|>"},
                       {late_line, head("01 Jan 2025") + late_system, "Yo<|eot_id|>"}});
  }
  FinetuneDataOptions options;
  options.chat_template = ChatTemplate::llama3_2;
  options.today = "2026-13-07";
  try {
    read_lines(dir, kConversation, tok, options);
    ADD_FAILURE() << "no error for a 13th month";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("chat template date \"2026-13-07\": expected YYYY-MM-DD"), std::string::npos)
        << e.what();
  }
}

// Qwen3's template (rendered by jinja2 as above): reasoning dropped before the
// last user message, kept in a think block after it, an empty block opening
// the last message (not learned).
TEST(FinetuneData, Qwen3MessagesAsItsTemplateRendersThem) {
  TempDir dir;
  ByteTokenizer tok;
  FinetuneDataOptions options;
  options.chat_template = ChatTemplate::qwen3;
  const std::vector<Rendering> cases = {
      {kConversation,
       "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
       "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n Bye. <|im_end|>\n",
       "Hello!<|im_end|> Bye. <|im_end|>"},
      {R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nfirst\n</think>\n\nYo"},)"
       R"( {"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>\n\nhm\n\n</think>\n\n\nA"},)"
       R"( {"role": "assistant", "content": "more"}, {"role": "assistant", "content": "<think>x</think>end"}]})",
       "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
       "<|im_start|>assistant\n<think>\nhm\n</think>\n\nA<|im_end|>\n<|im_start|>assistant\nmore<|im_end|>\n"
       "<|im_start|>assistant\n<think>\nx\n</think>\n\nend<|im_end|>\n",
       "Yo<|im_end|><think>\nhm\n</think>\n\nA<|im_end|>more<|im_end|><think>\nx\n</think>\n\nend<|im_end|>"},
      {R"({"messages": [{"role": "assistant", "content": "<think>r</think>Yo"}, {"role": "system", "content": "late"},)"
       R"( {"role": "assistant", "content": "Z"}]})",
       "<|im_start|>assistant\nYo<|im_end|>\n<|im_start|>system\nlate<|im_end|>\n<|im_start|>assistant\nZ<|im_end|>\n",
       "Yo<|im_end|>Z<|im_end|>"},
      {R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "a</think>b</think>c"}]})",
       "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\na\n</think>\n\nc<|im_end|>\n",
       "<think>\na\n</think>\n\nc<|im_end|>"},
  };
  expect_renderings(dir, tok, options, cases);
  // With the think markers as added tokens: single ids, the empty block not learned.
  auto marked = bytes_with(dir, {"<|im_start|>", "<|im_end|>", "<think>", "</think>"});
  const auto ex = read_lines(dir, R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})",
                             *marked, options);
  ASSERT_EQ(ex.size(), 1u);
  Want want;
  want.skip({256}).skip(bytes("user\n")).skip(bytes("Hi")).skip({257}).skip(bytes("\n"));
  want.skip({256}).skip(bytes("assistant\n")).skip({258}).skip(bytes("\n\n")).skip({259}).skip(bytes("\n\n"));
  want.learn(bytes("Yo")).learn({257}).skip(bytes("\n"));
  EXPECT_EQ(ex[0].ids, want.ids);
  EXPECT_EQ(ex[0].labels, want.labels);
}

// A chat prompt: the messages as a line renders them, then the generation
// prompt (for SmolLM3, Qwen3 and Llama 3.2 as jinja2 renders their templates
// with add_generation_prompt; the others' from their templates' text).
TEST(FinetuneData, ChatPromptEndsWithTheAssistantsHeader) {
  ByteTokenizer tok;
  const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "Hi"}};
  const std::string smol = "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: 07 December "
                           "2026\nReasoning Mode: /think\n\n## Custom Instructions\n\nBe brief.\n\n<|im_start|>user\nHi"
                           "<|im_end|>\n<|im_start|>assistant\n";
  const std::string chatml = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  const std::pair<ChatTemplate, std::string> cases[] = {
      {ChatTemplate::chatml, chatml},
      {ChatTemplate::qwen3, chatml},
      {ChatTemplate::smollm3, smol},
      {ChatTemplate::llama3,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
       "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
      {ChatTemplate::llama3_2,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday "
       "Date: 07 Dec 2026\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      {ChatTemplate::gemma, "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"},
      {ChatTemplate::phi3, "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"},
      {ChatTemplate::phi4, "<|system|>Be brief.<|end|><|user|>Hi<|end|><|assistant|>"},
  };
  for (const auto& [t, want] : cases) {
    FinetuneDataOptions options;
    options.chat_template = t;
    options.today = "2026-12-07";
    EXPECT_EQ(tok.decode(chat_prompt_ids(messages, tok, options)), want) << chat_template_name(t);
  }
  // SmolLM3 in /no_think: the empty think block opens the reply.
  FinetuneDataOptions options;
  options.chat_template = ChatTemplate::smollm3;
  options.today = "2026-12-07";
  const std::string no_think = tok.decode(chat_prompt_ids({{"system", "Be brief. /no_think"}, {"user", "Hi"}}, tok, options));
  EXPECT_TRUE(no_think.ends_with("Hi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n")) << no_think;
  EXPECT_NE(no_think.find("Reasoning Mode: /no_think\n"), std::string::npos);
  // Refused: no message, an unknown role, a base's template nabla does not render.
  EXPECT_THROW(chat_prompt_ids({}, tok, options), IoError);
  EXPECT_THROW(chat_prompt_ids({{"tool", "x"}}, tok, options), IoError);
  const FinetuneDataOptions unknown = chat_template_options("auto", "{{ '[INST] ' + m.content }}", "base");
  try {
    chat_prompt_ids(messages, tok, unknown);
    ADD_FAILURE() << "no error for a template nabla does not render";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("the chat template of base is none that nabla renders"), std::string::npos)
        << e.what();
  }
  // ChatML's default system message, from SmolLM2's template (a newline in
  // its literal) and Qwen2.5's (Jinja's \n escape); none from Qwen3's.
  EXPECT_EQ(chat_template_options("auto", kSmolLM2Template, "base").default_system,
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const std::string qwen25 =
      R"({%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }})"
      R"({%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }})"
      R"({%- endif %})";
  EXPECT_EQ(chat_template_options("auto", qwen25, "base").default_system,
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(chat_template_options("auto", R"({{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }})",
                                  "base")
                .default_system,
            "");
  EXPECT_EQ(chat_template_options("chatml", qwen25, "base").default_system, "");  // a named template: as it is
  EXPECT_EQ(chat_template_options("auto", "", "base").chat_template, ChatTemplate::chatml);
  EXPECT_TRUE(chat_template_options("auto", "", "base").refuse_messages.empty());
  EXPECT_EQ(chat_template_options("gemma", "{{ '[INST] ' }}", "base").chat_template, ChatTemplate::gemma);
}

// The end of generation: the end-of-text token and every end-of-turn
// marker the tokenizer has as one token.
TEST(FinetuneData, EndOfGenerationIds) {
  TempDir dir;
  auto tok = bytes_with(dir, {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<end_of_turn>"});
  ASSERT_EQ(tok->eot_id(), 258);
  EXPECT_EQ(end_of_generation_ids(*tok), (Ids{258, 257, 259}));  // <|eot_id|> is several bytes here
  ByteTokenizer bytes;  // no end-of-text token, no markers
  EXPECT_EQ(end_of_generation_ids(bytes), Ids{});
}

// A line's prompt for generation: what its example holds before the reply.
TEST(FinetuneData, PromptOfALine) {
  TempDir dir;
  auto tok = bytes_with(dir, {"<|im_start|>", "<|im_end|>", "<|endoftext|>"});
  FinetuneDataOptions options;
  EXPECT_EQ(tok->decode(finetune_prompt(R"({"prompt": "2 + 2 = ", "completion": "4"})", *tok, options)), "2 + 2 = ");
  EXPECT_EQ(tok->decode(finetune_prompt(R"({"prompt": "2 + 2 = "})", *tok, options)), "2 + 2 = ");
  EXPECT_EQ(tok->decode(finetune_prompt(R"({"text": "Once"})", *tok, options)), "Once");
  // The reply left out: the same ids as the example's before the reply's first counted token.
  const std::string chat =
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},)"
      R"( {"role": "assistant", "content": "Hello"}]})";
  const FinetuneExample example = finetune_example(chat, *tok, options);
  const auto first_counted = std::find_if(example.labels.begin(), example.labels.end(), [](int32_t l) { return l >= 0; });
  const Ids before(example.ids.begin(), example.ids.begin() + (first_counted - example.labels.begin()));
  EXPECT_EQ(finetune_prompt(chat, *tok, options), before);
  EXPECT_EQ(tok->decode(before), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                 "<|im_start|>assistant\n");
  // A conversation ending with the user's message: the same prompt.
  EXPECT_EQ(finetune_prompt(R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})",
                            *tok, options),
            before);
  // The line's template arguments count: SmolLM3's reasoning mode.
  options.chat_template = ChatTemplate::smollm3;
  options.today = "2026-12-07";
  const std::string no_think = tok->decode(finetune_prompt(
      R"({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": false}})", *tok,
      options));
  EXPECT_TRUE(no_think.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n")) << no_think;
  // Refused: no message before the reply, no prompt, not JSON, none of the forms.
  for (const char* bad : {R"({"messages": [{"role": "assistant", "content": "Hello"}]})", R"({"completion": "4"})",
                          R"({"prompt": 3})", "{\"text\"", R"({"input": "a"})"}) {
    EXPECT_THROW(finetune_prompt(bad, *tok, options), IoError) << bad;
  }
  try {
    finetune_prompt(R"({"completion": "4"})", *tok, options);
  } catch (const IoError& e) {
    EXPECT_STREQ(e.what(), "prompt: no \"prompt\"");
  }
}

TEST(FinetuneData, ErrorNotJson) { expect_line_error(kGood + "{\"text\": \"a\"\n", 3, "not JSON"); }

TEST(FinetuneData, ErrorNotAnObject) {
  expect_line_error(kGood + "[\"text\", \"a\"]\n", 3,
                    "the line is a JSON array, expected an object");
}

TEST(FinetuneData, ErrorNoneOrSeveralForms) {
  expect_line_error(kGood + "{\"input\": \"a\"}\n", 3, "none of the forms");
  expect_line_error(kGood + R"({"text": "a", "messages": []})", 3, "more than one form");
  expect_line_error(kGood + R"({"prompt": "a"})", 3, "\"completion\" is missing");
}

TEST(FinetuneData, ErrorFieldOfWrongType) {
  expect_line_error(kGood + R"({"text": 5})", 3, "\"text\" is 5, expected a string");
  expect_line_error(kGood + R"({"prompt": "a", "completion": null})", 3, "\"completion\" is null");
  expect_line_error(kGood + R"({"messages": {"role": "user"}})", 3,
                    "\"messages\" is {\"role\":\"user\"}, expected an array");
  expect_line_error(kGood + R"({"messages": ["hi"]})", 3,
                    "\"messages\"[0] is \"hi\", expected an object");
  expect_line_error(kGood + R"({"messages": [{"role": "user", "content": ["a"]}]})", 3,
                    "\"messages\"[0].content is [\"a\"], expected a string");
  expect_line_error(kGood + R"({"messages": [{"role": "user"}]})", 3,
                    "\"messages\"[0] has no \"content\"");
}

TEST(FinetuneData, ErrorUnknownRole) {
  expect_line_error(
      kGood +
          R"({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]})",
      3, "\"messages\"[1].role is \"bot\", expected \"system\", \"user\" or \"assistant\"");
}

TEST(FinetuneData, ErrorEmptyMessages) {
  expect_line_error(kGood + R"({"messages": []})", 3, "\"messages\" is empty");
}

TEST(FinetuneData, ErrorNoCountedToken) {
  expect_line_error(kGood + R"({"messages": [{"role": "user", "content": "a"}]})", 3,
                    "no assistant message");
  expect_line_error(kGood + R"({"prompt": "a", "completion": ""})", 3, "empty completion");
  // A one-byte text counts only its first token, which nothing predicts.
  expect_line_error(kGood + R"({"text": "a"})", 3, "no token after the first counts");
}

TEST(FinetuneData, ErrorMissingFileOrNoExamples) {
  TempDir dir;
  ByteTokenizer tok;
  try {
    read_finetune_jsonl(dir.file("missing.jsonl"), tok);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("missing.jsonl")), std::string::npos) << e.what();
  }
  try {
    read_lines(dir, "\n  \n", tok);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("data.jsonl") + ": no examples"),
              std::string::npos)
        << e.what();
  }
}

TEST(FinetuneData, ChatTemplateNamesAndRecognition) {
  for (ChatTemplate t : {ChatTemplate::chatml, ChatTemplate::llama3, ChatTemplate::llama3_1, ChatTemplate::llama3_2,
                         ChatTemplate::gemma, ChatTemplate::phi3, ChatTemplate::phi4, ChatTemplate::smollm3,
                         ChatTemplate::qwen3})
    EXPECT_EQ(parse_chat_template(chat_template_name(t)), t);
  try {
    parse_chat_template("mistral");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("\"phi3\", \"phi4\", \"smollm3\" or \"qwen3\""), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(recognize_chat_template(kSmolLM2Template), ChatTemplate::chatml);
  EXPECT_EQ(recognize_chat_template(kLlama3Template), ChatTemplate::llama3);
  EXPECT_EQ(recognize_chat_template(kGemma3Template), ChatTemplate::gemma);
  // Fragments of Llama 3.1's and 3.2's templates.
  const std::string llama31 = R"({{- "<|start_header_id|>system<|end_header_id|>\n\n" }})"
                              R"({{- "Cutting Knowledge Date: December 2023\n" }}{{- "Today Date: " + date_string }})";
  EXPECT_EQ(recognize_chat_template(llama31), ChatTemplate::llama3_1);
  EXPECT_EQ(recognize_chat_template(R"({%- set date_string = strftime_now("%d %b %Y") %})" + llama31),
            ChatTemplate::llama3_2);
  // Fragments of SmolLM3-3B's and Qwen3's templates, and of Qwen2.5's (ChatML).
  EXPECT_EQ(recognize_chat_template(R"({{- "<|im_start|>system\n" -}}{{- "Reasoning Mode: " + reasoning_mode + "\n\n" -}})"
                                    R"({{ "<|im_start|>assistant\n" + "<think>\n\n</think>\n" }})"),
            ChatTemplate::smollm3);
  EXPECT_EQ(recognize_chat_template(
                R"({%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %})"
                R"({%- if '</think>' in content %}{{- '<|im_start|>' + message.role + '\n<think>\n' }}{% endif %})"),
            ChatTemplate::qwen3);
  EXPECT_EQ(recognize_chat_template(R"({{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\n' }})"),
            ChatTemplate::chatml);
  // The forms of Phi-3.5-mini-instruct's and Phi-4-mini-instruct's templates.
  EXPECT_EQ(recognize_chat_template(
                "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' "
                "+ message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
                "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + "
                "message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
                "'<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"),
            ChatTemplate::phi3);
  EXPECT_EQ(recognize_chat_template(
                "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% "
                "endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"),
            ChatTemplate::phi4);
  EXPECT_EQ(recognize_chat_template(
                "{{ bos_token }}{% for message in messages %}[INST] {{ message['content'] }} "
                "[/INST]{% endfor %}"),
            std::nullopt);
  EXPECT_EQ(recognize_chat_template(""), std::nullopt);
}

TEST(FinetuneData, SplitIsDeterministicAndDisjoint) {
  const auto examples = numbered(std::vector<int>(20, 2));
  const FinetuneSplit a = split_validation(examples, 0.25, 7);
  ASSERT_EQ(a.val.size(), 5u);
  ASSERT_EQ(a.train.size(), 15u);
  const FinetuneSplit again = split_validation(examples, 0.25, 7);
  const FinetuneSplit other = split_validation(examples, 0.25, 8);
  Ids val, val_again, val_other, all;
  for (const auto& e : a.val) val.push_back(e.ids[0]);
  for (const auto& e : again.val) val_again.push_back(e.ids[0]);
  for (const auto& e : other.val) val_other.push_back(e.ids[0]);
  EXPECT_EQ(val, val_again);
  EXPECT_NE(val, val_other);
  // Disjoint, together all 20, each part in file order.
  for (const auto& e : a.train) all.push_back(e.ids[0]);
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_EQ(std::set<int32_t>(all.begin(), all.end()).size(), 20u);
  EXPECT_TRUE(std::is_sorted(val.begin(), val.end()));
  EXPECT_TRUE(std::is_sorted(all.begin(), all.begin() + 15));
  // At least one held out, never all.
  EXPECT_EQ(split_validation(examples, 0.01, 7).val.size(), 1u);
  EXPECT_EQ(split_validation(numbered({2, 2}), 0.9, 7).val.size(), 1u);
  EXPECT_EQ(split_validation(numbered({2}), 0.5, 7).val.size(), 0u);
  EXPECT_EQ(split_validation(examples, 0.0, 7).val.size(), 0u);
  EXPECT_THROW(split_validation(examples, 1.0, 7), UsageError);
  EXPECT_THROW(split_validation(examples, -0.1, 7), UsageError);
}

// Lengths 3, 4, 2, 5, 1 into rows of 8: [3 4] (2 does not fit in the 1
// left), [2 5 1]; in file order.
TEST(FinetuneData, PackingKeepsWholeExamples) {
  auto examples = numbered({3, 4, 2, 5, 1});
  examples[3].labels[2] = X;  // a label the data left uncounted stays so
  FinetuneBatcher b(examples, 2, 8, FinetuneBatcher::Mode::pack, 1, /*pad_id=*/9);
  b.start_in_order();
  ASSERT_EQ(b.batches_per_epoch(), 1);
  const Batch batch = batch_of(b, 0);
  EXPECT_EQ(batch.ids, (Ids{1, 2, 3, 101, 102, 103, 104, 9,  //
                            201, 202, 301, 302, 303, 304, 305, 401}));
  EXPECT_EQ(batch.labels, (Ids{X, 2, 3, X, 102, 103, 104, X,  //
                               X, 202, X, 302, X, 304, 305, X}));
  EXPECT_EQ(batch.positions, (Ids{0, 1, 2, 0, 1, 2, 3, 0,  //
                                  0, 1, 0, 1, 2, 3, 4, 0}));
  EXPECT_EQ(batch.segments, (Ids{0, 0, 0, 1, 1, 1, 1, -1,  //
                                 0, 0, 1, 1, 1, 1, 1, 2}));
  EXPECT_EQ(b.counted_tokens(0), 2 + 3 + 1 + 3);
  EXPECT_EQ(b.truncated(), 0);
}

// Every shuffled epoch holds each example once, whole and in one row.
TEST(FinetuneData, PackingShuffledEpochsHoldEveryExampleOnce) {
  const std::vector<int> lengths = {5, 1, 7, 3, 3, 6, 2, 8, 4, 2, 5};
  FinetuneBatcher b(numbered(lengths), 3, 8, FinetuneBatcher::Mode::pack, 42);
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    b.start_epoch(epoch);
    std::vector<int> seen(lengths.size(), 0);
    for (int64_t i = 0; i < b.batches_per_epoch(); ++i) {
      const Batch batch = batch_of(b, i);
      for (size_t t = 0; t < batch.ids.size(); ++t) {
        if (batch.segments[t] < 0) continue;
        const int32_t k = batch.ids[t] / 100, pos = batch.ids[t] % 100 - 1;
        EXPECT_EQ(batch.positions[t], pos);
        EXPECT_EQ(batch.labels[t], pos == 0 ? X : batch.ids[t]);
        if (pos == 0) ++seen[size_t(k)];
        // The whole example follows in the same row and segment.
        if (pos == 0) {
          ASSERT_LE(t % 8 + size_t(lengths[size_t(k)]), 8u);
          for (int j = 1; j < lengths[size_t(k)]; ++j) {
            EXPECT_EQ(batch.ids[t + size_t(j)], batch.ids[t] + j);
            EXPECT_EQ(batch.segments[t + size_t(j)], batch.segments[t]);
          }
        }
      }
    }
    EXPECT_EQ(seen, std::vector<int>(lengths.size(), 1)) << "epoch " << epoch;
  }
}

// One example per row; the last batch is completed with padding rows.
TEST(FinetuneData, PaddingOneExamplePerRow) {
  FinetuneBatcher b(numbered({2, 4, 3}), 2, 4, FinetuneBatcher::Mode::pad, 1, /*pad_id=*/7);
  b.start_in_order();
  ASSERT_EQ(b.batches_per_epoch(), 2);
  Batch first = batch_of(b, 0), last = batch_of(b, 1);
  EXPECT_EQ(first.ids, (Ids{1, 2, 7, 7, 101, 102, 103, 104}));
  EXPECT_EQ(first.labels, (Ids{X, 2, X, X, X, 102, 103, 104}));
  EXPECT_EQ(first.positions, (Ids{0, 1, 0, 0, 0, 1, 2, 3}));
  EXPECT_EQ(first.segments, (Ids{0, 0, -1, -1, 0, 0, 0, 0}));
  EXPECT_EQ(last.ids, (Ids{201, 202, 203, 7, 7, 7, 7, 7}));
  EXPECT_EQ(last.labels, (Ids{X, 202, 203, X, X, X, X, X}));
  EXPECT_EQ(last.positions, (Ids{0, 1, 2, 0, 0, 0, 0, 0}));
  EXPECT_EQ(last.segments, (Ids{0, 0, 0, -1, -1, -1, -1, -1}));
  EXPECT_EQ(b.counted_tokens(0), 1 + 3);
  EXPECT_EQ(b.counted_tokens(1), 2);
}

TEST(FinetuneData, TruncationIsCounted) {
  auto examples = numbered({10, 3, 6});
  // The third: a prompt of 4 and a completion of 2, all cut off at T = 4.
  examples[2].labels = {X, X, X, X, 205, 206};
  FinetuneBatcher b(examples, 1, 4, FinetuneBatcher::Mode::pad, 1);
  EXPECT_EQ(b.truncated(), 2);
  EXPECT_EQ(b.truncated_uncounted(), 1);
  b.start_in_order();
  const Batch first = batch_of(b, 0), third = batch_of(b, 2);
  EXPECT_EQ(first.ids, (Ids{1, 2, 3, 4}));
  EXPECT_EQ(first.labels, (Ids{X, 2, 3, 4}));
  EXPECT_EQ(third.labels, (Ids{X, X, X, X}));
  EXPECT_EQ(b.counted_tokens(2), 0);
  EXPECT_EQ(FinetuneBatcher(numbered({4, 3}), 1, 4, FinetuneBatcher::Mode::pack, 1).truncated(), 0);
}

// A batch is a function of (seed, epoch, index): another batcher, or the same
// one after other epochs, gives it again; another epoch or seed reorders.
TEST(FinetuneData, BatchesDependOnSeedEpochAndIndexAlone) {
  std::vector<int> lengths;
  for (int k = 0; k < 30; ++k) lengths.push_back(1 + (k * 7) % 6);
  FinetuneBatcher a(numbered(lengths), 2, 8, FinetuneBatcher::Mode::pack, 5);
  FinetuneBatcher b(numbered(lengths), 2, 8, FinetuneBatcher::Mode::pack, 5);
  FinetuneBatcher c(numbered(lengths), 2, 8, FinetuneBatcher::Mode::pack, 6);
  a.start_epoch(3);
  b.start_epoch(1);
  b.start_in_order();
  b.start_epoch(3);
  c.start_epoch(3);
  ASSERT_EQ(a.batches_per_epoch(), b.batches_per_epoch());
  for (int64_t i = 0; i < a.batches_per_epoch(); ++i) {
    EXPECT_EQ(batch_of(a, i), batch_of(b, i)) << "batch " << i;
    EXPECT_EQ(a.counted_tokens(i), b.counted_tokens(i));
    const Batch batch = batch_of(a, i);
    EXPECT_EQ(a.counted_tokens(i), std::count_if(batch.labels.begin(), batch.labels.end(),
                                                 [](int32_t l) { return l != X; }));
  }
  const Ids order3 = epoch_order(a);
  EXPECT_EQ(order3.size(), 30u);
  EXPECT_NE(order3, epoch_order(c));
  a.start_epoch(4);
  EXPECT_NE(order3, epoch_order(a));
  a.start_epoch(3);
  EXPECT_EQ(order3, epoch_order(a));
  a.start_in_order();
  const Ids in_order = epoch_order(a);
  EXPECT_TRUE(std::is_sorted(in_order.begin(), in_order.end()));
  EXPECT_NE(order3, in_order);
}

TEST(FinetuneData, BatcherRejectsBadArguments) {
  using Mode = FinetuneBatcher::Mode;
  EXPECT_THROW(FinetuneBatcher(numbered({2}), 0, 4, Mode::pack, 1), UsageError);
  EXPECT_THROW(FinetuneBatcher(numbered({2}), 1, 0, Mode::pack, 1), UsageError);
  EXPECT_THROW(FinetuneBatcher({}, 1, 4, Mode::pack, 1), UsageError);
  auto bad = numbered({2, 3});
  bad[1].labels.pop_back();
  EXPECT_THROW(FinetuneBatcher(bad, 1, 4, Mode::pack, 1), UsageError);
  FinetuneBatcher b(numbered({2, 3}), 1, 4, Mode::pad, 1);
  EXPECT_THROW(b.start_epoch(-1), UsageError);
  EXPECT_EQ(b.batches_per_epoch(), 2);
  Ids buffer(4);
  EXPECT_THROW(b.batch(2, buffer.data(), buffer.data(), buffer.data(), buffer.data()), UsageError);
  EXPECT_THROW(b.counted_tokens(-1), UsageError);
}
