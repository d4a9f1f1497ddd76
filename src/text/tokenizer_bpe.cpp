// Byte-level BPE: vocabularies from GPT-2's files, Hugging Face's
// tokenizer.json or GGUF, added tokens, merges by rank, training, and
// tokenizer.json and GGUF out. SentencePiece-style BPE (Llama 2's pieces) from
// tokenizer.json (merges by rank) or GGUF (merges by score), and GGUF out.
//
// The files spell every token in GPT-2's byte-to-unicode alphabet (each byte a
// printable character, so ' ' is 'Ġ' and '\n' is 'Ċ'). Loading translates them
// back to bytes; after that the tokenizer works on raw bytes and token ids,
// and BPE merges pairs of ids. Added tokens are spelled as their text.
#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "nabla/error.h"
#include "nabla/gguf.h"
#include "nabla/io.h"
#include "nabla/tokenizer.h"
#include "text/unicode.h"

namespace nabla {

namespace {

using json = nlohmann::json;

// Hugging Face's spelling of the patterns in tokenizer.json.
constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
constexpr const char* kO200kRegex =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

// The byte a SentencePiece fallback piece "<0xXX>" stands for, or -1 for any
// other token (two hex digits exactly: sscanf's %X would take a sign).
int byte_piece(const std::string& token) {
  auto digit = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  const int high = digit(token[3]), low = digit(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

// "<0xXX>", the piece for byte `b`.
std::string byte_piece_text(int b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
}

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

// Bytes as their byte-alphabet characters, UTF-8 encoded.
std::string to_alphabet(std::string_view bytes) {
  static const std::array<uint32_t, 256> b2u = byte_to_unicode();
  std::string token;
  for (char c : bytes) {
    const uint32_t cp = b2u[static_cast<uint8_t>(c)];
    if (cp < 0x80) {
      token += static_cast<char>(cp);
    } else {  // every byte-alphabet character is below U+0800: two UTF-8 bytes
      token += static_cast<char>(0xC0 | (cp >> 6));
      token += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return token;
}

// A token in the byte alphabet back to bytes; false when a character is
// outside the alphabet.
bool from_alphabet(std::string_view token, std::string& bytes) {
  static const std::array<int32_t, 324> u2b = [] {
    std::array<int32_t, 324> t;
    t.fill(-1);
    const std::array<uint32_t, 256> b2u = byte_to_unicode();
    for (int b = 0; b < 256; ++b) t[b2u[b]] = b;
    return t;
  }();
  bytes.clear();
  for (size_t pos = 0; pos < token.size();) {
    size_t len;
    const uint32_t cp = text::decode_utf8(token, pos, len);
    if (cp == text::kInvalid || cp >= u2b.size() || u2b[cp] < 0) return false;
    bytes += static_cast<char>(u2b[cp]);
    pos += len;
  }
  return true;
}

std::string show(std::string_view s) {
  std::string out = "'";
  for (char c : s) out += (static_cast<uint8_t>(c) < 0x20) ? '?' : c;
  return out + "'";
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Lets a map keyed by std::string be searched with a string_view.
struct TextHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

struct BpeTokenizer::Impl {
  std::string name = "bpe";
  PreTokenizer pre = PreTokenizer::gpt2;
  bool ignore_merges = false;
  bool nfc = false;  // the text between added tokens is put in NFC first (Qwen2's normalizer)
  // SentencePiece's BPE as tokenizer.json holds it (Llama 2, Mistral): tokens
  // are text with U+2581 for a space, a piece starts as its characters, a
  // character the vocabulary lacks as its bytes' <0xXX> tokens (else <unk>).
  struct Pieces {
    bool on = false;
    // Where the space marker goes before a segment (the text between added
    // tokens): legacy, every segment (a Prepend normalizer, then spaces
    // replaced); first / always (Metaspace): after the replacing, unless
    // the segment starts with one, the text's first segment / every one.
    enum class Prepend { legacy, first, always, never } prepend = Prepend::legacy;
    bool split = false;  // Metaspace's split: a piece before every marker
    std::array<int32_t, 256> byte_token{};  // <0xXX>, or -1
    int32_t unk = -1;
    bool fuse_unk = false;
    // GGUF's "llama" vocabulary, as llama.cpp tokenizes it: a piece starts as
    // its characters, and adjacent symbols whose text is a token merge, the
    // highest-scoring first; a character that is no token falls back to its
    // bytes at the end. The merges are unused.
    bool scored = false;
    std::vector<float> score;                                                // [vocab]
    std::unordered_map<std::string, int32_t, TextHash, std::equal_to<>> texts;  // every token's text
  } pieces;
  std::vector<std::string> id_bytes;  // [vocab] each token's bytes ("" for unused ids)
  std::array<int32_t, 256> byte_id{};
  std::unordered_map<std::string, int32_t> bytes_id;  // model tokens by their bytes
  struct Merge {
    int32_t rank, id;
  };
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left, right) -> rank, merged id
  std::vector<std::pair<int32_t, int32_t>> merge_list;  // by rank, for writing
  struct Added {
    std::string text;
    int32_t id;
    bool special, lstrip, rstrip;
  };
  std::vector<Added> added;  // longest first
  std::array<std::vector<int32_t>, 256> added_by_first_byte;  // indices into `added`, longest first
  int32_t eot = -1;
  std::vector<int32_t> prefix;  // prefix_ids()

  // Pieces already encoded. Python's encoder keeps every piece; this one
  // starts over when it holds kCacheLimit, which bounds memory on large corpora.
  static constexpr size_t kCacheLimit = 1 << 18;
  mutable std::shared_mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // Sets a model token; `where` names the source in errors.
  void set_token(int32_t id, std::string bytes, const std::string& where);
  void add_merge(int32_t a, int32_t b, const std::string& where);
  // The merge of two tokens written in GPT-2's byte alphabet (every reader's
  // form); IoError `where`: TOKEN `missing` for one the vocabulary lacks.
  void add_merge(std::string_view left, std::string_view right, const std::string& where, const char* missing);
  void add_token(Added a);
  void finish(const std::string& where);  // checks every byte has a token
  std::vector<int32_t> bpe(std::string_view piece) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // `text` is the whole input's first segment (SentencePiece's prepending).
  void encode_text(std::string_view text, std::vector<int32_t>& out, bool first = true) const;
  void encode_pieces(std::string_view text, bool first, std::vector<int32_t>& out) const;
};

namespace {

constexpr std::string_view kSpaceMarker = "\xe2\x96\x81";  // U+2581, SentencePiece's space

// Hugging Face's BPE merge order: the adjacent pair of lowest rank first,
// the leftmost of equal ranks, until no adjacent pair has a rank; a heap of
// candidate pairs over a linked list of symbols, so a long piece (a whole
// segment, as SentencePiece's tokenizers have no pre-tokenizer) costs
// n log n.
std::vector<int32_t> merge_symbols(std::vector<int32_t> word,
                                   const std::unordered_map<uint64_t, BpeTokenizer::Impl::Merge>& merges);
// llama.cpp's SentencePiece merging of `part` (see Pieces::scored), its ids
// appended to `out`.
void merge_by_score(std::string_view part, const BpeTokenizer::Impl::Pieces& pieces, std::vector<int32_t>& out);

}  // namespace

void BpeTokenizer::Impl::set_token(int32_t id, std::string bytes, const std::string& where) {
  if (id < 0 || id >= (1 << 24)) throw IoError(where + ": token id " + std::to_string(id) + " is out of range");
  if (size_t(id) >= id_bytes.size()) id_bytes.resize(size_t(id) + 1);
  if (!bytes_id.emplace(bytes, id).second) {
    throw IoError(where + ": token " + show(to_alphabet(bytes)) + " appears twice");
  }
  if (bytes.size() == 1) byte_id[static_cast<uint8_t>(bytes[0])] = id;
  id_bytes[size_t(id)] = std::move(bytes);
}

void BpeTokenizer::Impl::add_merge(int32_t a, int32_t b, const std::string& where) {
  auto it = bytes_id.find(id_bytes[size_t(a)] + id_bytes[size_t(b)]);
  if (it == bytes_id.end()) {
    throw IoError(where + ": the merge " + show(to_alphabet(id_bytes[size_t(a)])) + " + " +
                  show(to_alphabet(id_bytes[size_t(b)])) + " makes a token the vocabulary lacks");
  }
  if (!merges.emplace(pair_key(a, b), Merge{int32_t(merge_list.size()), it->second}).second) {
    throw IoError(where + ": the merge " + show(to_alphabet(id_bytes[size_t(a)])) + " " +
                  show(to_alphabet(id_bytes[size_t(b)])) + " appears twice");
  }
  merge_list.emplace_back(a, b);
}

void BpeTokenizer::Impl::add_merge(std::string_view left, std::string_view right, const std::string& where,
                                   const char* missing) {
  int32_t ids[2];
  std::string bytes;
  for (int side = 0; side < 2; ++side) {
    const std::string_view token = side == 0 ? left : right;
    if (pieces.on) bytes = token;
    auto it = pieces.on || from_alphabet(token, bytes) ? bytes_id.find(bytes) : bytes_id.end();
    if (it == bytes_id.end()) throw IoError(where + ": " + show(token) + missing);
    ids[side] = it->second;
  }
  add_merge(ids[0], ids[1], where);
}

void BpeTokenizer::Impl::add_token(Added a) {
  if (size_t(a.id) >= id_bytes.size()) id_bytes.resize(size_t(a.id) + 1);
  id_bytes[size_t(a.id)] = a.text;
  if (a.text == "<|endoftext|>" || a.text == "<|end_of_text|>" || a.text == "</s>") eot = a.id;
  added.push_back(std::move(a));
  std::stable_sort(added.begin(), added.end(), [](const Added& x, const Added& y) { return x.text.size() > y.text.size(); });
  for (auto& bucket : added_by_first_byte) bucket.clear();
  for (size_t k = 0; k < added.size(); ++k) added_by_first_byte[static_cast<uint8_t>(added[k].text[0])].push_back(int32_t(k));
}

void BpeTokenizer::Impl::finish(const std::string& where) {
  for (int b = 0; b < 256; ++b) {
    if (byte_id[b] < 0) throw IoError(where + ": no token for byte " + std::to_string(b) + " (every byte needs one)");
  }
}

// GPT-2's bpe(): repeatedly merge the adjacent pair of lowest rank, every
// occurrence left to right, until no adjacent pair has a rank.
std::vector<int32_t> BpeTokenizer::Impl::bpe(std::string_view piece) const {
  if (ignore_merges) {  // Llama 3: a piece that is a token stays whole
    auto it = bytes_id.find(std::string(piece));
    if (it != bytes_id.end()) return {it->second};
  }
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

void BpeTokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
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

void BpeTokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out, bool first) const {
  const std::string normalized = nfc ? text::nfc(text) : std::string();
  const std::string_view input = nfc ? std::string_view(normalized) : text;
  if (pieces.on) return encode_pieces(input, first, out);
  for (std::string_view piece : pre_tokenize(input, pre)) encode_piece(piece, out);
}

namespace {

std::vector<int32_t> merge_symbols(std::vector<int32_t> word,
                                   const std::unordered_map<uint64_t, BpeTokenizer::Impl::Merge>& merges) {
  const size_t n = word.size();
  if (n < 2) return word;
  std::vector<size_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? SIZE_MAX : i - 1;
    next[i] = i + 1 < n ? i + 1 : SIZE_MAX;
  }
  struct Candidate {
    int32_t rank;
    size_t left;
    int32_t a, b;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto offer = [&](size_t left) {
    if (left == SIZE_MAX || next[left] == SIZE_MAX) return;
    auto it = merges.find(pair_key(word[left], word[next[left]]));
    if (it != merges.end()) heap.push({it->second.rank, left, word[left], word[next[left]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) offer(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Stale: the left symbol merged away, or its neighbour changed since.
    if (!alive[c.left] || word[c.left] != c.a || next[c.left] == SIZE_MAX || word[next[c.left]] != c.b) continue;
    const size_t right = next[c.left];
    word[c.left] = merges.at(pair_key(c.a, c.b)).id;
    alive[right] = false;
    next[c.left] = next[right];
    if (next[right] != SIZE_MAX) prev[next[right]] = c.left;
    offer(prev[c.left]);
    offer(c.left);
  }
  std::vector<int32_t> out;
  for (size_t i = 0; i != SIZE_MAX; i = next[i]) out.push_back(word[i]);
  return out;
}

void merge_by_score(std::string_view part, const BpeTokenizer::Impl::Pieces& pieces, std::vector<int32_t>& out) {
  struct Symbol {
    size_t start, size;  // size 0: merged into the symbol before it
    int64_t prev, next;  // -1: none
  };
  std::vector<Symbol> symbols;
  // A character is as many bytes as its first byte says (llama.cpp's
  // reading, malformed UTF-8 included), cut short at the end.
  static constexpr uint8_t kLength[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  for (size_t pos = 0; pos < part.size();) {
    const size_t size = std::min<size_t>(kLength[static_cast<uint8_t>(part[pos]) >> 4], part.size() - pos);
    const int64_t i = int64_t(symbols.size());
    symbols.push_back({pos, size, i - 1, pos + size < part.size() ? i + 1 : -1});
    pos += size;
  }
  struct Candidate {
    float score;
    int64_t left, right;
    size_t size;  // the pair's bytes when offered: stale once either side has changed
  };
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> queue(worse);
  auto offer = [&](int64_t left, int64_t right) {
    if (left < 0 || right < 0) return;
    const size_t size = symbols[size_t(left)].size + symbols[size_t(right)].size;
    auto it = pieces.texts.find(part.substr(symbols[size_t(left)].start, size));
    if (it != pieces.texts.end()) queue.push({pieces.score[size_t(it->second)], left, right, size});
  };
  for (int64_t i = 1; i < int64_t(symbols.size()); ++i) offer(i - 1, i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol &left = symbols[size_t(c.left)], &right = symbols[size_t(c.right)];
    if (left.size == 0 || right.size == 0 || left.size + right.size != c.size) continue;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = c.left;
    offer(left.prev, c.left);
    offer(c.left, left.next);
  }
  for (int64_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[size_t(i)].next) {
    const Symbol& s = symbols[size_t(i)];
    auto it = pieces.texts.find(part.substr(s.start, s.size));
    if (it != pieces.texts.end()) {
      out.push_back(it->second);
      continue;
    }
    for (size_t k = 0; k < s.size; ++k) {
      const int32_t byte = pieces.byte_token[static_cast<uint8_t>(part[s.start + k])];
      out.push_back(byte >= 0 ? byte : pieces.unk);
    }
  }
}

}  // namespace

void BpeTokenizer::Impl::encode_pieces(std::string_view text, bool first, std::vector<int32_t>& out) const {
  using Prepend = Pieces::Prepend;
  if (text.empty()) return;
  std::string s;
  s.reserve(text.size() + 8);
  if (pieces.prepend == Prepend::legacy) s += kSpaceMarker;
  for (char c : text) {
    if (c == ' ') s += kSpaceMarker;
    else s += c;
  }
  if ((pieces.prepend == Prepend::always || (pieces.prepend == Prepend::first && first)) && !s.starts_with(kSpaceMarker)) {
    s.insert(0, kSpaceMarker);
  }
  // The pieces: the whole, or (split) each marker with what follows it.
  std::vector<std::string_view> parts;
  const std::string_view all(s);
  if (!pieces.split) {
    parts.push_back(all);
  } else {
    size_t start = 0;
    for (size_t at = all.find(kSpaceMarker, 1); at != std::string_view::npos; at = all.find(kSpaceMarker, at + 1)) {
      parts.push_back(all.substr(start, at - start));
      start = at;
    }
    parts.push_back(all.substr(start));
  }
  std::vector<int32_t> word;
  for (std::string_view part : parts) {
    if (pieces.scored) {
      merge_by_score(part, pieces, out);
      continue;
    }
    word.clear();
    bool unk_open = false;  // the last symbol is an <unk> that fuse_unk extends
    for (size_t pos = 0, len = 0; pos < part.size(); pos += len) {
      text::decode_utf8(part, pos, len);
      auto it = bytes_id.find(std::string(part.substr(pos, len)));
      if (it != bytes_id.end()) {
        word.push_back(it->second);
        unk_open = false;
        continue;
      }
      bool fallback = true;
      for (size_t k = 0; k < len; ++k) fallback = fallback && pieces.byte_token[static_cast<uint8_t>(part[pos + k])] >= 0;
      if (fallback) {
        for (size_t k = 0; k < len; ++k) word.push_back(pieces.byte_token[static_cast<uint8_t>(part[pos + k])]);
        unk_open = false;
      } else if (!(unk_open && pieces.fuse_unk)) {
        word.push_back(pieces.unk);
        unk_open = true;
      }
    }
    for (int32_t id : merge_symbols(std::move(word), merges)) out.push_back(id);
    word = {};
  }
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  if (impl_->added.empty()) {
    impl_->encode_text(text, ids);
    return ids;
  }
  // Added tokens first, leftmost-longest (each bucket is longest first); the
  // text between them goes through the pre-tokenizer and the merges.
  size_t from = 0, i = 0;
  while (i < text.size()) {
    const Impl::Added* hit = nullptr;
    for (int32_t k : impl_->added_by_first_byte[static_cast<uint8_t>(text[i])]) {
      const Impl::Added& a = impl_->added[size_t(k)];
      if (text.compare(i, a.text.size(), a.text) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t before = i, after = i + hit->text.size();
    if (hit->lstrip) {
      while (before > from && is_space(text[before - 1])) --before;
    }
    if (hit->rstrip) {
      while (after < text.size() && is_space(text[after])) ++after;
    }
    impl_->encode_text(text.substr(from, before - from), ids, from == 0);
    ids.push_back(hit->id);
    from = i = after;
  }
  impl_->encode_text(text.substr(from), ids, from == 0);
  return ids;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      throw UsageError(impl_->name + " tokenizer: decode: id " + std::to_string(ids[i]) + " at position " +
                       std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
    }
    text += impl_->id_bytes[size_t(ids[i])];
  }
  if (!impl_->pieces.on) return text;
  // SentencePiece's pieces: <0xXX> tokens are their bytes (id_bytes holds
  // them so), markers are spaces, and the marker put before the text goes.
  std::string spaced;
  for (size_t at = 0; at < text.size();) {
    if (text.compare(at, kSpaceMarker.size(), kSpaceMarker) == 0) {
      spaced += ' ';
      at += kSpaceMarker.size();
    } else {
      spaced += text[at++];
    }
  }
  if (impl_->pieces.prepend != Impl::Pieces::Prepend::never && spaced.starts_with(' ')) spaced.erase(0, 1);
  return spaced;
}

int32_t BpeTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_bytes.size()); }
std::string BpeTokenizer::name() const { return impl_->name; }
int32_t BpeTokenizer::eot_id() const { return impl_->eot; }
std::vector<int32_t> BpeTokenizer::prefix_ids() const { return impl_->prefix; }
PreTokenizer BpeTokenizer::pre_tokenizer() const { return impl_->pre; }

// ---- tokenizer.json

namespace {

// tokenizer.json's optional fields. nlohmann's value() throws its own
// type_error for a field of another type; these name the field instead. A
// null field is absent (Hugging Face writes Option::None as null).
bool has_type(const json& j, const char* type) { return j.is_object() && j.contains("type") && j["type"] == type; }

template <class T>
T optional_field(const json& j, const char* key, T fallback, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  constexpr bool is_bool = std::is_same_v<T, bool>;
  if (is_bool ? !v.is_boolean() : !v.is_string()) {
    throw IoError(where + "." + key + " is " + v.dump().substr(0, 100) + ", expected " +
                  (is_bool ? "true or false" : "a string"));
  }
  return v.get<T>();
}

// SentencePiece's legacy spacing as Hugging Face's converter writes it: U+2581
// before the text, then every space replaced by it.
json legacy_normalizer() {
  const std::string marker(kSpaceMarker);
  return {{"type", "Sequence"},
          {"normalizers",
           {{{"type", "Prepend"}, {"prepend", marker}},
            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", marker}}}}};
}

// Gemma's spacing (transformers' GemmaConverter): every space replaced by
// U+2581, nothing prepended; its pre-tokenizer splits at spaces, of which
// the normalizer left none.
json replace_normalizer() {
  return {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", std::string(kSpaceMarker)}};
}
json gemma_pre_tokenizer() {
  return {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}};
}

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json pre_tokenizer_json(PreTokenizer p) {
  auto split = [](const char* regex) {
    return json{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
  };
  switch (p) {
    case PreTokenizer::gpt2:
      return byte_level(true);
    case PreTokenizer::llama3:
      return {{"type", "Sequence"}, {"pretokenizers", {split(kLlama3Regex), byte_level(false)}}};
    case PreTokenizer::qwen2:
      return {{"type", "Sequence"}, {"pretokenizers", {split(kQwen2Regex), byte_level(false)}}};
    case PreTokenizer::o200k:
      return {{"type", "Sequence"}, {"pretokenizers", {split(kO200kRegex), byte_level(false)}}};
    case PreTokenizer::digits:
      return {{"type", "Sequence"},
              {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}};
  }
  return nullptr;
}

// The pattern a tokenizer.json pre_tokenizer describes, or an IoError
// naming what nabla does not implement.
PreTokenizer parse_pre_tokenizer_json(const json& j, const std::string& path) {
  auto fail = [&](const std::string& what) {
    return IoError(path + ": pre_tokenizer " + what + " is not supported (nabla reads ByteLevel; Split of Llama 3's, "
                   "Qwen2's or o200k's pattern, then ByteLevel; Digits, then ByteLevel)");
  };
  const std::string where = path + ": pre_tokenizer";
  auto is_byte_level = [&](const json& b, bool use_regex) {
    return has_type(b, "ByteLevel") && !optional_field(b, "add_prefix_space", false, where) &&
           optional_field(b, "use_regex", true, where) == use_regex;
  };
  if (is_byte_level(j, true)) return PreTokenizer::gpt2;
  if (has_type(j, "Sequence") && j.contains("pretokenizers") && j["pretokenizers"].is_array() &&
      j["pretokenizers"].size() == 2) {
    const json &first = j["pretokenizers"][0], &second = j["pretokenizers"][1];
    if (has_type(first, "Split") && is_byte_level(second, false) &&
        optional_field<std::string>(first, "behavior", "", where) == "Isolated" &&
        !optional_field(first, "invert", false, where) && first.contains("pattern") && first["pattern"].is_object() &&
        first["pattern"].contains("Regex") && first["pattern"]["Regex"].is_string()) {
      const std::string regex = first["pattern"]["Regex"].get<std::string>();
      if (regex == kLlama3Regex) return PreTokenizer::llama3;
      if (regex == kQwen2Regex) return PreTokenizer::qwen2;
      if (regex == kO200kRegex) return PreTokenizer::o200k;
      throw fail("Split with the pattern " + json(regex).dump());
    }
    if (has_type(first, "Digits") && optional_field(first, "individual_digits", false, where) &&
        is_byte_level(second, true)) {
      return PreTokenizer::digits;
    }
  }
  throw fail(j.dump().substr(0, 200));
}

// The ids a TemplateProcessing post-processor (alone, or in a Sequence)
// puts before a single text: its special tokens before the first Sequence
// item. Those after the text (an EOS suffix) are not kept: generation
// continues the text. Other post-processors (ByteLevel) add nothing.
std::vector<int32_t> template_prefix(const json& post, int64_t tokens, const std::string& path) {
  const json* t = nullptr;
  if (has_type(post, "TemplateProcessing")) t = &post;
  if (has_type(post, "Sequence") && post.contains("processors") && post["processors"].is_array()) {
    for (const json& p : post["processors"]) {
      if (has_type(p, "TemplateProcessing")) t = &p;
    }
  }
  if (!t) return {};
  auto fail = [&](const std::string& what) { return IoError(path + ": post_processor TemplateProcessing: " + what); };
  const json single = t->value("single", json());
  const json specials = t->value("special_tokens", json::object());
  if (!single.is_array() || !specials.is_object()) throw fail("needs a \"single\" array and a \"special_tokens\" object");
  std::vector<int32_t> prefix;
  for (const json& item : single) {
    if (!item.is_object() || item.contains("Sequence")) break;
    const json name = item.contains("SpecialToken") && item["SpecialToken"].is_object()
                          ? item["SpecialToken"].value("id", json())
                          : json();
    if (!name.is_string()) throw fail("single item " + item.dump().substr(0, 100) + " is neither SpecialToken nor Sequence");
    const json entry = specials.value(name.get<std::string>(), json());
    const json ids = entry.is_object() ? entry.value("ids", json()) : json();
    if (!ids.is_array()) throw fail("special_tokens has no ids for " + name.dump());
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tokens) {
        throw fail(name.dump() + " has id " + id.dump() + ", expected one in [0, " + std::to_string(tokens) + ")");
      }
      prefix.push_back(id.get<int32_t>());
    }
  }
  return prefix;
}

}  // namespace

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_json(const std::string& path) {
  json j = json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw IoError(path + ": not a JSON object (expected Hugging Face's tokenizer.json)");
  auto fail = [&](const std::string& what) { return IoError(path + ": " + what); };
  const json model = j.value("model", json());
  if (!has_type(model, "BPE")) {
    throw fail("model.type must be \"BPE\" (byte-level BPE), got " + (model.is_object() ? model.value("type", json()).dump() : model.dump()));
  }
  // SentencePiece's BPE (Llama 2, Mistral, Gemma): a legacy Prepend +
  // Replace normalizer, a Metaspace pre-tokenizer, or Gemma's Replace alone;
  // byte-level BPE otherwise.
  const std::string marker(kSpaceMarker);
  const json legacy = legacy_normalizer();
  const json normalizer = j.value("normalizer", json()), pre_tokenizer = j.value("pre_tokenizer", json());
  const bool metaspace = has_type(pre_tokenizer, "Metaspace"), gemma = normalizer == replace_normalizer();
  auto impl = std::make_unique<Impl>();
  Impl::Pieces& pieces = impl->pieces;
  pieces.on = normalizer == legacy || metaspace || gemma;
  if (!normalizer.is_null() && normalizer != json{{"type", "NFC"}} && normalizer != legacy && !gemma) {
    throw fail("normalizer " + normalizer.dump().substr(0, 100) +
               " is not supported (nabla reads NFC, SentencePiece's Prepend + Replace, Gemma's Replace, or none)");
  }
  impl->nfc = normalizer == json{{"type", "NFC"}};
  impl->byte_id.fill(-1);
  pieces.byte_token.fill(-1);
  if (!pieces.on) {
    impl->pre = parse_pre_tokenizer_json(pre_tokenizer, path);
  } else if (metaspace) {
    using Prepend = Impl::Pieces::Prepend;
    const std::string where = path + ": pre_tokenizer";
    const std::string scheme = optional_field<std::string>(
        pre_tokenizer, "prepend_scheme", optional_field(pre_tokenizer, "add_prefix_space", true, where) ? "always" : "never", where);
    if (optional_field(pre_tokenizer, "replacement", marker, where) != marker ||
        (scheme != "first" && scheme != "always" && scheme != "never")) {
      throw fail("pre_tokenizer " + pre_tokenizer.dump().substr(0, 100) + " is not supported (Metaspace with U+2581, "
                 "prepend_scheme first, always or never)");
    }
    pieces.prepend = scheme == "first" ? Prepend::first : scheme == "always" ? Prepend::always : Prepend::never;
    pieces.split = optional_field(pre_tokenizer, "split", true, where);
  } else if (gemma) {
    if (!pre_tokenizer.is_null() && pre_tokenizer != gemma_pre_tokenizer()) {
      throw fail("pre_tokenizer " + pre_tokenizer.dump().substr(0, 100) +
                 " is not supported after Gemma's normalizer (none, or Split at spaces MergedWithPrevious)");
    }
    pieces.prepend = Impl::Pieces::Prepend::never;
  } else if (!pre_tokenizer.is_null()) {
    throw fail("pre_tokenizer " + pre_tokenizer.dump().substr(0, 100) + " is not supported after SentencePiece's normalizer");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json v = model.value(key, json());
    if (!v.is_null() && v != "") throw fail("model." + std::string(key) + " " + v.dump() + " is not supported");
  }
  const std::string in_model = path + ": model";
  if (optional_field(model, "byte_fallback", false, in_model) && !pieces.on) {
    throw fail("model.byte_fallback is not supported (byte-level BPE has every byte)");
  }
  pieces.fuse_unk = optional_field(model, "fuse_unk", false, in_model);
  if (!model.value("dropout", json()).is_null()) throw fail("model.dropout is not supported");
  impl->ignore_merges = optional_field(model, "ignore_merges", false, in_model);

  const json vocab = model.value("vocab", json());
  if (!vocab.is_object() || vocab.empty()) throw fail("model.vocab must be an object {token: id}");
  const json added = j.value("added_tokens", json::array());
  if (!added.is_array()) throw fail("added_tokens must be an array");
  // Ids are dense: none beyond the number of tokens listed.
  const int64_t tokens = int64_t(vocab.size() + added.size());
  std::string bytes;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tokens) {
      throw fail("model.vocab[" + show(token) + "] is " + id.dump() + ", expected an id in [0, " +
                 std::to_string(tokens) + ")");
    }
    if (pieces.on) {
      // <0xXX>: byte XX where a character is not a token (decoded as it).
      int byte = byte_piece(token);
      if (byte >= 0) {
        if (size_t(id.get<int64_t>()) >= impl->id_bytes.size()) impl->id_bytes.resize(size_t(id.get<int64_t>()) + 1);
        impl->id_bytes[size_t(id.get<int64_t>())] = std::string(1, char(byte));
        pieces.byte_token[byte] = id.get<int32_t>();
        continue;
      }
      impl->set_token(id.get<int32_t>(), token, path + ": model.vocab");
      continue;
    }
    if (!from_alphabet(token, bytes)) {
      throw fail("model.vocab token " + show(token) + " has a character outside GPT-2's byte alphabet (not byte-level BPE)");
    }
    impl->set_token(id.get<int32_t>(), bytes, path + ": model.vocab");
  }
  if (pieces.on) {
    const json unk = model.value("unk_token", json());
    if (unk.is_string()) {
      auto it = vocab.find(unk.get<std::string>());
      if (it == vocab.end()) throw fail("model.unk_token " + unk.dump() + " is not in model.vocab");
      pieces.unk = it->get<int32_t>();
    }
    // A character with neither a token nor bytes to fall back on.
    if (pieces.unk < 0 && std::any_of(pieces.byte_token.begin(), pieces.byte_token.end(), [](int32_t t) { return t < 0; })) {
      throw fail("model.unk_token is missing and not every byte has a <0xXX> token");
    }
  } else {
    impl->finish(path);
  }
  const json merges = model.value("merges", json());
  if (!merges.is_array()) throw fail("model.merges must be an array");
  for (size_t k = 0; k < merges.size(); ++k) {
    const json& m = merges[k];
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        throw fail("model.merges[" + std::to_string(k) + "] is " + m.dump() + ", expected \"left right\"");
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      throw fail("model.merges[" + std::to_string(k) + "] is " + m.dump() + ", expected \"left right\" or [left, right]");
    }
    impl->add_merge(left, right, path + ": model.merges[" + std::to_string(k) + "]", " is not in model.vocab");
  }
  for (const json& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string() || a["content"].get<std::string>().empty()) {
      throw fail("added_tokens entry " + a.dump().substr(0, 100) + " needs an integer id and a non-empty content");
    }
    const std::string in_added = path + ": added token " + a["content"].dump();
    if (optional_field(a, "single_word", false, in_added)) throw fail("added token " + a["content"].dump() + ": single_word is not supported");
    const int64_t id = a["id"].get<int64_t>();
    const std::string content = a["content"].get<std::string>();
    if (id < 0 || id >= tokens) {
      throw fail("added token " + a["content"].dump() + " has id " + std::to_string(id) + ", expected one in [0, " +
                 std::to_string(tokens) + ")");
    }
    if (size_t(id) < impl->id_bytes.size() && !impl->id_bytes[size_t(id)].empty() && impl->id_bytes[size_t(id)] != content) {
      throw fail("added token " + a["content"].dump() + " has id " + std::to_string(id) + ", which model.vocab gives to " +
                 show(to_alphabet(impl->id_bytes[size_t(id)])));
    }
    impl->add_token({content, int32_t(id), optional_field(a, "special", false, in_added),
                     optional_field(a, "lstrip", false, in_added), optional_field(a, "rstrip", false, in_added)});
  }
  impl->prefix = template_prefix(j.value("post_processor", json()), tokens, path);
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

namespace {

// added_tokens, by id.
json added_json(const BpeTokenizer::Impl& m) {
  std::vector<BpeTokenizer::Impl::Added> by_id = m.added;
  // GPT-2's files keep <|endoftext|> in the vocabulary only; Hugging Face's
  // GPT-2 tokenizer.json also lists it as a special added token.
  if (m.eot >= 0 && std::none_of(by_id.begin(), by_id.end(), [&](const auto& a) { return a.id == m.eot; })) {
    by_id.push_back({m.id_bytes[size_t(m.eot)], m.eot, true, false, false});
  }
  std::sort(by_id.begin(), by_id.end(), [](const auto& x, const auto& y) { return x.id < y.id; });
  json added = json::array();
  for (const BpeTokenizer::Impl::Added& a : by_id) {
    added.push_back({{"id", a.id}, {"content", a.text}, {"single_word", false}, {"lstrip", a.lstrip},
                     {"rstrip", a.rstrip}, {"normalized", false}, {"special", a.special}});
  }
  return added;
}

// The prefix as a TemplateProcessing post-processor; null without one.
json prefix_template(const BpeTokenizer::Impl& m) {
  if (m.prefix.empty()) return nullptr;
  json single = json::array(), pair = json::array(), specials = json::object();
  for (int32_t id : m.prefix) {
    const std::string name = m.id_bytes[size_t(id)];
    single.push_back({{"SpecialToken", {{"id", name}, {"type_id", 0}}}});
    specials[name] = {{"id", name}, {"ids", {id}}, {"tokens", {name}}};
  }
  pair = single;
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  pair.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  for (int32_t id : m.prefix) pair.push_back({{"SpecialToken", {{"id", m.id_bytes[size_t(id)]}, {"type_id", 1}}}});
  pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
}

json bpe_model(const BpeTokenizer::Impl& m, json vocab, json merges) {
  const bool pieces = m.pieces.on;
  const int32_t unk = pieces ? m.pieces.unk : -1;
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", unk >= 0 ? json(m.id_bytes[size_t(unk)]) : json(nullptr)},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", pieces && m.pieces.fuse_unk},
          {"byte_fallback", pieces},
          {"ignore_merges", m.ignore_merges},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

// A SentencePiece-style tokenizer as Hugging Face's LlamaConverter writes
// one. Read from tokenizer.json, its merges as read; from GGUF, every split
// of a token into two tokens is a merge, by the token's score (then id), as
// the converter orders a SentencePiece model's, so Hugging Face's rank
// order follows llama.cpp's score order.
json pieces_json(const BpeTokenizer::Impl& m) {
  using Prepend = BpeTokenizer::Impl::Pieces::Prepend;
  const std::string marker(kSpaceMarker);
  json vocab = json::object(), merges = json::array();
  if (!m.pieces.scored) {
    for (const auto& [text, id] : m.bytes_id) vocab[text] = id;
    for (int b = 0; b < 256; ++b) {
      if (m.pieces.byte_token[size_t(b)] >= 0) vocab[byte_piece_text(b)] = m.pieces.byte_token[size_t(b)];
    }
    for (const auto& [a, b] : m.merge_list) merges.push_back({m.id_bytes[size_t(a)], m.id_bytes[size_t(b)]});
  } else {
    struct Split {
      int32_t token, left, right;
    };
    std::vector<Split> splits;
    std::vector<std::string> text_of(m.id_bytes.size());
    for (const auto& [text, id] : m.pieces.texts) {
      vocab[text] = id;
      text_of[size_t(id)] = text;
      for (size_t at = 1; at < text.size(); ++at) {
        if ((static_cast<uint8_t>(text[at]) & 0xC0) == 0x80) continue;  // inside a character
        auto left = m.pieces.texts.find(std::string_view(text).substr(0, at));
        auto right = m.pieces.texts.find(std::string_view(text).substr(at));
        if (left != m.pieces.texts.end() && right != m.pieces.texts.end()) splits.push_back({id, left->second, right->second});
      }
    }
    const std::vector<float>& score = m.pieces.score;
    std::sort(splits.begin(), splits.end(), [&](const Split& x, const Split& y) {
      if (score[size_t(x.token)] != score[size_t(y.token)]) return score[size_t(x.token)] > score[size_t(y.token)];
      return std::tie(x.token, x.left, x.right) < std::tie(y.token, y.left, y.right);
    });
    for (const Split& sp : splits) merges.push_back({text_of[size_t(sp.left)], text_of[size_t(sp.right)]});
  }
  const json legacy = legacy_normalizer();
  const Prepend prepend = m.pieces.prepend;
  const char* scheme = prepend == Prepend::first ? "first" : prepend == Prepend::always ? "always" : "never";
  json decoders = {{{"type", "Replace"}, {"pattern", {{"String", marker}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  if (prepend != Prepend::never) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added_json(m)},
          {"normalizer", prepend == Prepend::legacy ? legacy : json(nullptr)},
          {"pre_tokenizer", prepend == Prepend::legacy ? json(nullptr)
                                                       : json{{"type", "Metaspace"},
                                                              {"replacement", marker},
                                                              {"prepend_scheme", scheme},
                                                              {"split", m.pieces.split}}},
          {"post_processor", prefix_template(m)},
          {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
          {"model", bpe_model(m, std::move(vocab), std::move(merges))}};
}

}  // namespace

void BpeTokenizer::save_json(const std::string& path) const {
  const Impl& m = *impl_;
  if (m.pieces.on) {
    write_file_atomic(path, pieces_json(m).dump(1) + "\n");
    return;
  }
  json vocab = json::object(), merges = json::array();
  for (const auto& [bytes, id] : m.bytes_id) vocab[to_alphabet(bytes)] = id;
  for (const auto& [a, b] : m.merge_list) {
    merges.push_back({to_alphabet(m.id_bytes[size_t(a)]), to_alphabet(m.id_bytes[size_t(b)])});
  }
  // A prefix as TemplateProcessing after ByteLevel, as Llama 3's is written.
  json post_processor = byte_level(false);
  if (!m.prefix.empty()) post_processor = {{"type", "Sequence"}, {"processors", {post_processor, prefix_template(m)}}};
  const json j = {{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", added_json(m)},
                  {"normalizer", m.nfc ? json{{"type", "NFC"}} : json(nullptr)},
                  {"pre_tokenizer", pre_tokenizer_json(m.pre)},
                  {"post_processor", post_processor},
                  {"decoder", byte_level(true)},
                  {"model", bpe_model(m, std::move(vocab), std::move(merges))}};
  write_file_atomic(path, j.dump(1) + "\n");
}

// ---- GGUF's tokenizer.ggml.*

namespace {

constexpr int32_t kGgufNormal = 1, kGgufUnknown = 2, kGgufControl = 3, kGgufUserDefined = 4, kGgufUnused = 5,
                  kGgufByte = 6;

// llama.cpp's pre-tokenizer names (llama-vocab.cpp) for nabla's patterns;
// the first of each is the one written.
struct GgufPre {
  const char* name;
  PreTokenizer pre;
};
constexpr GgufPre kGgufPres[] = {{"gpt-2", PreTokenizer::gpt2},     {"llama-bpe", PreTokenizer::llama3},
                                 {"llama3", PreTokenizer::llama3},  {"llama-v3", PreTokenizer::llama3},
                                 {"qwen2", PreTokenizer::qwen2},    {"smollm", PreTokenizer::digits},
                                 {"gpt-4o", PreTokenizer::o200k}};

// An array of strings or of integers under `key`, IoError naming it otherwise.
std::vector<std::string> gguf_strings(const GgufFile& f, const std::string& key, const std::string& path) {
  const GgufValue* v = f.find_value(key);
  if (!v) throw IoError(path + ": no " + key + " (a GGUF model without a tokenizer)");
  const GgufArray* a = std::get_if<GgufArray>(&v->value);
  if (!a || a->type != GgufType::string) throw IoError(path + ": " + key + " must be an array of strings");
  std::vector<std::string> out;
  out.reserve(a->items.size());
  for (const GgufValue& x : a->items) out.push_back(x.get<std::string>());
  return out;
}

}  // namespace

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_gguf(const std::string& path) {
  const GgufFile f = read_gguf_metadata(path);
  const GgufValue* model = f.find_value("tokenizer.ggml.model");
  if (!model || model->type() != GgufType::string) throw IoError(path + ": no tokenizer.ggml.model string");
  GgufVocabulary v;
  v.model = model->get<std::string>();
  if (v.model != "gpt2" && v.model != "llama") {
    throw IoError(path + ": tokenizer.ggml.model is \"" + v.model +
                  "\"; nabla reads \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece-style BPE)");
  }
  if (v.model == "gpt2") {
    const GgufValue* pre = f.find_value("tokenizer.ggml.pre");
    if (!pre || pre->type() != GgufType::string) {
      throw IoError(path + ": no tokenizer.ggml.pre string (llama.cpp's default pattern is not one nabla implements)");
    }
    v.pre = pre->get<std::string>();
    if (f.find_value("tokenizer.ggml.merges")) v.merges = gguf_strings(f, "tokenizer.ggml.merges", path);
  }
  v.tokens = gguf_strings(f, "tokenizer.ggml.tokens", path);
  if (const GgufValue* t = f.find_value("tokenizer.ggml.token_type")) {
    const GgufArray* a = std::get_if<GgufArray>(&t->value);
    if (!a || a->type != GgufType::i32) throw IoError(path + ": tokenizer.ggml.token_type must be an array of i32");
    for (const GgufValue& x : a->items) v.types.push_back(x.get<int32_t>());
  }
  if (const GgufValue* t = f.find_value("tokenizer.ggml.scores"); t && v.model == "llama") {
    const GgufArray* a = std::get_if<GgufArray>(&t->value);
    if (!a || a->type != GgufType::f32) throw IoError(path + ": tokenizer.ggml.scores must be an array of f32");
    for (const GgufValue& x : a->items) v.scores.push_back(x.get<float>());
  }
  // EOT where the file names one, else EOS (Llama 2's files name only EOS).
  int32_t eos = -1;
  for (auto [key, id] : {std::pair{"tokenizer.ggml.eot_token_id", &v.eot}, std::pair{"tokenizer.ggml.eos_token_id", &eos},
                         std::pair{"tokenizer.ggml.bos_token_id", &v.bos},
                         std::pair{"tokenizer.ggml.unknown_token_id", &v.unk}}) {
    if (const GgufValue* e = f.find_value(key)) {
      if (e->type() != GgufType::u32) throw IoError(path + ": " + key + " must be u32");
      *id = int32_t(std::min<uint32_t>(e->get<uint32_t>(), uint32_t(INT32_MAX)));
    }
  }
  if (v.eot < 0) v.eot = eos;
  for (auto [key, flag] : {std::pair{"tokenizer.ggml.add_bos_token", &v.add_bos},
                           std::pair{"tokenizer.ggml.add_space_prefix", &v.add_space_prefix}}) {
    if (const GgufValue* b = f.find_value(key)) {
      if (b->type() != GgufType::boolean) throw IoError(path + ": " + key + " must be a bool");
      *flag = b->get<bool>();
    }
  }
  return from_gguf_vocabulary(v, path);
}

namespace {

// GGUF's "gpt2" vocabulary: byte-level BPE merged by rank.
void read_byte_level(const GgufVocabulary& v, BpeTokenizer::Impl& impl, const std::string& where) {
  auto fail = [&](const std::string& what) { return IoError(where + ": " + what); };
  const GgufPre* pre = nullptr;
  for (const GgufPre& p : kGgufPres) {
    if (v.pre == p.name) pre = &p;
  }
  if (!pre) {
    throw fail("tokenizer.ggml.pre \"" + v.pre + "\" is not supported (nabla reads gpt-2, llama-bpe, qwen2, smollm)");
  }
  impl.pre = pre->pre;
  impl.ignore_merges = pre->pre == PreTokenizer::llama3;  // as llama.cpp
  std::string bytes;
  std::vector<BpeTokenizer::Impl::Added> added;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t type = v.types.empty() ? kGgufNormal : v.types[i];
    const int32_t id = int32_t(i);
    const std::string what = "token " + std::to_string(i) + " " + show(v.tokens[i]);
    if (type == kGgufNormal) {
      if (!from_alphabet(v.tokens[i], bytes) || bytes.empty()) {
        throw fail(what + " has a character outside GPT-2's byte alphabet (not byte-level BPE)");
      }
      impl.set_token(id, bytes, where + ": tokenizer.ggml.tokens");
    } else if (type == kGgufControl || type == kGgufUserDefined) {
      if (v.tokens[i].empty()) throw fail(what + " is an empty added token");
      added.push_back({v.tokens[i], id, type == kGgufControl, false, false});
    } else if (type != kGgufUnused) {
      throw fail(what + " has token type " + std::to_string(type) + " (nabla reads 1 normal, 3 control, "
                 "4 user-defined, 5 unused)");
    }
  }
  impl.id_bytes.resize(v.tokens.size());
  impl.finish(where);
  for (size_t k = 0; k < v.merges.size(); ++k) {
    const std::string& m = v.merges[k];
    const std::string what = "tokenizer.ggml.merges[" + std::to_string(k) + "]";
    const size_t space = m.find(' ');
    if (space == std::string::npos || m.find(' ', space + 1) != std::string::npos) {
      throw fail(what + " is " + show(m) + ", expected \"left right\"");
    }
    impl.add_merge(std::string_view(m).substr(0, space), std::string_view(m).substr(space + 1), where + ": " + what,
                   " is not a normal token");
  }
  for (BpeTokenizer::Impl::Added& a : added) impl.add_token(std::move(a));
}

// GGUF's "llama" vocabulary as SentencePiece-style pieces merged by score.
void read_scored_pieces(const GgufVocabulary& v, BpeTokenizer::Impl& impl, const std::string& where) {
  auto fail = [&](const std::string& what) { return IoError(where + ": " + what); };
  BpeTokenizer::Impl::Pieces& pieces = impl.pieces;
  pieces.on = pieces.scored = true;
  pieces.prepend = v.add_space_prefix ? BpeTokenizer::Impl::Pieces::Prepend::legacy
                                      : BpeTokenizer::Impl::Pieces::Prepend::never;
  pieces.byte_token.fill(-1);
  // llama.cpp scores a file without scores 0 throughout.
  if (!v.scores.empty() && v.scores.size() != v.tokens.size()) {
    throw fail("tokenizer.ggml.scores has " + std::to_string(v.scores.size()) + " entries for " +
               std::to_string(v.tokens.size()) + " tokens");
  }
  pieces.score = v.scores.empty() ? std::vector<float>(v.tokens.size(), 0.0f) : v.scores;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (!std::isfinite(pieces.score[i])) throw fail("tokenizer.ggml.scores[" + std::to_string(i) + "] is not finite");
  }
  impl.id_bytes.resize(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t type = v.types.empty() ? kGgufNormal : v.types[i];
    const int32_t id = int32_t(i);
    const std::string& text = v.tokens[i];
    const std::string what = "token " + std::to_string(i) + " " + show(text);
    if (text.empty() && type != kGgufUnused) throw fail(what + " is empty");
    // llama.cpp looks every token's text up, whatever its type.
    if (!pieces.texts.emplace(text, id).second) throw fail(what + " appears twice");
    if (type == kGgufNormal) {
      impl.set_token(id, text, where + ": tokenizer.ggml.tokens");
    } else if (type == kGgufByte) {
      const int byte = byte_piece(text);
      if (byte < 0) throw fail(what + " is a byte token, expected <0xXX>");
      impl.id_bytes[i] = std::string(1, char(byte));
      pieces.byte_token[size_t(byte)] = id;
    } else if (type == kGgufUnknown || type == kGgufControl || type == kGgufUserDefined) {
      if (type == kGgufUnknown && v.unk < 0) pieces.unk = id;
      impl.add_token({text, id, type != kGgufUserDefined, false, false});
    } else if (type != kGgufUnused) {
      throw fail(what + " has token type " + std::to_string(type) + " (nabla reads 1 normal, 2 unknown, 3 control, "
                 "4 user-defined, 5 unused, 6 byte)");
    }
  }
  if (v.unk >= 0) {
    if (size_t(v.unk) >= v.tokens.size()) throw fail("tokenizer.ggml.unknown_token_id " + std::to_string(v.unk) + " is not a token");
    pieces.unk = v.unk;
  }
  if (pieces.unk < 0 && std::any_of(pieces.byte_token.begin(), pieces.byte_token.end(), [](int32_t t) { return t < 0; })) {
    throw fail("no unknown token, and not every byte has a <0xXX> token");
  }
}

}  // namespace

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_gguf_vocabulary(const GgufVocabulary& v, const std::string& where) {
  auto fail = [&](const std::string& what) { return IoError(where + ": " + what); };
  auto impl = std::make_unique<Impl>();
  impl->byte_id.fill(-1);
  if (v.tokens.empty() || v.tokens.size() >= (size_t(1) << 24)) {
    throw fail("tokenizer.ggml.tokens has " + std::to_string(v.tokens.size()) + " tokens, expected 1 to 2^24 - 1");
  }
  if (!v.types.empty() && v.types.size() != v.tokens.size()) {
    throw fail("tokenizer.ggml.token_type has " + std::to_string(v.types.size()) + " entries for " +
               std::to_string(v.tokens.size()) + " tokens");
  }
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (!valid_utf8(v.tokens[i])) throw fail("token " + std::to_string(i) + " " + show(v.tokens[i]) + " is not valid UTF-8");
  }
  if (v.model == "llama") {
    read_scored_pieces(v, *impl, where);
  } else if (v.model != "gpt2") {
    throw fail("tokenizer.ggml.model \"" + v.model + "\" is not supported (nabla reads gpt2 and llama)");
  } else {
    read_byte_level(v, *impl, where);
  }
  // The end-of-text token where it is an added one (GPT-2's <|endoftext|>);
  // a byte vocabulary's '\n' stays a plain token, as ByteTokenizer has none.
  if (v.add_bos) {
    if (v.bos < 0 || size_t(v.bos) >= v.tokens.size()) {
      throw fail("tokenizer.ggml.add_bos_token is set, but bos_token_id " + std::to_string(v.bos) +
                 " is not a token");
    }
    impl->prefix = {v.bos};
  }
  if (v.eot >= 0 && size_t(v.eot) < v.tokens.size() && !v.types.empty() &&
      (v.types[size_t(v.eot)] == kGgufControl || v.types[size_t(v.eot)] == kGgufUserDefined)) {
    impl->eot = v.eot;
  }
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::bytes_only() {
  auto impl = std::make_unique<Impl>();
  impl->byte_id.fill(-1);
  for (int b = 0; b < 256; ++b) impl->set_token(b, std::string(1, char(b)), "bytes_only");
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

namespace {

// Scores that make llama.cpp's merging follow a SentencePiece-style
// tokenizer's: as read from GGUF, or from the merges' order (a token scores
// minus the rank of the first merge making it; one no merge makes scores
// below them all, by id; byte, added and unused tokens 0). llama.cpp merges
// any adjacent pair whose text is a token while the merges list only some:
// refused where Metaspace's split keeps pieces apart that llama.cpp would join.
std::vector<float> pieces_scores(const BpeTokenizer::Impl& m) {
  if (m.pieces.scored) return m.pieces.score;
  std::vector<float> score(m.id_bytes.size(), 0.0f);
  const float last = -float(m.merge_list.size());
  for (const auto& [bytes, id] : m.bytes_id) {
    score[size_t(id)] = last - float(id);
    if (m.pieces.split && bytes.find(kSpaceMarker, 1) != std::string::npos) {
      throw UsageError("tokenizer: the token " + show(bytes) + " has a space marker inside, which llama.cpp can "
                       "make where this tokenizer's Metaspace split cannot: its GGUF would tokenize differently");
    }
  }
  for (size_t rank = m.merge_list.size(); rank-- > 0;) {
    const auto [a, b] = m.merge_list[rank];
    score[size_t(m.merges.at(pair_key(a, b)).id)] = -float(rank);
  }
  for (const BpeTokenizer::Impl::Added& a : m.added) score[size_t(a.id)] = 0.0f;
  return score;
}

}  // namespace

GgufVocabulary BpeTokenizer::gguf_vocabulary() const {
  const Impl& m = *impl_;
  if (m.pre == PreTokenizer::llama3 && !m.ignore_merges && !m.pieces.on) {
    throw UsageError("tokenizer: llama.cpp ignores merges for Llama 3's pattern (llama-bpe) and this tokenizer does "
                     "not: its GGUF would tokenize differently");
  }
  GgufVocabulary v;
  const size_t n = m.id_bytes.size();
  v.tokens.resize(n);
  v.types.assign(n, kGgufUnused);
  for (size_t id = 0; id < n; ++id) v.tokens[id] = "[UNUSED" + std::to_string(id) + "]";
  for (const auto& [bytes, id] : m.bytes_id) {
    v.tokens[size_t(id)] = m.pieces.on ? bytes : to_alphabet(bytes);
    v.types[size_t(id)] = kGgufNormal;
  }
  if (m.pieces.on) {
    v.model = "llama";
    for (const auto& [text, id] : m.pieces.texts) v.tokens[size_t(id)] = text;  // read from GGUF: its texts
    for (int b = 0; b < 256; ++b) {
      const int32_t id = m.pieces.byte_token[size_t(b)];
      if (id < 0) continue;
      v.tokens[size_t(id)] = byte_piece_text(b);
      v.types[size_t(id)] = kGgufByte;
    }
    v.scores = pieces_scores(m);
    v.add_space_prefix = m.pieces.prepend != Impl::Pieces::Prepend::never;
  } else {
    for (const GgufPre& p : kGgufPres) {
      if (p.pre == m.pre) {
        v.pre = p.name;
        break;
      }
    }
    for (const auto& [a, b] : m.merge_list) {
      v.merges.push_back(to_alphabet(m.id_bytes[size_t(a)]) + " " + to_alphabet(m.id_bytes[size_t(b)]));
    }
  }
  for (const Impl::Added& a : m.added) {
    v.tokens[size_t(a.id)] = a.text;
    v.types[size_t(a.id)] = a.special ? kGgufControl : kGgufUserDefined;
  }
  // GPT-2's files keep <|endoftext|> among the model's tokens; llama.cpp
  // wants it a control token (as convert_hf_to_gguf writes GPT-2).
  if (m.eot >= 0) v.types[size_t(m.eot)] = kGgufControl;
  if (m.pieces.on && m.pieces.unk >= 0) {
    v.unk = m.pieces.unk;
    v.types[size_t(v.unk)] = kGgufUnknown;
  }
  v.eot = m.eot;
  if (m.prefix.size() > 1) {
    throw UsageError("tokenizer: GGUF holds one BOS token, this tokenizer's inputs start with " +
                     std::to_string(m.prefix.size()));
  }
  if (!m.prefix.empty()) {
    v.bos = m.prefix[0];
    v.add_bos = true;
  }
  return v;
}

// ---- training

std::unique_ptr<BpeTokenizer> BpeTokenizer::train(std::string_view text, int32_t vocab_size, PreTokenizer pre) {
  if (vocab_size < 257 || vocab_size > (1 << 24)) {
    throw UsageError("tokenizer train: vocab_size must be in [257, 2^24], got " + std::to_string(vocab_size));
  }
  auto impl = std::make_unique<Impl>();
  impl->byte_id.fill(-1);
  impl->pre = pre;
  for (int b = 0; b < 256; ++b) impl->set_token(b, std::string(1, char(b)), "train");

  // Distinct pieces with their counts, in first-seen order (deterministic).
  std::unordered_map<std::string_view, int32_t> index;
  struct Word {
    std::vector<int32_t> ids;
    int64_t count = 0;
  };
  std::vector<Word> words;
  for (std::string_view piece : pre_tokenize(text, pre)) {
    auto [it, fresh] = index.emplace(piece, int32_t(words.size()));
    if (fresh) {
      Word w;
      for (char c : piece) w.ids.push_back(static_cast<uint8_t>(c));
      words.push_back(std::move(w));
    }
    ++words[size_t(it->second)].count;
  }

  // Pair counts, the words holding each pair, and a max-heap of (count,
  // pair) entries refreshed lazily: an entry is current when its count is.
  std::unordered_map<uint64_t, int64_t> count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  for (size_t w = 0; w < words.size(); ++w) {
    const auto& ids = words[w].ids;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const uint64_t p = pair_key(ids[i], ids[i + 1]);
      count[p] += words[w].count;
      auto& list = where[p];
      if (list.empty() || list.back() != int32_t(w)) list.push_back(int32_t(w));
    }
  }
  // Ties go to the pair whose merged token's bytes sort first.
  auto merged_bytes = [&](uint64_t p) {
    return impl->id_bytes[size_t(p >> 32)] + impl->id_bytes[size_t(uint32_t(p))];
  };
  struct Entry {
    int64_t count;
    std::string bytes;
    uint64_t pair;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : bytes > o.bytes; }
  };
  std::priority_queue<Entry> heap;
  for (const auto& [p, c] : count) heap.push({c, merged_bytes(p), p});

  const int32_t merges_wanted = vocab_size - 257;  // 256 bytes and <|endoftext|>
  while (int32_t(impl->merge_list.size()) < merges_wanted && !heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    auto c = count.find(top.pair);
    if (c == count.end() || c->second != top.count) continue;  // stale
    if (top.count < 2) break;
    const int32_t a = int32_t(top.pair >> 32), b = int32_t(uint32_t(top.pair)), ab = int32_t(impl->id_bytes.size());
    impl->set_token(ab, top.bytes, "train");
    impl->add_merge(a, b, "train");
    std::unordered_map<uint64_t, int64_t> delta;
    const std::vector<int32_t> holders = std::move(where[top.pair]);
    where.erase(top.pair);
    for (int32_t w : holders) {
      auto& ids = words[size_t(w)].ids;
      const int64_t n = words[size_t(w)].count;
      bool holds = false;
      for (size_t i = 0; i + 1 < ids.size(); ++i) holds = holds || (ids[i] == a && ids[i + 1] == b);
      if (!holds) continue;  // merged away by an earlier pair
      for (size_t i = 0; i + 1 < ids.size(); ++i) delta[pair_key(ids[i], ids[i + 1])] -= n;
      std::vector<int32_t> out;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i + 1 < ids.size() && ids[i] == a && ids[i + 1] == b) {
          out.push_back(ab);
          ++i;
        } else {
          out.push_back(ids[i]);
        }
      }
      ids.swap(out);
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        const uint64_t p = pair_key(ids[i], ids[i + 1]);
        delta[p] += n;
        auto& list = where[p];
        if (list.empty() || list.back() != w) list.push_back(w);
      }
    }
    for (const auto& [p, d] : delta) {
      if (d == 0) continue;
      const int64_t now = (count[p] += d);
      if (now > 0) heap.push({now, merged_bytes(p), p});
    }
    count.erase(top.pair);
  }
  impl->add_token({"<|endoftext|>", int32_t(impl->id_bytes.size()), true, false, false});
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

// ---- GPT-2's files

namespace {

std::unique_ptr<BpeTokenizer::Impl> load_gpt2_files(const std::string& dir) {
  auto impl = std::make_unique<BpeTokenizer::Impl>();
  impl->name = "gpt2";
  impl->byte_id.fill(-1);
  const std::string encoder = dir + "encoder.json", vocab = dir + "vocab.bpe";
  json j;
  try {
    j = json::parse(read_file(encoder));
  } catch (const json::exception& e) {
    throw IoError(encoder + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || j.empty()) throw IoError(encoder + ": expected a JSON object {token: id}");
  const size_t n = j.size();
  std::string bytes;
  for (const auto& [token, value] : j.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= int64_t(n)) {
      throw IoError(encoder + ": token " + show(token) + " has id " + value.dump() + ", expected an integer in [0, " +
                    std::to_string(n) + ")");
    }
    const int32_t id = value.get<int32_t>();
    if (id < int32_t(impl->id_bytes.size()) && !impl->id_bytes[size_t(id)].empty()) {
      throw IoError(encoder + ": id " + std::to_string(id) + " is given to two tokens");
    }
    if (!from_alphabet(token, bytes)) {
      throw IoError(encoder + ": token " + show(token) + " has a character outside GPT-2's byte alphabet");
    }
    if (token == "<|endoftext|>") impl->eot = id;
    impl->set_token(id, bytes, encoder);
  }
  impl->finish(encoder);

  const std::string data = read_file(vocab);
  size_t line_no = 0, pos = 0;
  while (pos < data.size()) {
    size_t nl = data.find('\n', pos);
    if (nl == std::string::npos) nl = data.size();
    std::string_view line(data.data() + pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    const std::string where = vocab + ": line " + std::to_string(line_no);
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      throw IoError(where + ": expected two tokens separated by a space, got " + show(line));
    }
    impl->add_merge(line.substr(0, space), line.substr(space + 1), where, " is not in encoder.json");
  }
  if (impl->merges.empty()) throw IoError(vocab + ": no merges");
  return impl;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocab_dir)
    : BpeTokenizer(load_gpt2_files(vocab_dir.empty() || vocab_dir.back() == '/' ? vocab_dir : vocab_dir + "/")) {}

std::vector<std::string_view> Gpt2Tokenizer::split(std::string_view text) {
  return pre_tokenize(text, PreTokenizer::gpt2);
}

}  // namespace nabla
