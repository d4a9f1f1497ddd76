// Tokenizers: bytes, the pre-tokenisation patterns, BPE merges on a small
// made-up vocabulary, GPT-2's real vocabulary on hand-checked strings,
// training and tokenizer.json, and errors for bad vocabulary files.
// tests/text/bpe_reference.sh and hf_tokenizers.sh compare with independent
// encoders on a large corpus.
#include "nabla/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "nabla/error.h"
#include "nabla/io.h"
#include "text/unicode.h"

#include "temp_dir.h"

using namespace nabla;
namespace fs = std::filesystem;

namespace {

using nabla::testing_support::TempDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// GPT-2's byte alphabet, written independently of the library: printable
// bytes stand for themselves, the rest map to U+0100 onwards in order.
std::string byte_char(int b) {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256);
    uint32_t next = 256;
    for (uint32_t c = 0; c < 256; ++c)
      t[c] = ((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174)) ? c : next++;
    return t;
  }();
  uint32_t cp = table[b];
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// A vocabulary of the 256 bytes (ids 0..255 in byte order) plus `merges`,
// each adding its concatenation as the next id.
void write_vocab(const TempDir& dir, const std::vector<std::pair<std::string, std::string>>& merges,
                 const std::string& extra_token = "") {
  std::string json = "{";
  int id = 0;
  for (int b = 0; b < 256; ++b)
    json += (b ? ", \"" : "\"") + json_escape(byte_char(b)) + "\": " + std::to_string(id++);
  std::string bpe = "#version: 0.2\n";
  auto spell = [](const std::string& bytes) {
    std::string s;
    for (char c : bytes) s += byte_char(static_cast<uint8_t>(c));
    return s;
  };
  for (const auto& [a, b] : merges) {
    json += ", \"" + json_escape(spell(a + b)) + "\": " + std::to_string(id++);
    bpe += spell(a) + " " + spell(b) + "\n";
  }
  if (!extra_token.empty()) json += ", \"" + extra_token + "\": " + std::to_string(id++);
  write_text(dir.file("encoder.json"), json + "}");
  write_text(dir.file("vocab.bpe"), bpe);
}

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : Gpt2Tokenizer::split(text)) out.emplace_back(p);
  return out;
}

using Pieces = std::vector<std::string>;

}  // namespace

TEST(TokenizerByte, RoundTripsEveryByte) {
  ByteTokenizer tok;
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_EQ(tok.decode(tok.encode("héllo, 世界\n")), "héllo, 世界\n");
  EXPECT_EQ(tok.vocab_size(), 256);
  EXPECT_EQ(tok.name(), "byte");
  EXPECT_EQ(tok.eot_id(), -1);
}

TEST(TokenizerByte, DecodeRejectsIdsOutsideTheVocabulary) {
  ByteTokenizer tok;
  EXPECT_THROW(tok.decode(std::vector<int32_t>{65, 256}), UsageError);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), UsageError);
}

TEST(TokenizerFactory, NamesAndErrors) {
  EXPECT_EQ(make_tokenizer("byte")->name(), "byte");
  EXPECT_THROW(make_tokenizer("sentencepiece"), UsageError);
  TempDir dir;
  try {
    make_tokenizer("gpt2", dir.path());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("encoder.json")), std::string::npos) << e.what();
  }
}

TEST(TokenizerUnicode, Classes) {
  using namespace nabla::text;
  EXPECT_EQ(code_class('a'), kLetter);
  EXPECT_EQ(code_class('Z'), kLetter);
  EXPECT_EQ(code_class('7'), kNumber);
  EXPECT_EQ(code_class('_'), kOther);
  EXPECT_EQ(code_class('\t'), kSpace);
  EXPECT_EQ(code_class(0xE9), kLetter);     // é
  EXPECT_EQ(code_class(0x4E2D), kLetter);   // 中 (Lo)
  EXPECT_EQ(code_class(0x02B0), kLetter);   // ʰ (Lm)
  EXPECT_EQ(code_class(0x01C5), kLetter);   // ǅ (Lt)
  EXPECT_EQ(code_class(0x0663), kNumber);   // Arabic-Indic three (Nd)
  EXPECT_EQ(code_class(0x2167), kNumber);   // Roman numeral eight (Nl)
  EXPECT_EQ(code_class(0x00BD), kNumber);   // ½ (No)
  EXPECT_EQ(code_class(0x0301), kOther);    // combining acute (Mn)
  EXPECT_EQ(code_class(0x1F642), kOther);   // 🙂 (So)
  EXPECT_EQ(code_class(0x00A0), kSpace);    // no-break space
  EXPECT_EQ(code_class(0x0085), kSpace);    // next line: White_Space, as in GPT-2's `regex`
  EXPECT_EQ(code_class(0xFEFF), kOther);    // BOM: not White_Space
  EXPECT_EQ(code_class(0x3000), kSpace);    // ideographic space
  EXPECT_EQ(code_class(0x1D518), kLetter);  // 𝔘 (astral Lu)
  EXPECT_EQ(code_class(0x10FFFF), kOther);
  EXPECT_STREQ(kUnicodeVersion, "14.0.0");
}

