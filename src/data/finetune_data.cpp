// Fine-tuning data: JSONL lines to labelled examples, the held-out split and
// FinetuneBatcher.
//
// Randomness is counter-based, as in the image BatchLoader: every draw is a
// hash of (seed, stream, epoch, counter), so an epoch's order depends on
// nothing but those, and not on the standard library (std::shuffle's
// algorithm is the implementation's choice).
#include "nabla/finetune_data.h"

#include <algorithm>
#include <numeric>
#include <cmath>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <ctime>
#include <string_view>

#include "data/counter_random.h"
#include "nabla/error.h"
#include "nabla/io.h"

namespace nabla {

namespace {

using json = nlohmann::json;

constexpr int32_t kIgnore = -100;  // Hugging Face's ignore_index

// Streams keep the draws of different purposes independent.
enum Stream : uint64_t { kSplit = 1, kOrder = 2 };

// 0 .. n-1 in an order drawn from (seed, stream, epoch).
std::vector<int64_t> shuffled(int64_t n, uint64_t seed, uint64_t stream, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  data::shuffle(order, seed, stream, epoch);
  return order;
}

// Python's str.lstrip / rstrip / strip of the characters in `chars`.
std::string_view lstrip(std::string_view s, std::string_view chars) {
  while (!s.empty() && chars.find(s.front()) != std::string_view::npos) s.remove_prefix(1);
  return s;
}
std::string_view rstrip(std::string_view s, std::string_view chars) {
  while (!s.empty() && chars.find(s.back()) != std::string_view::npos) s.remove_suffix(1);
  return s;
}
std::string_view strip(std::string_view s, std::string_view chars) { return lstrip(rstrip(s, chars), chars); }
constexpr std::string_view kSpace = " \t\n\v\f\r";  // ASCII white space: what str.strip() and Jinja's trim drop

// Jinja's `trim`.
std::string_view trim(std::string_view s) { return strip(s, kSpace); }

// The value as JSON text for messages (invalid UTF-8 replaced, never throws),
// cut short when long.
std::string json_text(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// One line's example, built piece by piece.
class ExampleBuilder {
 public:
  ExampleBuilder(const Tokenizer& tokenizer, std::string where)
      : tokenizer_(tokenizer), where_(std::move(where)) {}

  void ids(const std::vector<int32_t>& ids, bool counted) {
    example_.ids.insert(example_.ids.end(), ids.begin(), ids.end());
    for (int32_t id : ids) example_.labels.push_back(counted ? id : kIgnore);
  }
  void text(std::string_view s, bool counted) { ids(tokenizer_.encode(s), counted); }
  void end_of_text() {
    if (tokenizer_.eot_id() >= 0) ids({tokenizer_.eot_id()}, true);
  }

  // The string field `key` of `object` (`name` says where it is in messages).
  std::string field(const json& object, const char* key, const std::string& name) const {
    const json& v = object.at(key);
    if (!v.is_string()) throw error(name + " is " + json_text(v) + ", expected a string");
    return v.get<std::string>();
  }

  IoError error(const std::string& what) const { return IoError(where_ + what); }

  // The ids alone (a prompt: nothing counts).
  std::vector<int32_t> finish_prompt() { return std::move(example_.ids); }

  // The example; an error when no token after the first counts (`hint` says
  // what the line lacks).
  FinetuneExample finish(const std::string& hint) {
    const auto& l = example_.labels;
    if (l.size() < 2 || std::all_of(l.begin() + 1, l.end(), [](int32_t x) { return x == kIgnore; }))
      throw error("no token after the first counts toward the loss (" + hint + ")");
    return std::move(example_);
  }

 private:
  const Tokenizer& tokenizer_;
  std::string where_;
  FinetuneExample example_;
};

using Message = ChatMessage;

// An ISO date ("2026-12-07"; empty: today's) as strftime's "%d %B %Y" writes
// it ("07 December 2026"), or "%d %b %Y" ("07 Dec 2026") when !long_month.
std::string template_date(const std::string& iso, bool long_month) {
  static constexpr const char* kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                                            "July",    "August",   "September", "October", "November", "December"};
  const std::string date = iso.empty() ? chat_date_today() : iso;
  int y = 0, m = 0, d = 0;
  char end = 0;
  if (std::sscanf(date.c_str(), "%4d-%2d-%2d%c", &y, &m, &d, &end) != 3 || m < 1 || m > 12 || d < 1 || d > 31) {
    throw UsageError("chat template date \"" + date + "\": expected YYYY-MM-DD");
  }
  char day[4];
  std::snprintf(day, sizeof day, "%02d", d);
  const std::string month = long_month ? kMonths[m - 1] : std::string(kMonths[m - 1]).substr(0, 3);
  return std::string(day) + " " + month + " " + std::to_string(y);
}

// SmolLM3's default custom instructions (its template's text), in thinking
// and in non-thinking mode.
constexpr const char* kSmolLM3ThinkingInstructions =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant "
    "involves thoroughly exploring questions through a systematic thinking process before providing "
    "the final precise and accurate solutions. This requires engaging in a comprehensive cycle of "
    "analysis, summarizing, exploration, reassessment, reflection, backtracking, and iteration to "
    "develop well-considered thinking process. Please structure your response into two main sections: "
    "Thought and Solution using the specified format: <think> Thought section </think> Solution "
    "section. In the Thought section, detail your reasoning process in steps. Each step should "
    "include detailed considerations such as analysing questions, summarizing relevant findings, "
    "brainstorming new ideas, verifying the accuracy of the current steps, refining any errors, and "
    "revisiting previous steps. In the Solution section, based on various attempts, explorations, and "
    "reflections from the Thought section, systematically present the final solution that you deem "
    "correct. The Solution section should be logical, accurate, and concise and detail necessary "
    "steps needed to reach the conclusion.";
constexpr const char* kSmolLM3Instructions = "You are a helpful AI assistant named SmolLM, trained by Hugging Face.";

// s with every `what` removed (Python's s.replace(what, "")).
std::string erase_all(std::string s, std::string_view what) {
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at)) s.erase(at, what.size());
  return s;
}

