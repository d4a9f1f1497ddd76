// Text corpora: documents from files, the token-stream cache, the train/val
// split and TextBatcher.
//
// Cache file (little-endian):
//   "NABLATOK"  u32 format  u32 vocab_size  u64 key  u64 documents  u64 N
//   i32 ids[N]  u64 checksum of the ids' bytes
// `key` hashes the cache format, the tokenizer (name, vocabulary size,
// end-of-text id and the ids of a probe text) and every document's bytes, so
// changed inputs or another tokenizer miss the entry instead of reusing it.
#include "nabla/text_data.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/counter_random.h"
#include "nabla/error.h"
#include "nabla/io.h"

namespace nabla {

namespace {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "the token cache is written in host order");

constexpr char kMagic[8] = {'N', 'A', 'B', 'L', 'A', 'T', 'O', 'K'};
constexpr uint32_t kFormat = 1;
constexpr size_t kHeaderBytes = 40;

// FNV-1a, 64-bit: a stable hash for cache keys and checksums (not for
// security; it only has to notice changes).
struct Fnv64 {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  }
  void u64(uint64_t v) { bytes(&v, sizeof v); }
  void str(std::string_view s) {  // length first, so ("ab", "c") != ("a", "bc")
    u64(s.size());
    bytes(s.data(), s.size());
  }
};

bool only_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); });
}

// Splits `text` at lines holding only "%" (with or without a '\r'), dropping
// those lines and documents that are only white space.
void split_documents(std::string_view text, std::vector<std::string>& docs) {
  size_t start = 0, pos = 0;
  auto flush = [&](size_t end) {
    std::string_view doc = text.substr(start, end - start);
    if (!only_space(doc)) docs.emplace_back(doc);
  };
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? end - pos : nl - pos);
    if (line == "%" || line == "%\r") {
      flush(pos);
      start = end;
    }
    pos = end;
  }
  flush(text.size());
}

std::string default_cache_dir() {
  if (const char* c = std::getenv("NABLA_CACHE"); c && *c) return (fs::path(c) / "text").string();
  if (const char* home = std::getenv("HOME"); home && *home)
    return (fs::path(home) / ".cache" / "nabla" / "text").string();
  return "";
}

uint64_t cache_key(const Tokenizer& tok, const std::vector<std::string>& docs) {
  Fnv64 h;
  h.u64(kFormat);
  h.str(tok.name());
  h.u64(static_cast<uint64_t>(tok.vocab_size()));
  h.u64(static_cast<uint64_t>(tok.eot_id()));
  // The probe stands in for the vocabulary files: another vocabulary of the
  // same size almost surely encodes it differently.
  std::vector<int32_t> probe =
      tok.encode("The quick brown fox can't jump 1234 times!\n\tÉté 東京 🙂  ");
  h.bytes(probe.data(), probe.size() * sizeof(int32_t));
  h.u64(docs.size());
  for (const std::string& d : docs) h.str(d);
  return h.h;
}

uint64_t checksum(const std::vector<int32_t>& ids) {
  Fnv64 h;
  h.bytes(ids.data(), ids.size() * sizeof(int32_t));
  return h.h;
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <typename T>
T get(const std::string& in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

// The cached ids, or false when the file is missing or is not a valid entry
// for (key, vocab).
bool read_cache(const std::string& path, uint64_t key, int32_t vocab, int64_t& documents,
                std::vector<int32_t>& ids) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::string data;
  try {
    data = read_file(path);
  } catch (const IoError&) {
    return false;
  }
  if (data.size() < kHeaderBytes + 8 || std::memcmp(data.data(), kMagic, 8) != 0) return false;
  if (get<uint32_t>(data, 8) != kFormat ||
      get<uint32_t>(data, 12) != static_cast<uint32_t>(vocab) || get<uint64_t>(data, 16) != key) {
    return false;
  }
  uint64_t n = get<uint64_t>(data, 32);
  if (n > (data.size() - kHeaderBytes - 8) / 4 || data.size() != kHeaderBytes + 4 * n + 8)
    return false;
  ids.resize(n);
  std::memcpy(ids.data(), data.data() + kHeaderBytes, 4 * n);
  if (get<uint64_t>(data, kHeaderBytes + 4 * n) != checksum(ids)) return false;
  if (std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return id < 0 || id >= vocab; }))
    return false;
  documents = static_cast<int64_t>(get<uint64_t>(data, 24));
  return true;
}

void write_cache(const std::string& path, uint64_t key, int32_t vocab, int64_t documents,
                 const std::vector<int32_t>& ids) {
  std::string out(kMagic, 8);
  put<uint32_t>(out, kFormat);
  put<uint32_t>(out, static_cast<uint32_t>(vocab));
  put<uint64_t>(out, key);
  put<uint64_t>(out, static_cast<uint64_t>(documents));
  put<uint64_t>(out, ids.size());
  out.append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
  put<uint64_t>(out, checksum(ids));
  write_file_atomic(path, out);
}

using data::mix64;  // counter-based draws, as in the image BatchLoader

}  // namespace

std::string find_fortunes() {
  std::error_code ec;
  const char* dir = "/usr/share/games/fortunes";
  return fs::is_directory(dir, ec) ? dir : "";
}

