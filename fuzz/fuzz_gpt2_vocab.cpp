// Gpt2Tokenizer (include/nabla/tokenizer.h) loading encoder.json and
// vocab.bpe. The input is encoder.json, a NUL byte, then vocab.bpe (no NUL:
// all of it is encoder.json and vocab.bpe is empty). A vocabulary that loads
// must encode and decode without error, and decode(encode(s)) == s.
#include <filesystem>
#include <string_view>

#include "fuzz_util.h"
#include "nabla/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nabla;
  static const std::string dir = [] {
    std::string d = fuzz::scratch_dir() + "/vocab";
    std::filesystem::create_directories(d);
    return d;
  }();
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t nul = in.find('\0');
  std::string_view encoder = in.substr(0, nul), merges = nul == in.npos ? "" : in.substr(nul + 1);
  fuzz::write_input("vocab/encoder.json", encoder);
  fuzz::write_input("vocab/vocab.bpe", merges);
  fuzz::expect_clean(dir, [&] {
    Gpt2Tokenizer tok(dir);
    // Text that exercises the merges: the merges file itself, then all bytes.
    std::string text(merges.substr(0, 512));
    for (int b = 0; b < 256; ++b) text += static_cast<char>(b);
    std::vector<int32_t> ids = tok.encode(text);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size()) std::abort();
    }
    if (tok.decode(ids) != text) {
      std::fprintf(stderr, "decode(encode(text)) != text\n");
      std::abort();
    }
  });
  return 0;
}