TEST(TokenizerUnicode, ValidUtf8) {
  EXPECT_TRUE(valid_utf8(""));
  EXPECT_TRUE(valid_utf8("plain \xC3\xA9 \xE6\x9D\xB1 \xF0\x9F\x99\x82"));
  EXPECT_FALSE(valid_utf8("cut \xE6\x9D"));
  EXPECT_FALSE(valid_utf8("\x80"));              // a continuation byte alone
  EXPECT_FALSE(valid_utf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
}

TEST(TokenizerUnicode, DecodesUtf8AndFlagsMalformedBytes) {
  using namespace nabla::text;
  size_t len = 0;
  EXPECT_EQ(decode_utf8("\xC3\xA9", 0, len), 0xE9u);
  EXPECT_EQ(len, 2u);
  EXPECT_EQ(decode_utf8("\xF0\x9F\x99\x82", 0, len), 0x1F642u);
  EXPECT_EQ(len, 4u);
  for (std::string_view bad :
       {"\x80", "\xC3", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xFF", "\xE4\xB8"}) {
    EXPECT_EQ(decode_utf8(bad, 0, len), kInvalid) << testing::PrintToString(std::string(bad));
    EXPECT_EQ(len, 1u);
  }
}

// The pattern's pieces, worked out by hand from
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
TEST(TokenizerGpt2Split, FollowsThePattern) {
  EXPECT_EQ(pieces("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces("Hello, world!"), (Pieces{"Hello", ",", " world", "!"}));
  EXPECT_EQ(pieces("I'm can't we've they'll I'd it's you're"),
            (Pieces{"I", "'m", " can", "'t", " we", "'ve", " they", "'ll", " I", "'d", " it", "'s",
                    " you", "'re"}));
  EXPECT_EQ(pieces("'st"), (Pieces{"'s", "t"}));
  EXPECT_EQ(pieces("IT'S"), (Pieces{"IT", "'", "S"}));  // contractions are lower case only
  EXPECT_EQ(pieces("''s"), (Pieces{"''", "s"}));        // the run of other characters takes both
  EXPECT_EQ(pieces("abc123 456"), (Pieces{"abc", "123", " 456"}));
  // A run of spaces leaves its last space to lead the next piece.
  EXPECT_EQ(pieces("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pieces("   x"), (Pieces{"  ", " x"}));
  EXPECT_EQ(pieces("x   "), (Pieces{"x", "   "}));  // at the end, the whole run
  EXPECT_EQ(pieces("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("a\n\n"), (Pieces{"a", "\n\n"}));
  EXPECT_EQ(pieces("a\tb"), (Pieces{"a", "\t", "b"}));  // only ' ' leads a word
  EXPECT_EQ(pieces("a \t b"), (Pieces{"a", " \t", " b"}));
  EXPECT_EQ(pieces(" !!! ?"), (Pieces{" !!!", " ?"}));
  EXPECT_EQ(pieces("café 東京🙂"), (Pieces{"café", " 東京", "🙂"}));
  EXPECT_EQ(pieces("e\xCC\x81t\xC3\xA9"),
            (Pieces{"e", "\xCC\x81", "t\xC3\xA9"}));  // combining mark is not a letter
  EXPECT_EQ(pieces("a\xC2\x85"
                   "b"),
            (Pieces{"a", "\xC2\x85", "b"}));  // U+0085 is white space
  EXPECT_EQ(pieces(""), Pieces{});
  EXPECT_EQ(pieces("\xFF\xFEok"), (Pieces{"\xFF\xFE", "ok"}));  // malformed bytes are "other"
}

TEST(TokenizerGpt2Bpe, MergesByRankLeftToRight) {
  TempDir dir;
  // Ranks: "b c" first, then "a b", "a a", "aa a".
  write_vocab(dir, {{"b", "c"}, {"a", "b"}, {"a", "a"}, {"aa", "a"}}, "<|endoftext|>");
  Gpt2Tokenizer tok(dir.path());
  EXPECT_EQ(tok.vocab_size(), 256 + 4 + 1);
  EXPECT_EQ(tok.eot_id(), 260);
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{'a', 256}));  // "b c" outranks "a b"
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{257}));
  // "a a" merges every pair left to right, then "aa a" joins what it can.
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{259}));
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{258, 258}));
  EXPECT_EQ(tok.encode("aaaaa"), (std::vector<int32_t>{258, 259}));
  EXPECT_EQ(tok.encode(" ab"), (std::vector<int32_t>{' ', 257}));
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(tok.decode(tok.encode(all)), all);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{261}), UsageError);
}

TEST(TokenizerGpt2Files, CorruptFilesAreIoErrorsNamingTheFile) {
  auto expect_io_error = [](const TempDir& dir, const std::string& file, const std::string& part) {
    try {
      Gpt2Tokenizer tok(dir.path());
      ADD_FAILURE() << "expected IoError naming " << file;
    } catch (const IoError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find(dir.file(file)), std::string::npos) << what;
      EXPECT_NE(what.find(part), std::string::npos) << what;
    }
  };
  {
    TempDir dir;
    write_vocab(dir, {{"a", "b"}});
    write_text(dir.file("encoder.json"), "{\"a\": 0,");
    expect_io_error(dir, "encoder.json", "not valid JSON");
  }
  {
    TempDir dir;
    write_vocab(dir, {{"a", "b"}});
    write_text(dir.file("encoder.json"), "{\"a\": 0}");
    expect_io_error(dir, "encoder.json", "no token for byte");
  }
  {
    TempDir dir;
    write_vocab(dir, {{"a", "b"}});
    fs::remove(dir.file("vocab.bpe"));
    expect_io_error(dir, "vocab.bpe", "cannot open");
  }
  {
    TempDir dir;
    write_vocab(dir, {{"a", "b"}});
    write_text(dir.file("vocab.bpe"), "#version: 0.2\na b\nx y\n");
    expect_io_error(dir, "vocab.bpe", "line 3");
  }
  {
    TempDir dir;
    write_vocab(dir, {{"a", "b"}});
    write_text(dir.file("vocab.bpe"), "#version: 0.2\nab\n");
    expect_io_error(dir, "vocab.bpe", "two tokens");
  }
}

// GPT-2's real vocabulary (scripts/fetch-gpt2-vocab installs it).
class TokenizerGpt2Real : public testing::Test {
 protected:
  void SetUp() override {
    std::string dir = find_gpt2_vocab();
    if (dir.empty())
      GTEST_SKIP() << "GPT-2's vocabulary is not installed: run scripts/fetch-gpt2-vocab";
    tok_ = std::make_unique<Gpt2Tokenizer>(dir);
  }
  std::string text(int32_t id) const { return tok_->decode(std::vector<int32_t>{id}); }
  std::unique_ptr<Gpt2Tokenizer> tok_;
};