std::vector<std::string> read_text_documents(const std::string& path,
                                             std::vector<std::string>* files) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw IoError(path + ": no such file or folder");
  std::vector<std::string> paths;
  if (fs::is_directory(st)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      std::string name = e.path().filename().string();
      if (e.is_symlink() || !e.is_regular_file() || name.starts_with(".") ||
          name.ends_with(".dat") || name.ends_with(".u8")) {
        continue;
      }
      paths.push_back(e.path().string());
    }
    if (ec) throw IoError(path + ": cannot list the folder: " + ec.message());
    std::sort(paths.begin(), paths.end());
  } else {
    paths.push_back(path);
  }
  std::vector<std::string> docs;
  for (const std::string& p : paths) split_documents(read_file(p), docs);
  if (docs.empty())
    throw IoError(path + ": no text (" + std::to_string(paths.size()) + " files read)");
  if (files) *files = std::move(paths);
  return docs;
}

TextDataset load_text_dataset(const Tokenizer& tokenizer, const TextDataOptions& options) {
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) {
    throw UsageError("load_text_dataset: val_fraction must be in [0, 1), got " +
                     std::to_string(options.val_fraction));
  }
  std::string path = options.path.empty() ? find_fortunes() : options.path;
  if (path.empty()) {
    throw IoError(
        "load_text_dataset: no corpus given and /usr/share/games/fortunes is missing (install "
        "Debian's fortunes "
        "package, or name a file or folder)");
  }
  TextDataset data;
  data.tokenizer = tokenizer.name();
  data.vocab_size = tokenizer.vocab_size();
  std::vector<std::string> docs = read_text_documents(path, &data.files);
  data.documents = static_cast<int64_t>(docs.size());

  std::string cache_path;
  uint64_t key = 0;
  if (options.use_cache) {
    std::string dir = options.cache_dir.empty() ? default_cache_dir() : options.cache_dir;
    if (!dir.empty()) {
      key = cache_key(tokenizer, docs);
      char name[40];
      std::snprintf(name, sizeof name, "-%016llx.tokens", static_cast<unsigned long long>(key));
      cache_path = (fs::path(dir) / (tokenizer.name() + name)).string();
    }
  }

  std::vector<int32_t> ids;
  int64_t cached_docs = 0;
  if (!cache_path.empty() && read_cache(cache_path, key, data.vocab_size, cached_docs, ids) &&
      cached_docs == data.documents) {
    data.from_cache = true;
    data.cache_path = cache_path;
  } else {
    ids.clear();
    std::vector<int32_t> separator =
        tokenizer.eot_id() >= 0 ? std::vector<int32_t>{tokenizer.eot_id()} : tokenizer.encode("\n");
    for (const std::string& doc : docs) {
      std::vector<int32_t> d = tokenizer.encode(doc);
      ids.insert(ids.end(), d.begin(), d.end());
      ids.insert(ids.end(), separator.begin(), separator.end());
    }
    if (!cache_path.empty()) {
      // A cache that cannot be written costs time on the next run, not this
      // one's result: carry on uncached.
      try {
        std::error_code ec;
        fs::create_directories(fs::path(cache_path).parent_path(), ec);
        write_cache(cache_path, key, data.vocab_size, data.documents, ids);
        data.cache_path = cache_path;
      } catch (const IoError&) {
      }
    }
  }

  auto n = static_cast<int64_t>(ids.size());
  auto n_val = static_cast<int64_t>(static_cast<double>(n) * options.val_fraction);
  data.train.assign(ids.begin(), ids.end() - n_val);
  data.val.assign(ids.end() - n_val, ids.end());
  return data;
}

TextBatcher::TextBatcher(std::span<const int32_t> tokens, int64_t batch, int64_t context,
                         uint64_t seed)
    : tokens_(tokens), batch_(batch), context_(context), seed_(seed) {
  if (batch < 1 || context < 1) {
    throw UsageError("TextBatcher: batch and context must be >= 1, got batch " +
                     std::to_string(batch) + " and context " + std::to_string(context));
  }
  if (static_cast<int64_t>(tokens.size()) < context + 1) {
    throw UsageError("TextBatcher: " + std::to_string(tokens.size()) +
                     " tokens cannot fill a window of T + 1 = " + std::to_string(context + 1));
  }
}

void TextBatcher::batch(int64_t step, int32_t* tokens) const {
  using data::kGolden;
  const int64_t window = context_ + 1;
  const auto offsets = static_cast<uint64_t>(static_cast<int64_t>(tokens_.size()) - window + 1);
  uint64_t h = mix64(mix64(seed_ + kGolden) ^ static_cast<uint64_t>(step));
  for (int64_t b = 0; b < batch_; ++b) {
    uint64_t r = mix64(h ^ (static_cast<uint64_t>(b) * kGolden));
    // Uniform in [0, offsets): the top 64 bits of a 128-bit product.
    auto start = static_cast<size_t>((static_cast<unsigned __int128>(r) * offsets) >> 64);
    std::copy_n(tokens_.data() + start, window, tokens + b * window);
  }
}

}  // namespace nabla