// The line's "chat_template_kwargs" (TRL's per-example template arguments):
// `key` when the object holds it, checked to be of the type `is` accepts.
const json* template_kwarg(const json& line, const char* key, bool (json::*is)() const noexcept,
                           const char* expected, const ExampleBuilder& b) {
  const auto kwargs = line.find("chat_template_kwargs");
  if (kwargs == line.end() || kwargs->is_null()) return nullptr;
  if (!kwargs->is_object()) throw b.error("\"chat_template_kwargs\" is " + json_text(*kwargs) + ", expected an object");
  const auto v = kwargs->find(key);
  if (v == kwargs->end() || v->is_null()) return nullptr;
  if (!((*v).*is)()) {
    throw b.error("\"chat_template_kwargs\"." + std::string(key) + " is " + json_text(*v) + ", expected " + expected);
  }
  return &*v;
}

// SmolLM3's template (no tools): a system block of metadata and custom
// instructions, which a "/think" or "/no_think" in the system message (or
// chat_template_kwargs' enable_thinking, default true) sets the reasoning
// mode of; "/system_override" replaces the block with the message alone.
// NOTE: as the template does, the block has no "<|im_end|>" without tools.
// Assistant turns in "/no_think" open with an empty think block, not counted.
void render_smollm3(const std::vector<Message>& turns, const json& line, ExampleBuilder& b,
                    const Tokenizer& tokenizer, const FinetuneDataOptions& options, bool reply) {
  const json* thinking = template_kwarg(line, "enable_thinking", &json::is_boolean, "true or false", b);
  bool think = thinking ? thinking->get<bool>() : true;
  std::string custom;
  if (const json* c = template_kwarg(line, "custom_instructions", &json::is_string, "a string", b)) {
    custom = c->get<std::string>();
  }
  const bool system = turns.front().role == "system";
  if (system) {
    const std::string& m = turns.front().content;
    if (m.find("/no_think") != std::string::npos) {
      think = false;
    } else if (m.find("/think") != std::string::npos) {
      think = true;
    }
    custom = std::string(rstrip(erase_all(erase_all(m, "/no_think"), "/think"), kSpace));
  }
  b.ids(tokenizer.prefix_ids(), false);
  if (system && turns.front().content.find("/system_override") != std::string::npos) {
    b.text("<|im_start|>system\n" + std::string(rstrip(erase_all(custom, "/system_override"), kSpace)) +
               "<|im_end|>\n",
           false);
  } else {
    const std::string today = template_date(options.today, true);
    if (custom.empty()) custom = think ? kSmolLM3ThinkingInstructions : kSmolLM3Instructions;
    b.text("<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: " + today +
               "\nReasoning Mode: " + (think ? "/think" : "/no_think") + "\n\n## Custom Instructions\n\n" + custom +
               "\n\n",
           false);
  }
  for (size_t k = system ? 1 : 0; k < turns.size(); ++k) {
    const Message& t = turns[k];
    if (t.role == "system") {
      throw b.error("\"messages\"[" + std::to_string(k) +
                    "] is a system message; SmolLM3's template renders one system message, the first");
    }
    const bool counted = t.role == "assistant";
    b.text("<|im_start|>" + t.role + "\n" + (counted && !think ? "<think>\n\n</think>\n" : ""), false);
    b.text(counted ? lstrip(t.content, "\n") : t.content, counted);
    b.text("<|im_end|>", counted);
    b.text("\n", false);
  }
  if (reply) b.text(std::string("<|im_start|>assistant\n") + (think ? "" : "<think>\n\n</think>\n"), false);
}