TEST_F(TokenizerGpt2Real, HandCheckedStrings) {
  EXPECT_EQ(tok_->vocab_size(), 50257);
  EXPECT_EQ(tok_->eot_id(), 50256);
  EXPECT_EQ(text(50256), "<|endoftext|>");
  using Ids = std::vector<int32_t>;
  // Each id is checked against its text as well as the sequence itself.
  EXPECT_EQ(tok_->encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(text(15496), "Hello");
  EXPECT_EQ(text(995), " world");
  EXPECT_EQ(tok_->encode("Hello, world!"), (Ids{15496, 11, 995, 0}));
  EXPECT_EQ(text(11), ",");
  EXPECT_EQ(text(0), "!");
  EXPECT_EQ(tok_->encode("I can't believe it's 2024!"),
            (Ids{40, 460, 470, 1975, 340, 338, 48609, 0}));
  EXPECT_EQ(text(470), "'t");
  EXPECT_EQ(text(338), "'s");
  EXPECT_EQ(text(48609), " 2024");
  EXPECT_EQ(tok_->encode("\n\n"), (Ids{628}));
  EXPECT_EQ(tok_->encode("a\n\nb"), (Ids{64, 198, 198, 65}));
  EXPECT_EQ(tok_->encode("   indented"), (Ids{220, 220, 773, 4714}));
  // The special token's text is ordinary text to encode().
  EXPECT_EQ(tok_->encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  // Multi-byte characters: é is two bytes, 東京 splits inside a character.
  EXPECT_EQ(tok_->encode("café 東京 🙂"),
            (Ids{66, 1878, 2634, 10545, 251, 109, 12859, 105, 32485}));
  EXPECT_EQ(text(32485), " \xF0\x9F\x99\x82");
}

TEST_F(TokenizerGpt2Real, RoundTripsAnyBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  for (const std::string& s :
       {all, std::string("caf\xC3\xA9 \xFF\xFE broken \xE4\xB8 utf-8\n\t  x"), std::string()})
    EXPECT_EQ(tok_->decode(tok_->encode(s)), s);
}

TEST_F(TokenizerGpt2Real, SameIdsFromManyThreads) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "word" + std::to_string(i * 7919) + " it's café, ";
  std::vector<int32_t> expected = tok_->encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = tok_->encode(text); });
  for (std::thread& t : threads) t.join();
  for (const auto& ids : got) EXPECT_EQ(ids, expected);
}

namespace {

Pieces pieces_of(std::string_view text, PreTokenizer p) {
  Pieces out;
  for (std::string_view s : pre_tokenize(text, p)) out.emplace_back(s);
  return out;
}

}  // namespace

// Llama 3's and Qwen2's patterns, and SmolLM2's digits, on hand-worked texts.
TEST(TokenizerPatterns, Llama3Qwen2AndDigits) {
  const auto llama3 = [](std::string_view t) { return pieces_of(t, PreTokenizer::llama3); };
  EXPECT_EQ(llama3("Hello world's 12345\n\n  x"),
            (Pieces{"Hello", " world", "'s", " ", "123", "45", "\n\n", " ", " x"}));
  EXPECT_EQ(llama3("IT'S"), (Pieces{"IT", "'S"}));              // contractions in any case
  EXPECT_EQ(llama3("(abc) -x"), (Pieces{"(abc", ")", " -", "x"}));  // one non-letter leads a word
  EXPECT_EQ(llama3("end.\nNext"), (Pieces{"end", ".\n", "Next"}));  // punctuation keeps its newlines
  EXPECT_EQ(llama3("a \n b"), (Pieces{"a", " \n", " b"}));
  EXPECT_EQ(llama3("\tword"), (Pieces{"\tword"}));
  EXPECT_EQ(pieces_of("12345 6", PreTokenizer::qwen2), (Pieces{"1", "2", "3", "4", "5", " ", "6"}));
  EXPECT_EQ(pieces_of(" 12ab 7", PreTokenizer::digits), (Pieces{" ", "1", "2", "ab", " ", "7"}));
  EXPECT_EQ(pieces_of("IT'S", PreTokenizer::gpt2), (Pieces{"IT", "'", "S"}));
  for (PreTokenizer p : {PreTokenizer::gpt2, PreTokenizer::llama3, PreTokenizer::qwen2, PreTokenizer::digits,
                         PreTokenizer::o200k}) {
    EXPECT_EQ(parse_pre_tokenizer(pre_tokenizer_name(p)), p);
    std::string joined;
    for (const std::string& s : pieces_of("Mixed: 東京 2024!\r\n\t x  ", p)) joined += s;
    EXPECT_EQ(joined, "Mixed: 東京 2024!\r\n\t x  ") << pre_tokenizer_name(p);
  }
  EXPECT_THROW(parse_pre_tokenizer("sentencepiece"), UsageError);
}

