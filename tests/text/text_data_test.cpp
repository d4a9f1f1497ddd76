// Text corpora: documents from files and folders, the token cache, the
// train/val split and TextBatcher.
#include "nabla/text_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "nabla/error.h"

#include "temp_dir.h"

using namespace nabla;
namespace fs = std::filesystem;

namespace {

using nabla::testing_support::TempDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A folder laid out like /usr/share/games/fortunes: fortune files with their
// .dat index and .u8 symlink, plus a hidden file.
void write_fortune_folder(const TempDir& dir) {
  fs::create_directories(dir.file("corpus"));
  write_text(dir.file("corpus/b_quotes"), "Second file.\n%\n");
  write_text(dir.file("corpus/a_jokes"),
             "First joke,\n  two lines.\n%\nSecond joke.\n%\n   \n%\nThird: 100%\n");
  write_text(dir.file("corpus/a_jokes.dat"), std::string("\0\0\0\2binary index", 16));
  fs::create_symlink("a_jokes", dir.file("corpus/a_jokes.u8"));
  write_text(dir.file("corpus/.hidden"), "not read\n");
}

}  // namespace

TEST(TextDocuments, FortuneFolderSkipsIndexFilesAndSeparators) {
  TempDir dir;
  write_fortune_folder(dir);
  std::vector<std::string> files;
  std::vector<std::string> docs = read_text_documents(dir.file("corpus"), &files);
  EXPECT_EQ(docs, (std::vector<std::string>{"First joke,\n  two lines.\n", "Second joke.\n",
                                            "Third: 100%\n", "Second file.\n"}));
  EXPECT_EQ(files,
            (std::vector<std::string>{dir.file("corpus/a_jokes"), dir.file("corpus/b_quotes")}));
}

TEST(TextDocuments, PlainFileIsOneDocument) {
  TempDir dir;
  write_text(dir.file("book.txt"), "Call me Ishmael.\r\n%d percent\r\n%\r\nNext.");
  EXPECT_EQ(read_text_documents(dir.file("book.txt")),
            (std::vector<std::string>{"Call me Ishmael.\r\n%d percent\r\n", "Next."}));
  write_text(dir.file("plain.txt"), "no separators\nat all\n");
  EXPECT_EQ(read_text_documents(dir.file("plain.txt")),
            (std::vector<std::string>{"no separators\nat all\n"}));
}

TEST(TextDocuments, MissingOrEmptyInputsAreIoErrors) {
  TempDir dir;
  EXPECT_THROW(read_text_documents(dir.file("nope")), IoError);
  write_text(dir.file("blank"), "%\n  \n%\n");
  EXPECT_THROW(read_text_documents(dir.file("blank")), IoError);
  fs::create_directories(dir.file("empty"));
  EXPECT_THROW(read_text_documents(dir.file("empty")), IoError);
}

TEST(TextDataset, TokenisesSplitsAndCaches) {
  TempDir dir;
  write_fortune_folder(dir);
  ByteTokenizer tok;
  TextDataOptions opt;
  opt.path = dir.file("corpus");
  opt.cache_dir = dir.file("cache");
  opt.val_fraction = 0.25;
  TextDataset a = load_text_dataset(tok, opt);
  // Byte tokens: each document then a newline (the byte tokenizer has no end-of-text id).
  std::string stream =
      "First joke,\n  two lines.\n\nSecond joke.\n\nThird: 100%\n\nSecond file.\n\n";
  std::vector<int32_t> all = a.train;
  all.insert(all.end(), a.val.begin(), a.val.end());
  EXPECT_EQ(all, tok.encode(stream));
  EXPECT_EQ(a.val.size(), stream.size() / 4);
  EXPECT_EQ(a.documents, 4);
  EXPECT_EQ(a.vocab_size, 256);
  EXPECT_EQ(a.tokenizer, "byte");
  EXPECT_FALSE(a.from_cache);
  ASSERT_FALSE(a.cache_path.empty());
  EXPECT_TRUE(fs::is_regular_file(a.cache_path)) << a.cache_path;

  TextDataset b = load_text_dataset(tok, opt);
  EXPECT_TRUE(b.from_cache);
  EXPECT_EQ(b.cache_path, a.cache_path);
  EXPECT_EQ(b.train, a.train);
  EXPECT_EQ(b.val, a.val);
  EXPECT_EQ(b.documents, 4);

  // Another split of the same cached stream.
  opt.val_fraction = 0;
  TextDataset c = load_text_dataset(tok, opt);
  EXPECT_TRUE(c.from_cache);
  EXPECT_EQ(c.train, all);
  EXPECT_TRUE(c.val.empty());
}

TEST(TextDataset, ChangedInputMissesTheCache) {
  TempDir dir;
  write_fortune_folder(dir);
  ByteTokenizer tok;
  TextDataOptions opt{dir.file("corpus"), dir.file("cache")};
  TextDataset a = load_text_dataset(tok, opt);
  write_text(dir.file("corpus/b_quotes"), "Second file, edited.\n%\n");
  TextDataset b = load_text_dataset(tok, opt);
  EXPECT_FALSE(b.from_cache);
  EXPECT_NE(b.cache_path, a.cache_path);
  EXPECT_NE(b.train, a.train);
}