// Qwen3's template (no tools): ChatML, each assistant message's reasoning
// (what its content holds before "</think>") dropped, except after the last
// user message, where a think block holds it and opens the last message
// always (empty: not counted, as the prompt gives it in non-thinking mode).
void render_qwen3(const std::vector<Message>& turns, const json& line, ExampleBuilder& b, const Tokenizer& tokenizer,
                  bool reply) {
  size_t last_query = turns.size() - 1;
  for (size_t k = turns.size(); k-- > 0;) {
    if (turns[k].role == "user") {
      last_query = k;
      break;
    }
  }
  b.ids(tokenizer.prefix_ids(), false);
  for (size_t k = 0; k < turns.size(); ++k) {
    const Message& t = turns[k];
    if (t.role != "assistant") {
      b.text("<|im_start|>" + t.role + "\n", false);
      b.text(t.content, false);
      b.text("<|im_end|>\n", false);
      continue;
    }
    std::string_view content = t.content, reasoning;
    if (const size_t end = content.find("</think>"); end != std::string_view::npos) {
      reasoning = rstrip(content.substr(0, end), "\n");
      if (const size_t open = reasoning.rfind("<think>"); open != std::string_view::npos) {
        reasoning.remove_prefix(open + 7);
      }
      reasoning = strip(reasoning, "\n");
      content = lstrip(content.substr(content.rfind("</think>") + 8), "\n");
    }
    b.text("<|im_start|>assistant\n", false);
    if (k > last_query && (k + 1 == turns.size() || !reasoning.empty())) {
      if (reasoning.empty()) {
        b.text("<think>\n\n</think>\n\n", false);
      } else {
        b.text("<think>\n" + std::string(reasoning) + "\n</think>\n\n", true);
      }
      content = lstrip(content, "\n");
    }
    b.text(content, true);
    b.text("<|im_end|>", true);
    b.text("\n", false);
  }
  if (reply) {
    const json* thinking = template_kwarg(line, "enable_thinking", &json::is_boolean, "true or false", b);
    b.text(std::string("<|im_start|>assistant\n") + (thinking && !thinking->get<bool>() ? "<think>\n\n</think>\n\n" : ""),
           false);
  }
}