// GPT-4o's o200k pattern (Phi-4-mini's): the pieces V8's regular
// expressions cut these texts into (the pattern with (?i:...) spelled out
// as classes, Node 18), where case runs, marks and modifier letters decide.
TEST(TokenizerPatterns, O200kSplitsAtLetterCase) {
  const auto o200k = [](std::string_view t) { return pieces_of(t, PreTokenizer::o200k); };
  EXPECT_EQ(o200k("\u65e5\u672cAB, x"), (Pieces{"\u65e5\u672c", "AB", ",", " x"}));  // caseless letters given back
  EXPECT_EQ(o200k("e\u0301XY. \u02b0AB!"), (Pieces{"e\u0301", "XY", ".", " \u02b0", "AB", "!"}));
  EXPECT_EQ(o200k(" \u0301abc"), (Pieces{" \u0301abc"}));
  EXPECT_EQ(o200k("\u0301"), (Pieces{"\u0301"}));
  EXPECT_EQ(o200k("HTTPServer's"), (Pieces{"HTTPServer's"}));
  EXPECT_EQ(o200k("THEY'RE they'RE"), (Pieces{"THEY'RE", " they'RE"}));
  EXPECT_EQ(o200k("McDonald's iPhone"), (Pieces{"Mc", "Donald's", " i", "Phone"}));
  EXPECT_EQ(o200k("\u01c5emal \u01c4EMAL"), (Pieces{"\u01c5emal", " \u01c4EMAL"}));
  EXPECT_EQ(o200k(" x\u0308\u0301QR's"), (Pieces{" x\u0308\u0301", "QR's"}));
  EXPECT_EQ(o200k("\u0e01\u0e48A-"), (Pieces{"\u0e01\u0e48", "A", "-"}));
  EXPECT_EQ(o200k("a1234b"), (Pieces{"a", "123", "4", "b"}));
  EXPECT_EQ(o200k("  \n\n  x"), (Pieces{"  \n\n", " ", " x"}));
  EXPECT_EQ(o200k("foo//bar /\n/"), (Pieces{"foo", "//", "bar", " /\n/"}));
  EXPECT_EQ(o200k("-Abc"), (Pieces{"-Abc"}));
  EXPECT_EQ(o200k("\n\u0301x"), (Pieces{"\n", "\u0301x"}));
  EXPECT_EQ(o200k("ABc\u02b0D"), (Pieces{"ABc\u02b0", "D"}));
}

// A trained tokenizer written as tokenizer.json reads back as the same
// tokenizer; added tokens are matched in the text first.
TEST(TokenizerBpe, TrainsSavesAndReadsBack) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 50; ++i) text += "the cat sat on the mat; the cats sat on 12 mats.\n";
  // The text runs out of pairs seen twice before 300 tokens.
  auto tok = BpeTokenizer::train(text, 300, PreTokenizer::llama3);
  const int32_t n = tok->vocab_size();
  EXPECT_GT(n, 265);
  EXPECT_LT(n, 300);
  EXPECT_EQ(tok->eot_id(), n - 1);
  EXPECT_LT(tok->encode(" the cat").size(), 3u);  // merged: fewer tokens than bytes
  tok->save_json(dir.file("tokenizer.json"));
  auto back = BpeTokenizer::from_json(dir.file("tokenizer.json"));
  EXPECT_EQ(back->pre_tokenizer(), PreTokenizer::llama3);
  EXPECT_EQ(back->vocab_size(), n);
  for (const std::string s : {"the cats sat", "a mat<|endoftext|>the cat", "  12 mats\n\n", "東京 🙂 é"}) {
    EXPECT_EQ(back->encode(s), tok->encode(s)) << s;
    EXPECT_EQ(back->decode(back->encode(s)), s);
  }
  const std::vector<int32_t> ids = back->encode("x<|endoftext|>y");
  EXPECT_EQ(ids, (std::vector<int32_t>{'x', n - 1, 'y'}));
  EXPECT_EQ(make_tokenizer(dir.file("tokenizer.json"))->encode("the cat"), tok->encode("the cat"));
  EXPECT_THROW(BpeTokenizer::train(text, 100, PreTokenizer::gpt2), UsageError);
}

// NFC (UAX #15) on cases whose answers Unicode's data fixes.
TEST(TokenizerUnicode, NormalizationFormC) {
  using text::nfc;
  EXPECT_EQ(nfc("plain ascii\n\t~"), "plain ascii\n\t~");
  EXPECT_EQ(nfc(""), "");
  EXPECT_EQ(nfc("caf\u00e9"), "caf\u00e9");                            // already composed
  EXPECT_EQ(nfc("cafe\u0301"), "caf\u00e9");                           // e + acute
  EXPECT_EQ(nfc("\u212b \u2126 \u212a"), "\u00c5 \u03a9 K");           // singletons: Angstrom, ohm, kelvin signs
  EXPECT_EQ(nfc("a\u0323\u0302"), "\u1ead");                           // a, dot below, circumflex: one letter
  EXPECT_EQ(nfc("a\u0302\u0323"), "\u1ead");                           // the marks in the other order
  EXPECT_EQ(nfc("\u1e0b\u0323"), "\u1e0d\u0307");                      // d-dot-above + dot below reorders
  EXPECT_EQ(nfc("q\u0307\u0323"), "q\u0323\u0307");                    // no composite: reordered only
  EXPECT_EQ(nfc("\u0958"), "\u0915\u093c");                            // composition excluded: stays apart
  EXPECT_EQ(nfc("\u0915\u093c"), "\u0915\u093c");
  EXPECT_EQ(nfc("\u1100\u1161\u11a8 \u1112\u1161\u11ab"), "\uac01 \ud55c");  // Hangul jamo: syllables
  EXPECT_EQ(nfc("\uac00\u11a8"), "\uac01");                            // LV + T
  EXPECT_EQ(nfc("\uac01\u11a8"), "\uac01\u11a8");                      // LVT takes no second T
  EXPECT_EQ(nfc("\u03b1\u0313\u0301"), "\u1f04");                      // Greek: psili then oxia
  EXPECT_EQ(nfc("\u0301e"), "\u0301e");                                // a mark before any starter
  EXPECT_EQ(nfc("e\u0300\u0301"), "\u00e8\u0301");                     // the second mark is blocked (same class)
  EXPECT_EQ(nfc("\U0001d15e"), "\U0001d157\U0001d165");                  // musical half note: excluded
  // Bytes that are not UTF-8 pass through and compose with nothing.
  EXPECT_EQ(nfc("e\xff\u0301"), "e\xff\u0301");
  EXPECT_EQ(nfc("\xc3"), "\xc3");
}

