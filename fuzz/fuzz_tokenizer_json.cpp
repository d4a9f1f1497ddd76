// BpeTokenizer::from_json (include/nabla/tokenizer.h) on a tokenizer.json. A
// tokenizer that loads must encode a text made of its own file and every
// byte into ids inside its vocabulary, and decode them without error.
#include <string_view>

#include "fuzz_util.h"
#include "nabla/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nabla;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::string path = fuzz::write_input("tokenizer.json", in);
  fuzz::expect_clean(path, [&] {
    auto tok = BpeTokenizer::from_json(path);
    std::string text(in.substr(0, 512));
    for (int b = 0; b < 256; ++b) text += static_cast<char>(b);
    const std::vector<int32_t> ids = tok->encode(text);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size()) std::abort();
    }
    (void)tok->decode(ids);
  });
  return 0;
}