// `turns` in options.chat_template; with `reply`, then the template's
// generation prompt (the assistant's header), not counted.
void render_messages(std::vector<Message> turns, const json& line, ExampleBuilder& b, const Tokenizer& tokenizer,
                     const FinetuneDataOptions& options, bool reply) {
  if (!options.default_system.empty() && turns.front().role != "system")
    turns.insert(turns.begin(), {"system", options.default_system});

  switch (options.chat_template) {
    case ChatTemplate::chatml:
      b.ids(tokenizer.prefix_ids(), false);
      for (const Message& t : turns) {
        const bool counted = t.role == "assistant";
        b.text("<|im_start|>" + t.role + "\n", false);
        b.text(t.content, counted);
        b.text("<|im_end|>", counted);
        b.text("\n", false);
      }
      if (reply) b.text("<|im_start|>assistant\n", false);
      break;
    case ChatTemplate::llama3:
    case ChatTemplate::llama3_1:
    case ChatTemplate::llama3_2: {
      // The template writes bos_token itself, so prefix_ids() (the same
      // token, from the post-processor) is not added again.
      b.text("<|begin_of_text|>", false);
      size_t first = 0;
      if (options.chat_template != ChatTemplate::llama3) {
        // Llama 3.1's and 3.2's system block, always there: the knowledge
        // cutoff, a date (3.1's fixed, 3.2's today's) and the system message.
        std::string date = options.chat_template == ChatTemplate::llama3_1 ? "26 Jul 2024"
                                                                             : template_date(options.today, false);
        if (const json* d = template_kwarg(line, "date_string", &json::is_string, "a string", b)) {
          date = d->get<std::string>();
        }
        const bool system = turns.front().role == "system";
        b.text("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: " +
                   date + "\n\n" + std::string(system ? trim(turns.front().content) : "") + "<|eot_id|>",
               false);
        first = system ? 1 : 0;
      }
      for (size_t k = first; k < turns.size(); ++k) {
        const Message& t = turns[k];
        const bool counted = t.role == "assistant";
        b.text("<|start_header_id|>" + t.role + "<|end_header_id|>\n\n", false);
        b.text(trim(t.content), counted);
        b.text("<|eot_id|>", counted);
      }
      if (reply) b.text("<|start_header_id|>assistant<|end_header_id|>\n\n", false);
      break;
    }
    case ChatTemplate::gemma: {
      // Gemma 3's template: a system message is the first user turn's prefix.
      const bool system = turns.front().role == "system";
      b.text("<bos>", false);
      for (size_t k = system ? 1 : 0; k < turns.size(); ++k) {
        const Message& t = turns[k];
        const size_t turn = k - (system ? 1 : 0);
        if ((t.role == "user") != (turn % 2 == 0) || t.role == "system") {
          throw b.error("\"messages\"[" + std::to_string(k) + "] is a " + t.role +
                        " message; Gemma's template takes user and assistant messages by turns, user first, "
                        "after an optional system message");
        }
        const bool counted = t.role == "assistant";
        b.text("<start_of_turn>" + std::string(counted ? "model" : "user") + "\n" +
                   (turn == 0 && system ? turns.front().content + "\n\n" : ""),
               false);
        b.text(trim(t.content), counted);
        b.text("<end_of_turn>", counted);
        b.text("\n", false);
      }
      if (reply) b.text("<start_of_turn>model\n", false);
      break;
    }
    case ChatTemplate::smollm3:
      render_smollm3(turns, line, b, tokenizer, options, reply);
      break;
    case ChatTemplate::qwen3:
      render_qwen3(turns, line, b, tokenizer, reply);
      break;
    case ChatTemplate::phi3:
    case ChatTemplate::phi4: {
      // "<|" role "|>" (Phi-3: and "\n"), content, "<|end|>" (Phi-3: "\n");
      // the template's eos_token after the last message (it writes one when
      // not prompting for a reply). Phi-3.5's skips an empty system message.
      const bool phi3 = options.chat_template == ChatTemplate::phi3;
      b.ids(tokenizer.prefix_ids(), false);
      for (const Message& t : turns) {
        if (phi3 && t.role == "system" && t.content.empty()) continue;
        const bool counted = t.role == "assistant";
        b.text("<|" + t.role + "|>" + (phi3 ? "\n" : ""), false);
        b.text(t.content, counted);
        b.text("<|end|>", counted);
        if (phi3) b.text("\n", false);
      }
      if (reply) {
        b.text(phi3 ? "<|assistant|>\n" : "<|assistant|>", false);
      } else if (tokenizer.eot_id() >= 0) {
        b.ids({tokenizer.eot_id()}, turns.back().role == "assistant");
      }
      break;
    }
  }
}

// A "messages" line's turns, each checked.
std::vector<Message> read_turns(const json& line, ExampleBuilder& b, const FinetuneDataOptions& options) {
  const json& messages = line["messages"];
  if (!options.refuse_messages.empty()) throw b.error("\"messages\": " + options.refuse_messages);
  if (!messages.is_array())
    throw b.error("\"messages\" is " + json_text(messages) +
                  ", expected an array of {role, content}");
  if (messages.empty()) throw b.error("\"messages\" is empty, expected at least one message");
  std::vector<Message> turns;
  for (size_t k = 0; k < messages.size(); ++k) {
    const json& m = messages[k];
    const std::string name = "\"messages\"[" + std::to_string(k) + "]";
    if (!m.is_object())
      throw b.error(name + " is " + json_text(m) + ", expected an object {role, content}");
    for (const char* key : {"role", "content"})
      if (!m.contains(key)) throw b.error(name + " has no \"" + std::string(key) + "\"");
    Message t{b.field(m, "role", name + ".role"), b.field(m, "content", name + ".content")};
    if (t.role != "system" && t.role != "user" && t.role != "assistant")
      throw b.error(name + ".role is \"" + t.role +
                    "\", expected \"system\", \"user\" or \"assistant\"");
    turns.push_back(std::move(t));
  }
  return turns;
}

enum class LineForm { text, prompt, messages };

