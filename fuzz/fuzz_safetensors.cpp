// load_safetensors (include/nabla/io.h) on arbitrary bytes.
#include <cstring>

#include "fuzz_util.h"
#include "nabla/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nabla;
  const std::string path = fuzz::write_input("input.safetensors", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean(path, [&] {
    Safetensors st = load_safetensors(path);
    // Touch every byte read, so a tensor that claims more than it holds shows.
    unsigned char sink = 0;
    for (const auto& [name, t] : st.tensors) {
      const auto* p = static_cast<const unsigned char*>(t.data());
      for (size_t i = 0; i < size_t(t.numel()) * dtype_size(t.dtype()); ++i) sink ^= p[i];
    }
    for (const auto& [k, v] : st.metadata) sink ^= static_cast<unsigned char>(k.size() + v.size());
    volatile unsigned char keep = sink;
    (void)keep;
  });
  return 0;
}
