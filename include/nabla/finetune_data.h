// Fine-tuning data: a JSONL file read into tokenised examples with loss
// labels, a held-out split, and the batcher that cuts examples into rows.
//
// Dimension legend: B batch rows, T context length (tokens per row).
//
// Labels follow Hugging Face's convention: labels[i] is ids[i] where the loss
// counts token i and -100 where it does not, in the same positions as the ids
// (not shifted). The loss at token i >= 1 of a row scores the prediction of
// labels[i] made from the logits at token i - 1.
//
// FinetuneBatcher orders each epoch's examples from (seed, epoch) alone, so a
// run resumed at epoch e, batch b sees exactly the batch it would have seen.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nabla/tokenizer.h"

namespace nabla {

// The chat templates nabla renders itself.
//   chatml  SmolLM2, Qwen2: "<|im_start|>" role "\n" content "<|im_end|>" "\n"
//   llama3  Llama 3: "<|begin_of_text|>", then per message
//           "<|start_header_id|>" role "<|end_header_id|>\n\n" content "<|eot_id|>"
//   llama3.1, llama3.2  Llama 3.1 and 3.3, Llama 3.2: the same with a system
//           block first (knowledge cutoff; 3.1's fixed date, 3.2's today's)
//   gemma   Gemma 3: "<bos>", then per turn "<start_of_turn>" role "\n"
//           content "<end_of_turn>\n" (role "model" for the assistant; a
//           system message goes before the first user content)
//   phi3    Phi-3, Phi-3.5: "<|" role "|>\n" content "<|end|>\n", then the
//           end-of-text token
//   phi4    Phi-4-mini: "<|" role "|>" content "<|end|>", then the
//           end-of-text token
//   smollm3 SmolLM3: ChatML after a system block of metadata (today's date,
//           the reasoning mode) and custom instructions
//   qwen3   Qwen3: ChatML with think blocks after the last user message
enum class ChatTemplate { chatml, llama3, llama3_1, llama3_2, gemma, phi3, phi4, smollm3, qwen3 };
// "chatml", "llama3", "llama3.1", "llama3.2", "gemma", "phi3", "phi4",
// "smollm3" or "qwen3"; UsageError naming them for another name.
ChatTemplate parse_chat_template(const std::string& name);
const char* chat_template_name(ChatTemplate t);
std::vector<std::string> chat_template_names();  // every template's, in the enum's order
// The built-in template a Jinja chat template (tokenizer_config.json's
// "chat_template", GGUF's tokenizer.chat_template) is, recognised by its
// markers: "<|im_start|>" for chatml, "<|start_header_id|>" for llama3
// (with "Cutting Knowledge Date": llama3.2 when it calls strftime_now, else
// llama3.1),
// "<start_of_turn>" for gemma, "<|end|>" and "<|assistant|>" for phi3 (its
// markers followed by a newline) or phi4; ChatML's with "Reasoning Mode"
// for smollm3, with "last_query_index" and "</think>" for qwen3;
// std::nullopt when it has none or several.
std::optional<ChatTemplate> recognize_chat_template(const std::string& jinja);

struct FinetuneExample {
  std::vector<int32_t> ids;     // token ids
  std::vector<int32_t> labels;  // ids[i] where the loss counts token i, else -100; same length
};

struct FinetuneDataOptions {
  ChatTemplate chat_template = ChatTemplate::chatml;  // for "messages" lines
  // When not empty, a system message with this content is rendered before a
  // conversation that does not start with one, as SmolLM2's and Qwen2's
  // templates do with their own default (SmolLM2's: "You are a helpful AI
  // assistant named SmolLM, trained by Hugging Face").
  std::string default_system;
  // The date of dated templates (SmolLM3's and Llama 3.2's strftime_now), as
  // YYYY-MM-DD; empty: chat_date_today() when the line is read.
  std::string today;
  // When not empty, a "messages" line is an error saying this (a base whose
  // own template nabla does not render).
  std::string refuse_messages;
};
// The local date, YYYY-MM-DD.
std::string chat_date_today();
// Whether the template renders today's date (smollm3, llama3.2).
bool chat_template_is_dated(ChatTemplate t);
// The options for `name` (--chat-template): the template of that name, or
// for "auto" the one the base's Jinja template `jinja` is (ChatML when
// `jinja` is empty; when nabla renders none like it, options that refuse
// messages, naming `source`, the base). A ChatML template's default system
// message (a literal it writes for a conversation without one: SmolLM2's,
// Qwen2.5's) becomes default_system.
FinetuneDataOptions chat_template_options(const std::string& name, const std::string& jinja,
                                          const std::string& source);

struct ChatMessage {
  std::string role, content;  // role: "system", "user" or "assistant"
};
// What a chat model continues to reply to `messages`: them rendered as a
// "messages" line is (below), then the template's generation prompt (the
// assistant's header; SmolLM3 in "/no_think": and an empty think block).
// IoError "chat prompt: ..." for no message, an unknown role, or what the
// template refuses.
std::vector<int32_t> chat_prompt_ids(const std::vector<ChatMessage>& messages, const Tokenizer& tokenizer,
                                     const FinetuneDataOptions& options);
// The ids that end generation (llama.cpp's end-of-generation set): the
// tokenizer's end-of-text token, and each end-of-turn marker it has as one
// token ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>",
// "<|end|>", "<eos>").
std::vector<int32_t> end_of_generation_ids(const Tokenizer& tokenizer);

// One example per non-blank line of a JSONL file, each line an object of one
// of these forms (other keys are ignored):
//   {"text": S}
//       prefix_ids() + encode(S) + [eot_id() when >= 0]; every token counts.
//   {"prompt": P, "completion": C}
//       prefix_ids() + encode(P) + encode(C) + [eot_id() when >= 0]; only C's
//       tokens and the end-of-text token count (TRL's completion-only loss).
//   {"messages": [{"role": "system" | "user" | "assistant", "content": S}, ...]}
//       rendered with options.chat_template, each piece encoded on its own and
//       concatenated. Each assistant message's content and end marker count:
//       chatml:  prefix_ids(), then per message "<|im_start|>" role "\n"
//                (not counted), content, "<|im_end|>", "\n" (not counted).
//       llama3:  "<|begin_of_text|>" once (instead of prefix_ids()), then per
//                message "<|start_header_id|>" role "<|end_header_id|>\n\n"
//                (not counted), content with white space trimmed at both
//                ends (the template's `| trim`), "<|eot_id|>".
//       llama3.1, llama3.2: "<|begin_of_text|>", then "<|start_header_id|>
//                system<|end_header_id|>\n\nCutting Knowledge Date:
//                December 2023\nToday Date: " date "\n\n" (the first
//                message's content, trimmed, when it is a system message)
//                "<|eot_id|>" (not counted), then the other messages as
//                llama3. The date: "26 Jul 2024" (3.1), today's as "%d %b
//                %Y" (3.2), or the line's chat_template_kwargs' "date_string".
//       gemma:   "<bos>" once (instead of prefix_ids()), then per turn
//                "<start_of_turn>" ("user" or "model") "\n" (not counted;
//                the first followed by a system message's content and
//                "\n\n"), content trimmed, "<end_of_turn>", "\n" (not
//                counted). Turns must alternate user, assistant, ... as the
//                template demands.
//       phi3:    prefix_ids(), then per message "<|" role "|>\n" (not
//                counted), content, "<|end|>", "\n" (not counted; an empty
//                system message is skipped, as Phi-3.5's template does); then
//                eot_id(), counted when the last message is the assistant's.
//       phi4:    as phi3 without the newlines.
//       smollm3: prefix_ids(), then "<|im_start|>system\n## Metadata\n\n
//                Knowledge Cutoff Date: June 2025\nToday Date: " today
//                "\nReasoning Mode: " ("/think" or "/no_think") "\n\n##
//                Custom Instructions\n\n" instructions "\n\n" (not
//                counted; no "<|im_end|>", as the template has it without
//                tools). The mode is "/no_think" when the first message is a
//                system message holding "/no_think", else "/think" when it
//                holds "/think", else the line's chat_template_kwargs'
//                "enable_thinking" (default true); the instructions are that
//                message without those flags, right-stripped, else the
//                kwargs' "custom_instructions", else SmolLM's default for the
//                mode. A system message holding "/system_override" is
//                rendered instead as "<|im_start|>system\n" its text (flags
//                removed) "<|im_end|>\n". Then as chatml, assistant content
//                left-stripped of newlines and, in "/no_think", opened by
//                "<think>\n\n</think>\n" (not counted). A later system
//                message is refused (the template drops it).
//       qwen3:   prefix_ids(), then as chatml, but an assistant message's
//                content holding "</think>" is split: its reasoning (between
//                the last "<think>" before the first "</think>" and that,
//                newlines stripped) and its answer (after the last
//                "</think>", newlines left-stripped). Before the last user
//                message the reasoning is dropped; after it, a message with
//                reasoning, and the last message always, opens with
//                "<think>\n" reasoning "\n</think>\n\n", counted, or when
//                there is none "<think>\n\n</think>\n\n", not counted.
//       A marker is one id when the tokenizer has it as an added token, else
//       whatever encode() makes of its text. NOTE: as with Hugging Face's
//       apply_chat_template, a marker's text inside content is encoded as
//       the marker.
// IoError "FILE:LINE: ..." for a line that is not JSON, not an object, none
// of the forms or more than one, has a field of the wrong type, an unknown
// role, an empty "messages" list, or no counted token after its first (the
// first token is never predicted, see FinetuneBatcher); IoError naming the
// file when it is missing, unreadable or holds no example.
std::vector<FinetuneExample> read_finetune_jsonl(const std::string& path,
                                                 const Tokenizer& tokenizer,
                                                 const FinetuneDataOptions& options = {});
// One line of such a file (IoError "example: ..." as above).
FinetuneExample finetune_example(const std::string& line, const Tokenizer& tokenizer,
                                 const FinetuneDataOptions& options = {});
// What a model continues from to write a line's reply, for generation: a
// {"prompt": P} line's prefix_ids() + encode(P) (the completion, when there
// is one, left out); a {"text": S} line's prefix_ids() + encode(S); a
// "messages" line's conversation, less a last assistant message (the reply),
// rendered as chat_prompt_ids does (with the line's chat_template_kwargs).
// IoError "prompt: ..." as for examples, and for an empty prompt.
std::vector<int32_t> finetune_prompt(const std::string& line, const Tokenizer& tokenizer,
                                     const FinetuneDataOptions& options = {});

struct FinetuneSplit {
  std::vector<FinetuneExample> train, val;  // each in the order the examples came
};
// Holds out round(fraction * n) of the n examples, chosen by a shuffle drawn
// from `seed` alone: at least 1 when fraction > 0 and n >= 2, never all n.
// UsageError for a fraction outside [0, 1).
FinetuneSplit split_validation(std::vector<FinetuneExample> examples, double fraction,
                               uint64_t seed);

// Cuts examples into batches of B rows of T tokens.
//
//   FinetuneBatcher batches(std::move(split.train), B, T, FinetuneBatcher::Mode::pack, seed, pad);
//   std::vector<int32_t> ids(B * T), labels(B * T), positions(B * T), segments(B * T);
//   for (int64_t epoch = start; epoch < epochs; ++epoch) {
//     batches.start_epoch(epoch);
//     for (int64_t b = 0; b < batches.batches_per_epoch(); ++b)
//       batches.batch(b, ids.data(), labels.data(), positions.data(), segments.data());
//   }
//
// An example longer than T keeps its first T tokens (truncated() counts
// them). Rows are cut once, from the examples in the order given, and each
// epoch takes them in an order of its own (so every epoch has as many
// batches, and a packed row keeps its examples):
//   pack: whole examples one after another; an example that does not fit in
//         what is left of a row starts the next row, and the rest is padding.
//   pad:  one example per row, the rest padding.
// Per token a batch holds its id, its label, its position within its own
// example (0, 1, 2, ... restarting at each example, so a packed row computes
// as its examples would alone under a mask that keeps segments apart) and its
// segment (the example's index within its row: 0, 1, ...). Padding is id
// pad_id, label -100, position 0, segment -1. The label of each example's
// first token is -100: nothing in its own example predicts it (as Hugging
// Face's DataCollatorWithFlattening does), which also keeps a packed row's
// loss from scoring one example's last token against the next one's first.
// The last batch of an epoch is completed with padding rows, so every batch
// has B rows.
class FinetuneBatcher {
 public:
  enum class Mode { pack, pad };