// Which of the three forms an object line is; an error for none or several.
LineForm line_form(const json& j, ExampleBuilder& b) {
  if (!j.is_object())
    throw b.error("the line is a JSON " + std::string(j.type_name()) + ", expected an object");
  const bool messages = j.contains("messages"), text = j.contains("text");
  const bool prompt = j.contains("prompt") || j.contains("completion");
  const int forms = int(messages) + int(text) + int(prompt);
  if (forms != 1) {
    throw b.error(std::string(forms == 0 ? "none of the forms" : "more than one form") +
                  ": expected one of {\"text\": ...}, {\"prompt\": ..., \"completion\": ...} or "
                  "{\"messages\": [...]}");
  }
  return messages ? LineForm::messages : text ? LineForm::text : LineForm::prompt;
}

FinetuneExample read_line(const json& j, ExampleBuilder& b, const Tokenizer& tokenizer,
                          const FinetuneDataOptions& options) {
  const LineForm form = line_form(j, b);
  if (form == LineForm::messages) {
    render_messages(read_turns(j, b, options), j, b, tokenizer, options, false);
    return b.finish("no assistant message");
  }
  if (form == LineForm::text) {
    b.ids(tokenizer.prefix_ids(), true);
    b.text(b.field(j, "text", "\"text\""), true);
    b.end_of_text();
    return b.finish("a text needs two tokens or more, counting prefix and end-of-text tokens");
  }
  for (const char* key : {"prompt", "completion"})
    if (!j.contains(key))
      throw b.error("\"prompt\" and \"completion\" go together; \"" + std::string(key) +
                    "\" is missing");
  b.ids(tokenizer.prefix_ids(), false);
  b.text(b.field(j, "prompt", "\"prompt\""), false);
  b.text(b.field(j, "completion", "\"completion\""), true);
  b.end_of_text();
  return b.finish("an empty completion, or nothing before it, and no end-of-text token");
}

// What the model continues from for line j's reply (finetune_prompt).
std::vector<int32_t> read_prompt(const json& j, ExampleBuilder& b, const Tokenizer& tokenizer,
                                 const FinetuneDataOptions& options) {
  switch (line_form(j, b)) {
    case LineForm::messages: {
      std::vector<Message> turns = read_turns(j, b, options);
      if (turns.back().role == "assistant") turns.pop_back();  // the reply
      if (turns.empty()) throw b.error("\"messages\" has no message before the assistant's reply");
      render_messages(turns, j, b, tokenizer, options, true);
      break;
    }
    case LineForm::text:
      b.ids(tokenizer.prefix_ids(), false);
      b.text(b.field(j, "text", "\"text\""), false);
      break;
    case LineForm::prompt:
      if (!j.contains("prompt")) throw b.error("no \"prompt\"");
      b.ids(tokenizer.prefix_ids(), false);
      b.text(b.field(j, "prompt", "\"prompt\""), false);
      break;
  }
  std::vector<int32_t> ids = b.finish_prompt();
  if (ids.empty()) throw b.error("the prompt is empty: nothing to continue from");
  return ids;
}

}  // namespace

namespace {

constexpr std::pair<ChatTemplate, const char*> kChatTemplates[] = {
    {ChatTemplate::chatml, "chatml"}, {ChatTemplate::llama3, "llama3"},   {ChatTemplate::llama3_1, "llama3.1"},
    {ChatTemplate::llama3_2, "llama3.2"}, {ChatTemplate::gemma, "gemma"}, {ChatTemplate::phi3, "phi3"},
    {ChatTemplate::phi4, "phi4"},     {ChatTemplate::smollm3, "smollm3"}, {ChatTemplate::qwen3, "qwen3"}};

}  // namespace

ChatTemplate parse_chat_template(const std::string& name) {
  for (const auto& [t, n] : kChatTemplates)
    if (name == n) return t;
  std::string names;
  const size_t count = std::size(kChatTemplates);
  for (size_t i = 0; i < count; ++i) {
    names += std::string(i == 0 ? "" : i + 1 == count ? " or " : ", ") + "\"" + kChatTemplates[i].second + "\"";
  }
  throw UsageError("unknown chat template \"" + name + "\": expected " + names);
}

const char* chat_template_name(ChatTemplate t) {
  for (const auto& [u, n] : kChatTemplates)
    if (u == t) return n;
  return "?";
}

std::vector<std::string> chat_template_names() {
  std::vector<std::string> names;
  for (const auto& entry : kChatTemplates) names.push_back(entry.second);
  return names;
}