// A tokenizer.json with Qwen2's NFC normalizer: the text between added tokens
// is normalized before the pre-tokenizer; written back, it is still there.
TEST(TokenizerBpe, NfcNormalizerComposesFirst) {
  TempDir dir;
  auto tok = BpeTokenizer::train("caf\u00e9 caf\u00e9 caf\u00e9 na\u00efve na\u00efve", 270, PreTokenizer::qwen2);
  tok->save_json(dir.file("plain.json"));
  nlohmann::json j = nlohmann::json::parse(read_file(dir.file("plain.json")));
  j["normalizer"] = {{"type", "NFC"}};
  write_text(dir.file("nfc.json"), j.dump());
  auto nfc = BpeTokenizer::from_json(dir.file("nfc.json"));
  EXPECT_EQ(nfc->encode("cafe\u0301 nai\u0308ve"), tok->encode("caf\u00e9 na\u00efve"));
  EXPECT_NE(tok->encode("cafe\u0301"), tok->encode("caf\u00e9"));
  EXPECT_EQ(nfc->encode("e\u0301<|endoftext|>\u0301"), tok->encode("\u00e9<|endoftext|>\u0301"));
  nfc->save_json(dir.file("again.json"));
  auto again = BpeTokenizer::from_json(dir.file("again.json"));
  EXPECT_EQ(again->encode("cafe\u0301"), tok->encode("caf\u00e9"));
}

// SentencePiece-style BPE (Llama 2's tokenizer.json): pieces with U+2581 for
// spaces, merges by rank, unknown characters as <unk> (fused), the marker
// before every segment (legacy) or the text's first (Metaspace first).
TEST(TokenizerBpe, SentencePiecePieces) {
  TempDir dir;
  const std::string m = "\u2581";
  nlohmann::json j = {
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", m}}, {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", m}}}}}},
      {"pre_tokenizer", nullptr},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {m, 3}, {"a", 4}, {"b", 5}, {m + "a", 6}, {"ab", 7}, {m + "ab", 8}}},
        {"merges", {m + " a", "a b", m + "a b"}}}}};
  write_text(dir.file("legacy.json"), j.dump());
  auto legacy = BpeTokenizer::from_json(dir.file("legacy.json"));
  EXPECT_EQ(legacy->encode("ab ab"), (std::vector<int32_t>{8, 8}));
  EXPECT_EQ(legacy->encode("abc"), (std::vector<int32_t>{8, 0}));
  EXPECT_EQ(legacy->encode("cc"), (std::vector<int32_t>{3, 0}));  // one <unk> for both
  EXPECT_EQ(legacy->encode("a</s>b"), (std::vector<int32_t>{6, 2, 3, 5}));
  EXPECT_EQ(legacy->decode(std::vector<int32_t>{8, 8}), "ab ab");
  EXPECT_EQ(legacy->eot_id(), 2);
  // Written back as Hugging Face writes it: the same file's meaning.
  legacy->save_json(dir.file("back.json"));
  const nlohmann::json back = nlohmann::json::parse(read_file(dir.file("back.json")));
  EXPECT_EQ(back["normalizer"], j["normalizer"]);
  EXPECT_EQ(back["model"]["vocab"], j["model"]["vocab"]);
  EXPECT_EQ(back["model"]["merges"], nlohmann::json::parse(R"([["▁", "a"], ["a", "b"], ["▁a", "b"]])"));
  EXPECT_EQ(back["model"]["unk_token"], "<unk>");
  EXPECT_TRUE(back["model"]["byte_fallback"]);
  for (const char* text : {"ab ab", "abc", "cc", "a</s>b"}) {
    EXPECT_EQ(BpeTokenizer::from_json(dir.file("back.json"))->encode(text), legacy->encode(text)) << text;
  }
  // As GGUF's "llama" vocabulary: scores from the merges' order, the same ids.
  const GgufVocabulary v = legacy->gguf_vocabulary();
  EXPECT_EQ(v.model, "llama");
  EXPECT_EQ(v.tokens[8], m + "ab");
  EXPECT_EQ(v.types, (std::vector<int32_t>{2, 3, 3, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(v.scores, (std::vector<float>{0, 0, 0, -6, -7, -8, 0, -1, -2}));
  EXPECT_EQ(v.unk, 0);
  EXPECT_TRUE(v.add_space_prefix);
  auto scored = BpeTokenizer::from_gguf_vocabulary(v, "memory");
  for (const char* text : {"ab ab", "abc", "a</s>b", " b a", ""}) EXPECT_EQ(scored->encode(text), legacy->encode(text)) << text;
  EXPECT_EQ(scored->encode("cc"), (std::vector<int32_t>{3, 0, 0}));  // llama.cpp does not fuse <unk>s

  // Byte pieces are "<0x" two hex digits ">"; anything else is an ordinary token.
  nlohmann::json bytes = j;
  bytes["model"]["vocab"]["<0x63>"] = 9;
  bytes["model"]["vocab"]["<0x-A>"] = 10;  // sscanf("%2X") read this as byte -10
  write_text(dir.file("bytes.json"), bytes.dump());
  auto with_bytes = BpeTokenizer::from_json(dir.file("bytes.json"));
  EXPECT_EQ(with_bytes->encode("abc"), (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(with_bytes->decode(std::vector<int32_t>{8, 9, 10}), "abc<0x-A>");

  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "first"}, {"split", false}};
  write_text(dir.file("metaspace.json"), j.dump());
  auto metaspace = BpeTokenizer::from_json(dir.file("metaspace.json"));
  EXPECT_EQ(metaspace->encode("a</s>b"), (std::vector<int32_t>{6, 2, 5}));
  EXPECT_EQ(metaspace->encode(" ab"), (std::vector<int32_t>{8}));  // a leading space is the marker itself

  // Gemma's: spaces replaced, nothing prepended (its Split at spaces finds none).
  nlohmann::json gemma = j;
  gemma["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", m}};
  gemma["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"},
                            {"invert", false}};
  write_text(dir.file("gemma.json"), gemma.dump());
  auto gemma_tok = BpeTokenizer::from_json(dir.file("gemma.json"));
  EXPECT_EQ(gemma_tok->encode("ab ab"), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(gemma_tok->decode(std::vector<int32_t>{8, 7}), " abab");
  EXPECT_FALSE(gemma_tok->gguf_vocabulary().add_space_prefix);
  gemma["pre_tokenizer"]["behavior"] = "Isolated";
  write_text(dir.file("bad.json"), gemma.dump());
  EXPECT_THROW(BpeTokenizer::from_json(dir.file("bad.json")), IoError);

  j["pre_tokenizer"]["replacement"] = "_";
  write_text(dir.file("bad.json"), j.dump());
  EXPECT_THROW(BpeTokenizer::from_json(dir.file("bad.json")), IoError);
  j["pre_tokenizer"]["replacement"] = m;
  for (const char* field : {"replacement", "prepend_scheme", "split"}) {
    nlohmann::json wrong = j;
    wrong["pre_tokenizer"][field] = 3;
    write_text(dir.file("bad.json"), wrong.dump());
    try {
      BpeTokenizer::from_json(dir.file("bad.json"));
      ADD_FAILURE() << "no error for pre_tokenizer." << field << " = 3";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("pre_tokenizer.") + field + " is 3"), std::string::npos) << e.what();
    }
  }
  j["model"].erase("unk_token");
  write_text(dir.file("bad.json"), j.dump());
  try {
    BpeTokenizer::from_json(dir.file("bad.json"));
    ADD_FAILURE() << "no error for a vocabulary without <unk> or byte tokens";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("unk_token"), std::string::npos) << e.what();
  }
}