  // Starts at epoch 0. UsageError unless batch >= 1, context >= 1, there is
  // at least one example, and every example is non-empty with as many labels
  // as ids.
  FinetuneBatcher(std::vector<FinetuneExample> examples, int64_t batch, int64_t context, Mode mode,
                  uint64_t seed, int32_t pad_id = 0);

  // Orders the rows by a shuffle drawn from (seed, epoch) alone. UsageError
  // for epoch < 0.
  void start_epoch(int64_t epoch);
  // The rows in the order they were cut, not shuffled (validation).
  void start_in_order();

  // Batches in an epoch: the rows over B, rounded up.
  int64_t batches_per_epoch() const;
  // Writes batch `index` of the current epoch into four [B, T] buffers.
  // UsageError for an index outside [0, batches_per_epoch()).
  void batch(int64_t index, int32_t* ids, int32_t* labels, int32_t* positions,
             int32_t* segments) const;
  // The labels other than -100 in batch `index`: the tokens its loss averages over.
  int64_t counted_tokens(int64_t index) const;
  // Those of rows [row_begin, row_end) of batch `index` alone.
  int64_t counted_tokens(int64_t index, int64_t row_begin, int64_t row_end) const;

  // Examples longer than T, of which truncated_uncounted() lost every counted
  // token (their loss is always zero: a prompt longer than T, say).
  int64_t truncated() const { return truncated_; }
  int64_t truncated_uncounted() const { return truncated_uncounted_; }
  // The counted tokens of every example (0: nothing to learn from).
  int64_t counted_tokens_total() const;

  int64_t batch_size() const { return batch_; }
  int64_t context() const { return context_; }
  int64_t size() const { return static_cast<int64_t>(examples_.size()); }

 private:
  void cut_rows();
  void check_index(int64_t index) const;  // UsageError outside [0, batches_per_epoch())
  // [first, last): the examples (indices into examples_) in the epoch's row
  // `row` (none for the padding rows that complete the last batch).
  std::pair<int64_t, int64_t> row_examples(int64_t row) const;

  std::vector<FinetuneExample> examples_;  // truncated to T, first label -100
  std::vector<int64_t> counted_;           // per example, labels other than -100
  int64_t batch_, context_;
  Mode mode_;
  uint64_t seed_;
  int32_t pad_id_;
  int64_t truncated_ = 0, truncated_uncounted_ = 0;
  std::vector<int64_t> row_start_;  // row r holds examples [row_start_[r], row_start_[r + 1])
  std::vector<int64_t> row_order_;  // the current epoch's rows
};

}  // namespace nabla