std::optional<ChatTemplate> recognize_chat_template(const std::string& jinja) {
  const bool chatml = jinja.find("<|im_start|>") != std::string::npos;
  const bool llama3 = jinja.find("<|start_header_id|>") != std::string::npos;
  const bool gemma = jinja.find("<start_of_turn>") != std::string::npos;
  const bool phi = jinja.find("<|end|>") != std::string::npos && jinja.find("<|assistant|>") != std::string::npos;
  if (int(chatml) + int(llama3) + int(gemma) + int(phi) != 1) return std::nullopt;
  // Phi-3's role markers end in a newline ('<|user|>\n'), Phi-4-mini's not.
  if (phi) return jinja.find("|>\n") != std::string::npos ? ChatTemplate::phi3 : ChatTemplate::phi4;
  if (chatml) {
    auto has = [&](const char* s) { return jinja.find(s) != std::string::npos; };
    if (has("Reasoning Mode")) return ChatTemplate::smollm3;
    if (has("last_query_index") && has("</think>")) return ChatTemplate::qwen3;
    return ChatTemplate::chatml;
  }
  if (llama3 && jinja.find("Cutting Knowledge Date") != std::string::npos) {
    return jinja.find("strftime_now") != std::string::npos ? ChatTemplate::llama3_2 : ChatTemplate::llama3_1;
  }
  return llama3 ? ChatTemplate::llama3 : ChatTemplate::gemma;
}

std::string chat_date_today() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char iso[32];
  std::snprintf(iso, sizeof iso, "%04d-%02d-%02d", local.tm_year + 1900, local.tm_mon + 1, local.tm_mday);
  return iso;
}

bool chat_template_is_dated(ChatTemplate t) { return t == ChatTemplate::smollm3 || t == ChatTemplate::llama3_2; }

namespace {

// The system message a ChatML template writes when a conversation has none
// (SmolLM2's, Qwen2.5's): a string literal holding "<|im_start|>system",
// a newline, the text and "<|im_end|>"; "" when it has no such literal.
std::string chatml_default_system(const std::string& jinja) {
  const std::string_view head = "<|im_start|>system";
  for (size_t at = jinja.find(head); at != std::string::npos; at = jinja.find(head, at + 1)) {
    size_t p = at + head.size();
    if (jinja.compare(p, 2, "\\n") == 0) {  // Jinja's escape (Qwen2.5's), or a newline itself (SmolLM2's)
      p += 2;
    } else if (jinja.compare(p, 1, "\n") == 0) {
      p += 1;
    } else {
      continue;
    }
    const size_t end = jinja.find("<|im_end|>", p);
    if (end == std::string::npos) continue;
    std::string text;
    bool literal = end > p;
    for (size_t i = p; i < end && literal; ++i) {
      const char c = jinja[i];
      if (c == '\\' && i + 1 < end) {
        const char e = jinja[++i];
        text += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      } else if (c == '\'' || c == '"' || c == '{' || c == '}') {
        literal = false;  // the literal ends: the message's content is spliced in
      } else {
        text += c;
      }
    }
    if (literal) return text;
  }
  return "";
}

}  // namespace

FinetuneDataOptions chat_template_options(const std::string& name, const std::string& jinja,
                                          const std::string& source) {
  if (name != "auto") return {.chat_template = parse_chat_template(name)};
  if (const auto t = recognize_chat_template(jinja)) {
    return {.chat_template = *t, .default_system = *t == ChatTemplate::chatml ? chatml_default_system(jinja) : ""};
  }
  FinetuneDataOptions o;
  if (!jinja.empty()) {
    o.refuse_messages = "the chat template of " + source +
                        " is none that nabla renders; give --chat-template with the one its model was tuned on";
  }
  return o;
}

std::vector<int32_t> chat_prompt_ids(const std::vector<ChatMessage>& messages, const Tokenizer& tokenizer,
                                     const FinetuneDataOptions& options) {
  ExampleBuilder b(tokenizer, "chat prompt: ");
  if (!options.refuse_messages.empty()) throw b.error(options.refuse_messages);
  if (messages.empty()) throw b.error("no message");
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      throw b.error("a message's role is \"" + m.role + "\", expected \"system\", \"user\" or \"assistant\"");
    }
  }
  render_messages(messages, json::object(), b, tokenizer, options, true);
  return b.finish_prompt();
}

std::vector<int32_t> end_of_generation_ids(const Tokenizer& tokenizer) {
  std::vector<int32_t> stop;
  if (tokenizer.eot_id() >= 0) stop.push_back(tokenizer.eot_id());
  // The templates' end-of-turn markers, Llama 3.1's end of a tool call, Gemma's end of sequence.
  for (const char* marker : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<eos>"}) {
    const std::vector<int32_t> ids = tokenizer.encode(marker);
    if (ids.size() == 1 && std::find(stop.begin(), stop.end(), ids[0]) == stop.end()) stop.push_back(ids[0]);
  }
  return stop;
}

