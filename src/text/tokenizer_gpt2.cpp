// GPT-2's byte-level BPE: the vocabulary files, the pre-tokenisation pattern
// matched by hand, and merges by rank.
//
// The files spell every token in GPT-2's byte-to-unicode alphabet (each byte a
// printable character, so ' ' is 'Ġ' and '\n' is 'Ċ'). Loading translates them
// back to bytes; after that the tokenizer works on raw bytes and token ids,
// and BPE merges pairs of ids.
#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "nabla/error.h"
#include "nabla/io.h"
#include "nabla/tokenizer.h"
#include "text/unicode.h"

namespace nabla {

namespace {

using text::CodeClass;

// GPT-2's bytes_to_unicode(): the printable bytes ! .. ~, ¡ .. ¬ and ® .. ÿ
// stand for themselves; the other 68 bytes, in increasing order, become
// U+0100, U+0101, ... Returns the code point that stands for each byte.
std::array<uint32_t, 256> byte_to_unicode() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? b : next++;
  }
  return table;
}

std::string show(std::string_view s) {
  std::string out = "'";
  for (char c : s) out += (static_cast<uint8_t>(c) < 0x20) ? '?' : c;
  return out + "'";
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// The end of the run of code points of class `cls` that starts at `pos`.
size_t run_end(std::string_view s, size_t pos, CodeClass cls) {
  while (pos < s.size()) {
    size_t len;
    uint32_t cp = text::decode_utf8(s, pos, len);
    CodeClass c = cp == text::kInvalid ? text::kOther : text::code_class(cp);
    if (c != cls) break;
    pos += len;
  }
  return pos;
}

CodeClass class_at(std::string_view s, size_t pos, size_t& len) {
  uint32_t cp = text::decode_utf8(s, pos, len);
  return cp == text::kInvalid ? text::kOther : text::code_class(cp);
}

// The end of the pattern's match at `i` (< s.size()); alternatives in the
// pattern's order:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_end(std::string_view s, size_t i) {
  size_t n = s.size();
  if (s[i] == '\'' && i + 1 < n) {
    char c = s[i + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
    if (i + 2 < n) {
      std::string_view two = s.substr(i + 1, 2);
      if (two == "re" || two == "ve" || two == "ll") return i + 3;
    }
  }
  size_t len;
  CodeClass c0 = class_at(s, i, len);
  // " ?X+" for X = letters, numbers, other: a space may lead a run of X.
  if (s[i] == ' ' && i + 1 < n) {
    size_t len1;
    CodeClass c1 = class_at(s, i + 1, len1);
    if (c1 != text::kSpace) return run_end(s, i + 1, c1);
  }
  if (c0 != text::kSpace) return run_end(s, i, c0);
  // "\s+(?!\S)": the whitespace run, less its last code point when a
  // non-space follows (that one leads the next piece); "\s+" when the run is
  // a single code point.
  size_t last = i, end = i + len;
  while (end < n) {
    size_t l;
    if (class_at(s, end, l) != text::kSpace) break;
    last = end;
    end += l;
  }
  if (end == n || last == i) return end;
  return last;
}

}  // namespace

struct Gpt2Tokenizer::Impl {
  std::vector<std::string> id_bytes;  // [vocab] each token's bytes
  std::array<int32_t, 256> byte_id{};
  int32_t eot = -1;
  struct Merge {
    int32_t rank, id;
  };
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left, right) -> rank, merged id

  // Pieces already encoded. Python's encoder keeps every piece; this one
  // starts over when it holds kCacheLimit, which bounds memory on large corpora.
  static constexpr size_t kCacheLimit = 1 << 18;
  mutable std::shared_mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void load_encoder(const std::string& path);
  void load_merges(const std::string& path);
  std::vector<int32_t> bpe(std::string_view piece) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
};

void Gpt2Tokenizer::Impl::load_encoder(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw IoError(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || j.empty()) throw IoError(path + ": expected a JSON object {token: id}");
  std::array<int32_t, 324> unicode_to_byte;
  unicode_to_byte.fill(-1);
  std::array<uint32_t, 256> b2u = byte_to_unicode();
  for (int b = 0; b < 256; ++b) unicode_to_byte[b2u[b]] = b;

  size_t vocab = j.size();
  id_bytes.assign(vocab, std::string());
  std::vector<bool> seen(vocab, false);
  byte_id.fill(-1);
  for (const auto& [token, value] : j.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= int64_t(vocab)) {
      throw IoError(path + ": token " + show(token) + " has id " + value.dump() +
                    ", expected an integer in [0, " + std::to_string(vocab) + ")");
    }
    int32_t id = value.get<int32_t>();
    if (seen[id]) throw IoError(path + ": id " + std::to_string(id) + " is given to two tokens");
    seen[id] = true;
    // Translate the token from the byte alphabet back to bytes.
    std::string bytes;
    for (size_t pos = 0; pos < token.size();) {
      size_t len;
      uint32_t cp = text::decode_utf8(token, pos, len);
      if (cp == text::kInvalid || cp >= unicode_to_byte.size() || unicode_to_byte[cp] < 0) {
        throw IoError(path + ": token " + show(token) +
                      " has a character outside GPT-2's byte alphabet");
      }
      bytes += static_cast<char>(unicode_to_byte[cp]);
      pos += len;
    }
    if (bytes.size() == 1) byte_id[static_cast<uint8_t>(bytes[0])] = id;
    if (token == "<|endoftext|>") eot = id;
    id_bytes[id] = std::move(bytes);
  }
  for (int b = 0; b < 256; ++b) {
    if (byte_id[b] < 0)
      throw IoError(path + ": no token for byte " + std::to_string(b) + " (every byte needs one)");
  }
}

