// Text corpora for language-model training, and the batcher that cuts them
// into windows.
//
// Dimension legend: N tokens, B batch rows, T context length.
//
// A corpus is a file or a folder of text files, split into documents, each
// tokenised and followed by the tokenizer's end-of-text id (or a newline when
// it has none), all concatenated into one token stream. Tokenising is done
// once: the stream is cached in a binary file keyed by a hash of the inputs
// and the tokenizer, and checked when read back. The last part of the stream
// is held out for validation.
//
// TextBatcher draws each row's window from (seed, step, row) alone, so a run
// resumed at step s sees exactly the batches it would have seen.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nabla/tokenizer.h"

namespace nabla {

// /usr/share/games/fortunes (Debian's fortunes and fortunes-min packages)
// when it exists, else "".
std::string find_fortunes();

// The documents of `path`, a file or a folder. A folder contributes its
// regular files, not recursively and in name order, skipping symbolic links,
// hidden files and fortune index files (*.dat, *.u8). In each file a line
// holding only "%" separates documents (the fortune format) and is dropped; a
// file without such lines is one document. Documents that are only white
// space are dropped. `files` (optional) receives the files read. IoError
// when `path` is missing or holds no text.
std::vector<std::string> read_text_documents(const std::string& path,
                                             std::vector<std::string>* files = nullptr);

struct TextDataOptions {
  std::string path;            // file or folder; "" = find_fortunes()
  std::string cache_dir;       // "" = ${NABLA_CACHE:-$HOME/.cache/nabla}/text
  bool use_cache = true;       // false: always tokenise, write nothing
  double val_fraction = 0.05;  // the stream's last part, in [0, 1)
};

struct TextDataset {
  std::vector<int32_t> train, val;  // [N_train], [N_val] token ids
  int32_t vocab_size = 0;
  std::string tokenizer;  // its name()
  int64_t documents = 0;
  std::vector<std::string> files;  // the files read
  std::string cache_path;          // "" when not cached
  bool from_cache = false;         // the ids were read from cache_path
};

// Reads and tokenises the corpus, or reads its ids from the cache when a
// valid entry exists (a damaged one is rebuilt). IoError for unreadable
// inputs; UsageError for a val_fraction outside [0, 1).
TextDataset load_text_dataset(const Tokenizer& tokenizer, const TextDataOptions& options = {});

// Random windows of T + 1 consecutive tokens: inputs are a row's first T,
// targets its last T.
//
//   TextBatcher batches(data.train, B, T, seed);
//   std::vector<int32_t> tokens(B * (T + 1));
//   for (int64_t step = start; step < steps; ++step) batches.batch(step, tokens.data());
//
// `tokens` must outlive the batcher and stay unchanged.
class TextBatcher {
 public:
  // UsageError unless batch >= 1, context >= 1 and the stream holds at least
  // context + 1 tokens.
  TextBatcher(std::span<const int32_t> tokens, int64_t batch, int64_t context, uint64_t seed);

  // Writes tokens [B, T + 1]: row b is the stream's window at an offset drawn
  // uniformly from [0, N - T - 1] as a pure function of (seed, step, b).
  void batch(int64_t step, int32_t* tokens) const;

  int64_t batch_size() const { return batch_; }
  int64_t context() const { return context_; }
  uint64_t seed() const { return seed_; }

 private:
  std::span<const int32_t> tokens_;
  int64_t batch_, context_;
  uint64_t seed_;
};

}  // namespace nabla