namespace {

// One JSONL line as JSON; errors start with b's `where`.
json parse_line(std::string_view line, ExampleBuilder& b) {
  try {
    return json::parse(line);
  } catch (const json::parse_error& e) {
    // what() reads "[json.exception.parse_error.101] parse error at line 1,
    // column 9: syntax error ..."; the line is already named.
    const std::string what = e.what();
    const size_t column = what.find("column ");
    throw b.error("not JSON at " + (column == std::string::npos ? what : what.substr(column)));
  }
}

// One JSONL line's example; errors start with `where`.
FinetuneExample read_json_line(std::string_view line, const std::string& where, const Tokenizer& tokenizer,
                               const FinetuneDataOptions& options) {
  ExampleBuilder b(tokenizer, where);
  return read_line(parse_line(line, b), b, tokenizer, options);
}

}  // namespace

FinetuneExample finetune_example(const std::string& line, const Tokenizer& tokenizer,
                                 const FinetuneDataOptions& options) {
  return read_json_line(line, "example: ", tokenizer, options);
}

std::vector<int32_t> finetune_prompt(const std::string& line, const Tokenizer& tokenizer,
                                     const FinetuneDataOptions& options) {
  ExampleBuilder b(tokenizer, "prompt: ");
  return read_prompt(parse_line(line, b), b, tokenizer, options);
}

std::vector<FinetuneExample> read_finetune_jsonl(const std::string& path,
                                                 const Tokenizer& tokenizer,
                                                 const FinetuneDataOptions& options) {
  const std::string data = read_file(path);
  std::vector<FinetuneExample> examples;
  int64_t line_number = 0;
  for (size_t pos = 0; pos < data.size();) {
    size_t nl = data.find('\n', pos);
    if (nl == std::string::npos) nl = data.size();
    const std::string_view line(data.data() + pos, nl - pos);
    pos = nl + 1;
    ++line_number;
    if (trim(line).empty()) continue;
    examples.push_back(read_json_line(line, path + ":" + std::to_string(line_number) + ": ", tokenizer, options));
  }
  if (examples.empty())
    throw IoError(path + ": no examples (" + std::to_string(line_number) + " lines, all blank)");
  return examples;
}

FinetuneSplit split_validation(std::vector<FinetuneExample> examples, double fraction,
                               uint64_t seed) {
  if (!(fraction >= 0 && fraction < 1))
    throw UsageError("split_validation: fraction must be in [0, 1), got " +
                     std::to_string(fraction));
  const auto n = static_cast<int64_t>(examples.size());
  auto n_val = static_cast<int64_t>(std::llround(fraction * static_cast<double>(n)));
  if (fraction > 0 && n >= 2) n_val = std::clamp<int64_t>(n_val, 1, n - 1);
  if (n < 2) n_val = 0;
  std::vector<bool> held_out(static_cast<size_t>(n), false);
  const std::vector<int64_t> order = shuffled(n, seed, kSplit, 0);
  for (int64_t k = 0; k < n_val; ++k) held_out[size_t(order[size_t(k)])] = true;
  FinetuneSplit split;
  for (int64_t i = 0; i < n; ++i)
    (held_out[size_t(i)] ? split.val : split.train).push_back(std::move(examples[size_t(i)]));
  return split;
}

FinetuneBatcher::FinetuneBatcher(std::vector<FinetuneExample> examples, int64_t batch,
                                 int64_t context, Mode mode, uint64_t seed, int32_t pad_id)
    : examples_(std::move(examples)),
      batch_(batch),
      context_(context),
      mode_(mode),
      seed_(seed),
      pad_id_(pad_id) {
  if (batch < 1 || context < 1) {
    throw UsageError("FinetuneBatcher: batch and context must be >= 1, got batch " +
                     std::to_string(batch) + " and context " + std::to_string(context));
  }
  if (examples_.empty()) throw UsageError("FinetuneBatcher: no examples");
  counted_.reserve(examples_.size());
  for (size_t i = 0; i < examples_.size(); ++i) {
    FinetuneExample& e = examples_[i];
    if (e.ids.empty() || e.ids.size() != e.labels.size()) {
      throw UsageError("FinetuneBatcher: example " + std::to_string(i) + " has " +
                       std::to_string(e.ids.size()) + " ids and " +
                       std::to_string(e.labels.size()) + " labels, expected as many, at least 1");
    }
    const bool cut = static_cast<int64_t>(e.ids.size()) > context;
    const bool counted_before =
        std::any_of(e.labels.begin() + 1, e.labels.end(), [](int32_t x) { return x != kIgnore; });
    if (cut) {
      e.ids.resize(size_t(context));
      e.labels.resize(size_t(context));
    }
    e.labels[0] = kIgnore;
    counted_.push_back(
        std::count_if(e.labels.begin(), e.labels.end(), [](int32_t x) { return x != kIgnore; }));
    truncated_ += cut;
    truncated_uncounted_ += cut && counted_before && counted_.back() == 0;
  }
  cut_rows();
  start_epoch(0);
}

