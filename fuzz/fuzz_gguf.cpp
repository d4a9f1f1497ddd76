// read_gguf (include/nabla/gguf.h) on arbitrary bytes, block formats
// included, then a Llama checkpoint from it (checkpoint_from_gguf,
// include/nabla/models/gguf.h) and the model that checkpoint loads into, and
// the tokenizer it carries (BpeTokenizer::from_gguf) encoding and decoding.
#include <optional>

#include "fuzz_util.h"
#include "nabla/gguf.h"
#include "nabla/models/gguf.h"
#include "nabla/models/llama.h"
#include "nabla/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nabla;
  const std::string path = fuzz::write_input("input.gguf", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean(path, [&] {
    GgufFile f = read_gguf(path);
    unsigned char sink = 0;
    for (const GgufTensor& t : f.tensors) {
      const auto* p = static_cast<const unsigned char*>(t.tensor.data());
      for (size_t i = 0; i < size_t(t.tensor.numel()) * dtype_size(t.tensor.dtype()); ++i) sink ^= p[i];
    }
    for (const auto& [key, value] : f.metadata) sink ^= static_cast<unsigned char>(value.type());
    volatile unsigned char keep = sink;
    (void)keep;
  });
  fuzz::expect_clean(path, [&] {
    Checkpoint ckpt = models::checkpoint_from_gguf(path);
    models::Llama m(models::llama_config_from_checkpoint(ckpt), 0);
    load_params(ckpt, m.params());
  });
  fuzz::expect_clean(path, [&] {
    auto tok = BpeTokenizer::from_gguf(path);
    const std::vector<int32_t> ids = tok->encode("fuzz <|endoftext|> 1234 東京 🙂\n</s>fuzzz \xF0\x9F");
    volatile size_t keep = tok->decode(ids).size();
    (void)keep;
  });
  return 0;
}