void Gpt2Tokenizer::Impl::load_merges(const std::string& path) {
  std::string data = read_file(path);
  // Tokens in the byte alphabet, to look the merges up.
  std::array<uint32_t, 256> b2u = byte_to_unicode();
  std::unordered_map<std::string, int32_t> token_id;
  token_id.reserve(id_bytes.size());
  for (int32_t id = 0; id < int32_t(id_bytes.size()); ++id) {
    std::string token;
    for (char c : id_bytes[id]) {
      uint32_t cp = b2u[static_cast<uint8_t>(c)];
      if (cp < 0x80) {
        token += static_cast<char>(cp);
      } else {  // every byte-alphabet character is below U+0800: two UTF-8 bytes
        token += static_cast<char>(0xC0 | (cp >> 6));
        token += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
    token_id.emplace(std::move(token), id);
  }
  auto lookup = [&](const std::string& token, size_t line) {
    auto it = token_id.find(token);
    if (it == token_id.end()) {
      throw IoError(path + ": line " + std::to_string(line) + ": " + show(token) +
                    " is not in encoder.json");
    }
    return it->second;
  };

  size_t line_no = 0, pos = 0;
  int32_t rank = 0;
  while (pos < data.size()) {
    size_t nl = data.find('\n', pos);
    if (nl == std::string::npos) nl = data.size();
    std::string_view line(data.data() + pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      throw IoError(path + ": line " + std::to_string(line_no) +
                    ": expected two tokens separated by a space, got " + show(line));
    }
    std::string left(line.substr(0, space)), right(line.substr(space + 1));
    int32_t a = lookup(left, line_no), b = lookup(right, line_no),
            ab = lookup(left + right, line_no);
    if (!merges.emplace(pair_key(a, b), Merge{rank, ab}).second) {
      throw IoError(path + ": line " + std::to_string(line_no) + ": the merge " + show(line) +
                    " appears twice");
    }
    ++rank;
  }
  if (merges.empty()) throw IoError(path + ": no merges");
}

// GPT-2's bpe(): repeatedly merge the adjacent pair of lowest rank, every
// occurrence left to right, until no adjacent pair has a rank.
std::vector<int32_t> Gpt2Tokenizer::Impl::bpe(std::string_view piece) const {
  std::vector<int32_t> word(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) word[i] = byte_id[static_cast<uint8_t>(piece[i])];
  std::vector<int32_t> merged;
  while (word.size() > 1) {
    const Merge* best = nullptr;
    int32_t first = -1, second = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = merges.find(pair_key(word[i], word[i + 1]));
      if (it != merges.end() && (!best || it->second.rank < best->rank)) {
        best = &it->second;
        first = word[i];
        second = word[i + 1];
      }
    }
    if (!best) break;
    merged.clear();
    for (size_t i = 0; i < word.size(); ++i) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(best->id);
        ++i;
      } else {
        merged.push_back(word[i]);
      }
    }
    word.swap(merged);
  }
  return word;
}

void Gpt2Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id[static_cast<uint8_t>(piece[0])]);
    return;
  }
  std::string key(piece);
  {
    std::shared_lock lock(cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = bpe(piece);
  out.insert(out.end(), ids.begin(), ids.end());
  std::unique_lock lock(cache_mu);
  if (cache.size() >= kCacheLimit) cache.clear();
  cache.emplace(std::move(key), std::move(ids));
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocab_dir) : impl_(std::make_unique<Impl>()) {
  std::string dir = vocab_dir.empty() || vocab_dir.back() == '/' ? vocab_dir : vocab_dir + "/";
  impl_->load_encoder(dir + "encoder.json");
  impl_->load_merges(dir + "vocab.bpe");
}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

std::vector<std::string_view> Gpt2Tokenizer::split(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < text.size();) {
    size_t end = match_end(text, i);
    pieces.push_back(text.substr(i, end - i));
    i = end;
  }
  return pieces;
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (size_t i = 0; i < text.size();) {
    size_t end = match_end(text, i);
    impl_->encode_piece(text.substr(i, end - i), ids);
    i = end;
  }
  return ids;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      throw UsageError("gpt2 tokenizer: decode: id " + std::to_string(ids[i]) + " at position " +
                       std::to_string(i) + " is outside the vocabulary [0, " +
                       std::to_string(vocab_size()) + ")");
    }
    text += impl_->id_bytes[ids[i]];
  }
  return text;
}

int32_t Gpt2Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_bytes.size()); }

int32_t Gpt2Tokenizer::eot_id() const { return impl_->eot; }

}  // namespace nabla