int64_t FinetuneBatcher::counted_tokens_total() const {
  return std::accumulate(counted_.begin(), counted_.end(), int64_t{0});
}

void FinetuneBatcher::start_epoch(int64_t epoch) {
  if (epoch < 0)
    throw UsageError("FinetuneBatcher: epoch must be >= 0, got " + std::to_string(epoch));
  row_order_ = shuffled(int64_t(row_start_.size()) - 1, seed_, kOrder, epoch);
}

void FinetuneBatcher::start_in_order() {
  row_order_.resize(row_start_.size() - 1);
  for (size_t i = 0; i < row_order_.size(); ++i) row_order_[i] = int64_t(i);
}

void FinetuneBatcher::cut_rows() {
  row_start_.assign(1, 0);
  int64_t used = 0;  // tokens in the row being filled
  for (size_t k = 0; k < examples_.size(); ++k) {
    const auto n = static_cast<int64_t>(examples_[k].ids.size());
    if (used > 0 && (mode_ == Mode::pad || used + n > context_)) {
      row_start_.push_back(int64_t(k));
      used = 0;
    }
    used += n;
  }
  row_start_.push_back(size());
}

int64_t FinetuneBatcher::batches_per_epoch() const {
  const auto rows = static_cast<int64_t>(row_start_.size()) - 1;
  return (rows + batch_ - 1) / batch_;
}

void FinetuneBatcher::check_index(int64_t index) const {
  if (index < 0 || index >= batches_per_epoch()) {
    throw UsageError("FinetuneBatcher: batch " + std::to_string(index) + " is outside [0, " +
                     std::to_string(batches_per_epoch()) + ")");
  }
}

std::pair<int64_t, int64_t> FinetuneBatcher::row_examples(int64_t row) const {
  if (row >= static_cast<int64_t>(row_order_.size())) return {0, 0};  // a padding row
  const size_t r = size_t(row_order_[size_t(row)]);
  return {row_start_[r], row_start_[r + 1]};
}

void FinetuneBatcher::batch(int64_t index, int32_t* ids, int32_t* labels, int32_t* positions,
                            int32_t* segments) const {
  check_index(index);
  const int64_t n = batch_ * context_;
  std::fill_n(ids, n, pad_id_);
  std::fill_n(labels, n, kIgnore);
  std::fill_n(positions, n, 0);
  std::fill_n(segments, n, -1);
  for (int64_t b = 0; b < batch_; ++b) {
    const auto [first, last] = row_examples(index * batch_ + b);
    int64_t at = b * context_;
    for (int64_t k = first; k < last; ++k) {
      const FinetuneExample& e = examples_[size_t(k)];
      std::copy(e.ids.begin(), e.ids.end(), ids + at);
      std::copy(e.labels.begin(), e.labels.end(), labels + at);
      for (size_t i = 0; i < e.ids.size(); ++i) {
        positions[at + int64_t(i)] = int32_t(i);
        segments[at + int64_t(i)] = int32_t(k - first);
      }
      at += static_cast<int64_t>(e.ids.size());
    }
  }
}

int64_t FinetuneBatcher::counted_tokens(int64_t index) const { return counted_tokens(index, 0, batch_); }

int64_t FinetuneBatcher::counted_tokens(int64_t index, int64_t row_begin, int64_t row_end) const {
  check_index(index);
  if (row_begin < 0 || row_end > batch_ || row_begin > row_end) {
    throw UsageError("FinetuneBatcher: rows [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
                     ") of a batch of " + std::to_string(batch_));
  }
  int64_t counted = 0;
  for (int64_t b = row_begin; b < row_end; ++b) {
    const auto [first, last] = row_examples(index * batch_ + b);
    for (int64_t k = first; k < last; ++k) counted += counted_[size_t(k)];
  }
  return counted;
}

}  // namespace nabla