TEST(TokenizerBpe, UnsupportedTokenizerJsonIsAnIoErrorNamingTheFile) {
  TempDir dir;
  auto tok = BpeTokenizer::train("aaa bbb aaa bbb ccc ccc", 260, PreTokenizer::gpt2);
  tok->save_json(dir.file("good.json"));
  const nlohmann::json good = nlohmann::json::parse(read_file(dir.file("good.json")));
  auto expect_error = [&](const std::function<void(nlohmann::json&)>& change, const std::string& says) {
    nlohmann::json j = good;
    change(j);
    write_text(dir.file("bad.json"), j.dump());
    try {
      BpeTokenizer::from_json(dir.file("bad.json"));
      ADD_FAILURE() << "no error; expected " << says;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(dir.file("bad.json")), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_error([](auto& j) { j["model"]["type"] = "WordPiece"; }, "model.type must be \"BPE\"");
  expect_error([](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer");
  expect_error([](auto& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}}; },
               "normalizer");
  expect_error([](auto& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre_tokenizer");
  expect_error([](auto& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }, "pre_tokenizer");
  expect_error([](auto& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback");
  expect_error([](auto& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "continuing_subword_prefix");
  expect_error([](auto& j) { j["model"]["vocab"]["x y"] = 100; }, "outside GPT-2's byte alphabet");
  expect_error([](auto& j) { j["model"]["vocab"]["zz"] = 5000; }, "expected an id in [0, 261)");
  expect_error([](auto& j) { j["model"]["merges"].push_back("c q"); }, "makes a token the vocabulary lacks");
  expect_error([](auto& j) { j["model"]["merges"].push_back("c zz"); }, "is not in model.vocab");
  expect_error([](auto& j) { j["model"]["merges"].push_back(7); }, "model.merges[");
  expect_error([](auto& j) { j["added_tokens"][0]["id"] = 97; }, "which model.vocab gives to");
  expect_error([](auto& j) { j["added_tokens"][0]["single_word"] = true; }, "single_word");
  // Fields of another type are named (nlohmann's value() threw its own type_error).
  expect_error([](auto& j) { j["model"]["type"] = 5; }, "model.type must be \"BPE\"");
  expect_error([](auto& j) { j["pre_tokenizer"]["type"] = 7; }, "pre_tokenizer");
  expect_error([](auto& j) { j["pre_tokenizer"]["add_prefix_space"] = "no"; },
               "pre_tokenizer.add_prefix_space is \"no\", expected true or false");
  expect_error([](auto& j) { j["pre_tokenizer"]["use_regex"] = 1; }, "pre_tokenizer.use_regex is 1");
  expect_error([](auto& j) { j["model"]["fuse_unk"] = 1; }, "model.fuse_unk is 1, expected true or false");
  expect_error([](auto& j) { j["model"]["ignore_merges"] = "x"; }, "model.ignore_merges is \"x\"");
  expect_error([](auto& j) { j["added_tokens"][0]["special"] = "yes"; }, ".special is \"yes\"");
  expect_error([](auto& j) { j["model"]["dropout"] = 0.1; }, "model.dropout");
  // Null is absent, as Hugging Face writes an unset option.
  nlohmann::json nulls = good;
  nulls["model"]["fuse_unk"] = nullptr;
  nulls["model"]["ignore_merges"] = nullptr;
  nulls["pre_tokenizer"]["add_prefix_space"] = nullptr;
  nulls["post_processor"] = {{"type", 3}};  // not a TemplateProcessing: adds nothing
  write_text(dir.file("nulls.json"), nulls.dump());
  EXPECT_EQ(BpeTokenizer::from_json(dir.file("nulls.json"))->encode("aaa ccc"), tok->encode("aaa ccc"));
  write_text(dir.file("bad.json"), "{\"model\": ");
  EXPECT_THROW(BpeTokenizer::from_json(dir.file("bad.json")), IoError);
  EXPECT_THROW(BpeTokenizer::from_json(dir.file("missing.json")), IoError);
}

// A tokenizer as GGUF's tokenizer.ggml.* vocabulary reads back as the same
// tokenizer: the same ids on every text, and the same vocabulary again.
TEST(TokenizerGguf, VocabularyRoundTrips) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "the cat sat on the mat; the cats sat on 1234 mats. 東京 🙂\n";
  for (PreTokenizer p : {PreTokenizer::gpt2, PreTokenizer::qwen2, PreTokenizer::digits}) {
    auto tok = BpeTokenizer::train(text, 320, p);
    const GgufVocabulary v = tok->gguf_vocabulary();
    EXPECT_EQ(v.tokens.size(), size_t(tok->vocab_size()));
    EXPECT_EQ(v.eot, tok->eot_id());
    EXPECT_EQ(v.types[size_t(v.eot)], 3);  // control
    auto back = BpeTokenizer::from_gguf_vocabulary(v, "memory");
    EXPECT_EQ(back->pre_tokenizer(), p);
    EXPECT_EQ(back->eot_id(), tok->eot_id());
    for (const std::string s : {"the cats sat", "a mat<|endoftext|>the cat", "  1234 mats\n\n", "東京 🙂 é x"}) {
      EXPECT_EQ(back->encode(s), tok->encode(s)) << pre_tokenizer_name(p) << ": " << s;
      EXPECT_EQ(back->decode(back->encode(s)), s);
    }
    const GgufVocabulary again = back->gguf_vocabulary();
    EXPECT_EQ(again.pre, v.pre);
    EXPECT_EQ(again.tokens, v.tokens);
    EXPECT_EQ(again.types, v.types);
    EXPECT_EQ(again.merges, v.merges);
  }
  EXPECT_EQ(BpeTokenizer::train(text, 300, PreTokenizer::qwen2)->gguf_vocabulary().pre, "qwen2");
  EXPECT_EQ(BpeTokenizer::train(text, 300, PreTokenizer::digits)->gguf_vocabulary().pre, "smollm");
  // The byte vocabulary: ids are bytes, nothing merged, no end-of-text token.
  auto bytes = BpeTokenizer::bytes_only();
  EXPECT_EQ(bytes->encode("ab\n"), (std::vector<int32_t>{'a', 'b', '\n'}));
  GgufVocabulary bv = bytes->gguf_vocabulary();
  bv.eot = '\n';
  EXPECT_EQ(BpeTokenizer::from_gguf_vocabulary(bv, "memory")->eot_id(), -1);
}

namespace {

// `good` changed by `change` is refused with an IoError naming the source
// and saying `says`.
void expect_gguf_error(const GgufVocabulary& good, const std::function<void(GgufVocabulary&)>& change,
                       const std::string& says) {
  GgufVocabulary v = good;
  change(v);
  try {
    BpeTokenizer::from_gguf_vocabulary(v, "model.gguf");
    ADD_FAILURE() << "no error; expected " << says;
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("model.gguf: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

}  // namespace

// GGUF's "llama" vocabulary (Llama 2, TinyLlama, Mistral) as llama.cpp
// tokenizes it: a space before the text and after each added token, spaces
// as U+2581, adjacent symbols whose text is a token merged highest score
// first, characters without a token as <0xXX> bytes, else <unk>.
TEST(TokenizerGguf, SentencePieceMergesByScore) {
  const std::string m = "\u2581";
  GgufVocabulary v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", m, "a", "b", "c", "ab", "bc", m + "a", "<0x0A>", "abc", "[pad]"};
  v.types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6, 1, 5};
  v.scores = {0, 0, 0, -10, -10, -10, -10, -2, -1, -3, 0, -20, 0};
  v.eot = 2;
  v.bos = 1;
  v.add_bos = true;
  auto tok = BpeTokenizer::from_gguf_vocabulary(v, "memory");
  // "bc" (-1) before "ab" (-2): ▁ a bc, then "▁a" (-3) before "abc" (-20).
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{9, 8}));
  EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(tok->encode("x\n"), (std::vector<int32_t>{3, 0, 10}));  // no token, no byte token: <unk>
  EXPECT_EQ(tok->encode("xy"), (std::vector<int32_t>{3, 0, 0}));     // not fused
  EXPECT_EQ(tok->encode("a</s>b"), (std::vector<int32_t>{9, 2, 3, 5}));
  EXPECT_EQ(tok->encode(" a"), (std::vector<int32_t>{3, 9}));
  EXPECT_EQ(tok->encode(""), (std::vector<int32_t>{}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{9, 8, 10, 3, 5}), "abc\n b");
  EXPECT_EQ(tok->prefix_ids(), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok->eot_id(), 2);
  // Equal scores: the leftmost pair first.
  GgufVocabulary tie = v;
  tie.scores[7] = tie.scores[8] = -1;
  EXPECT_EQ(BpeTokenizer::from_gguf_vocabulary(tie, "memory")->encode("abc"), (std::vector<int32_t>{3, 11}));
  // Without the space prefix.
  GgufVocabulary bare = v;
  bare.add_space_prefix = false;
  EXPECT_EQ(BpeTokenizer::from_gguf_vocabulary(bare, "memory")->encode("abc"), (std::vector<int32_t>{11}));
  // Written back as it was read.
  const GgufVocabulary again = tok->gguf_vocabulary();
  EXPECT_EQ(again.model, "llama");
  EXPECT_EQ(again.tokens, (std::vector<std::string>{"<unk>", "<s>", "</s>", m, "a", "b", "c", "ab", "bc", m + "a",
                                                    "<0x0A>", "abc", "[pad]"}));
  EXPECT_EQ(again.types, v.types);
  EXPECT_EQ(again.scores, v.scores);
  EXPECT_EQ(again.unk, 0);
  EXPECT_TRUE(again.add_bos);
  EXPECT_EQ(again.bos, 1);
  // As tokenizer.json: every split of a token a merge, by score, then id.
  TempDir dir;
  tok->save_json(dir.file("tokenizer.json"));
  const nlohmann::json j = nlohmann::json::parse(read_file(dir.file("tokenizer.json")));
  EXPECT_EQ(j["model"]["merges"], nlohmann::json::parse(R"([["b", "c"], ["a", "b"], ["▁", "a"], ["a", "bc"], ["ab", "c"]])"));
  EXPECT_EQ(j["model"]["vocab"].size(), v.tokens.size());
  EXPECT_FALSE(j["model"]["fuse_unk"]);
  auto json_tok = BpeTokenizer::from_json(dir.file("tokenizer.json"));
  for (const char* text : {"abc", "ab", "x\n", "xy", "a</s>b", " a", "", "bcabc abcab"}) {
    EXPECT_EQ(json_tok->encode(text), tok->encode(text)) << text;
  }
  EXPECT_EQ(json_tok->prefix_ids(), (std::vector<int32_t>{1}));

  auto expect_error = [&](const std::function<void(GgufVocabulary&)>& change, const std::string& says) {
    expect_gguf_error(v, change, says);
  };
  expect_error([](auto& b) { b.scores.pop_back(); }, "tokenizer.ggml.scores has 12 entries for 13 tokens");
  expect_error([](auto& b) { b.scores[4] = std::nanf(""); }, "tokenizer.ggml.scores[4] is not finite");
  expect_error([](auto& b) { b.tokens[10] = "<0x-A>"; }, "is a byte token, expected <0xXX>");
  expect_error([](auto& b) { b.types[4] = 7; }, "token type 7");
  expect_error([](auto& b) { b.tokens[5] = b.tokens[4]; }, "appears twice");
  expect_error([](auto& b) { b.tokens[5] = ""; }, "is empty");
  expect_error([](auto& b) { b.types[0] = 1; }, "no unknown token");
  expect_error([](auto& b) { b.unk = 13; }, "unknown_token_id 13 is not a token");
  expect_error([](auto& b) { b.model = "t5"; }, "tokenizer.ggml.model \"t5\" is not supported");
  expect_error([](auto& b) { b.tokens[4] = "\xE2\x96"; }, "token 4 '\xE2\x96' is not valid UTF-8");
  expect_error([](auto& b) { b.tokens[12].assign(1, char(0xFF)); }, "token 12 '\xFF' is not valid UTF-8");  // unused, still text
}

// llama.cpp ignores merges for Llama 3's pattern: a tokenizer that does not
// cannot be written as one, and one read from GGUF does.
TEST(TokenizerGguf, Llama3PatternIgnoresMerges) {
  auto tok = BpeTokenizer::train("aaa bbb aaa bbb ccc ccc", 260, PreTokenizer::llama3);
  EXPECT_THROW(tok->gguf_vocabulary(), UsageError);
  GgufVocabulary v = BpeTokenizer::train("aaa bbb aaa bbb", 260, PreTokenizer::gpt2)->gguf_vocabulary();
  v.pre = "llama-bpe";
  EXPECT_EQ(BpeTokenizer::from_gguf_vocabulary(v, "memory")->pre_tokenizer(), PreTokenizer::llama3);
}

TEST(TokenizerGguf, BadVocabulariesAreIoErrorsNamingTheSource) {
  const GgufVocabulary good = BpeTokenizer::train("aaa bbb aaa bbb ccc ccc", 262, PreTokenizer::gpt2)->gguf_vocabulary();
  auto expect_error = [&](const std::function<void(GgufVocabulary&)>& change, const std::string& says) {
    expect_gguf_error(good, change, says);
  };
  expect_error([](auto& v) { v.pre = "default"; }, "tokenizer.ggml.pre \"default\" is not supported");
  expect_error([](auto& v) { v.types[40] = 2; }, "token type 2");
  expect_error([](auto& v) { v.types.pop_back(); }, "token_type has");
  expect_error([](auto& v) { v.tokens[40] = "x y"; }, "outside GPT-2's byte alphabet");
  expect_error([](auto& v) { v.tokens[41] = v.tokens[40]; }, "appears twice");
  expect_error([](auto& v) { v.types['a'] = 5; }, "no token for byte 97");
  expect_error([](auto& v) { v.merges.push_back("a"); }, "expected \"left right\"");
  expect_error([](auto& v) { v.merges.push_back("a zz"); }, "is not a normal token");
  expect_error([](auto& v) { v.merges.push_back("c q"); }, "makes a token the vocabulary lacks");
  expect_error([](auto& v) { v.tokens.clear(); v.types.clear(); }, "expected 1 to 2^24 - 1");
}

// A TemplateProcessing post-processor's leading special token is the
// tokenizer's prefix (Llama 3's <|begin_of_text|>), kept through
// tokenizer.json and GGUF; encode() adds nothing.
TEST(TokenizerBpe, PostProcessorPrefix) {
  TempDir dir;
  auto tok = BpeTokenizer::train("aaa bbb aaa bbb ccc ccc", 262, PreTokenizer::llama3);
  tok->save_json(dir.file("plain.json"));
  nlohmann::json j = nlohmann::json::parse(read_file(dir.file("plain.json")));
  const int32_t bos = tok->eot_id();  // <|endoftext|> standing in for <|begin_of_text|>
  EXPECT_TRUE(tok->prefix_ids().empty());
  j["model"]["ignore_merges"] = true;
  j["post_processor"] = nlohmann::json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [],
       "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [)" + std::to_string(bos) + R"(],
                                           "tokens": ["<|endoftext|>"]}}}]})");
  write_text(dir.file("bos.json"), j.dump());
  auto with = BpeTokenizer::from_json(dir.file("bos.json"));
  EXPECT_EQ(with->prefix_ids(), (std::vector<int32_t>{bos}));
  EXPECT_EQ(with->encode("aaa"), tok->encode("aaa"));
  with->save_json(dir.file("again.json"));
  EXPECT_EQ(BpeTokenizer::from_json(dir.file("again.json"))->prefix_ids(), (std::vector<int32_t>{bos}));
  const GgufVocabulary v = with->gguf_vocabulary();
  EXPECT_TRUE(v.add_bos);
  EXPECT_EQ(v.bos, bos);
  EXPECT_EQ(BpeTokenizer::from_gguf_vocabulary(v, "memory")->prefix_ids(), (std::vector<int32_t>{bos}));
  GgufVocabulary bad = v;
  bad.bos = int32_t(v.tokens.size());
  EXPECT_THROW(BpeTokenizer::from_gguf_vocabulary(bad, "memory"), IoError);
  j["post_processor"]["processors"][1]["special_tokens"]["<|endoftext|>"]["ids"] = nlohmann::json::array({100000});
  write_text(dir.file("bad.json"), j.dump());
  EXPECT_THROW(BpeTokenizer::from_json(dir.file("bad.json")), IoError);
}