TEST(TextDataset, DamagedCacheIsRebuilt) {
  TempDir dir;
  write_fortune_folder(dir);
  ByteTokenizer tok;
  TextDataOptions opt{dir.file("corpus"), dir.file("cache")};
  TextDataset a = load_text_dataset(tok, opt);
  std::string good = read_bytes(a.cache_path);
  // A changed id (caught by the checksum), a truncated file, the magic alone,
  // and another key.
  std::string flipped = good, other_key = good;
  flipped[44] ^= 1;
  other_key[16] ^= 1;
  for (const std::string& bad :
       {flipped, good.substr(0, good.size() - 3), std::string("NABLATOK"), other_key}) {
    write_text(a.cache_path, bad);
    TextDataset b = load_text_dataset(tok, opt);
    EXPECT_FALSE(b.from_cache);
    EXPECT_EQ(b.train, a.train);
    EXPECT_EQ(read_bytes(a.cache_path), good);  // rewritten
  }
}

TEST(TextDataset, WithoutCacheWritesNothing) {
  TempDir dir;
  write_text(dir.file("t.txt"), "hello\n");
  TextDataOptions opt{dir.file("t.txt"), dir.file("cache")};
  opt.use_cache = false;
  TextDataset a = load_text_dataset(ByteTokenizer(), opt);
  EXPECT_TRUE(a.cache_path.empty());
  EXPECT_FALSE(fs::exists(dir.file("cache")));
  opt.val_fraction = 1.0;
  EXPECT_THROW(load_text_dataset(ByteTokenizer(), opt), UsageError);
}

TEST(TextDataset, Fortunes) {
  if (find_fortunes().empty()) GTEST_SKIP() << "Debian's fortunes package is not installed";
  TempDir dir;
  TextDataOptions opt;
  opt.cache_dir = dir.path();
  TextDataset d = load_text_dataset(ByteTokenizer(), opt);
  EXPECT_GT(d.documents, 1000);
  EXPECT_GT(d.files.size(), 10u);
  for (const std::string& f : d.files) {
    EXPECT_FALSE(f.ends_with(".dat") || f.ends_with(".u8")) << f;
  }
  EXPECT_GT(d.val.size(), 0u);
  EXPECT_NEAR(double(d.val.size()) / double(d.train.size() + d.val.size()), 0.05, 1e-3);
  // The "%" separators are gone: no line of the stream is exactly "%".
  std::string text = ByteTokenizer().decode(d.train);
  EXPECT_EQ(text.find("\n%\n"), std::string::npos);
  EXPECT_FALSE(text.starts_with("%\n"));
}

TEST(TextBatcher, RowsAreWindowsFromSeedAndStepOnly) {
  std::vector<int32_t> tokens(1000);
  std::iota(tokens.begin(), tokens.end(), 0);
  const int64_t B = 8, T = 16;
  TextBatcher a(tokens, B, T, /*seed=*/7);
  TextBatcher b(tokens, B, T, /*seed=*/7);
  TextBatcher other_seed(tokens, B, T, /*seed=*/8);
  std::vector<int32_t> x(B * (T + 1)), y(B * (T + 1)), z(B * (T + 1));
  // Any order, any instance: step 5 is step 5.
  a.batch(3, x.data());
  a.batch(5, x.data());
  b.batch(5, y.data());
  EXPECT_EQ(x, y);
  b.batch(6, z.data());
  EXPECT_NE(x, z);
  other_seed.batch(5, z.data());
  EXPECT_NE(x, z);
  for (int64_t r = 0; r < B; ++r) {
    const int32_t* row = x.data() + r * (T + 1);
    for (int64_t t = 1; t <= T; ++t) EXPECT_EQ(row[t], row[0] + t) << "row " << r;
  }
}

TEST(TextBatcher, OffsetsCoverTheWholeStream) {
  std::vector<int32_t> tokens(20);
  std::iota(tokens.begin(), tokens.end(), 0);
  const int64_t T = 4;  // offsets 0 .. 15
  TextBatcher batches(tokens, 4, T, 1);
  std::set<int32_t> starts;
  std::vector<int32_t> x(4 * (T + 1));
  for (int64_t step = 0; step < 200; ++step) {
    batches.batch(step, x.data());
    for (int r = 0; r < 4; ++r) {
      int32_t s = x[r * (T + 1)];
      ASSERT_GE(s, 0);
      ASSERT_LE(s, 15);
      starts.insert(s);
    }
  }
  EXPECT_EQ(starts.size(), 16u);

  // A stream of exactly T + 1 tokens has one window.
  TextBatcher one(std::span<const int32_t>(tokens.data(), T + 1), 2, T, 3);
  one.batch(0, x.data());
  EXPECT_EQ(std::vector<int32_t>(x.begin(), x.begin() + 2 * (T + 1)),
            (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
}

TEST(TextBatcher, RejectsShortStreamsAndBadSizes) {
  std::vector<int32_t> tokens(10);
  EXPECT_THROW(TextBatcher(tokens, 1, 10, 0), UsageError);
  EXPECT_THROW(TextBatcher(tokens, 0, 4, 0), UsageError);
  EXPECT_THROW(TextBatcher(tokens, 1, 0, 0), UsageError);
  EXPECT_NO_THROW(TextBatcher(tokens, 1, 9, 0));
}
