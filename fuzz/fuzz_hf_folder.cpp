// A Hugging Face model folder as load_checkpoint reads it (include/nabla/
// checkpoint.h): the input is model.safetensors.index.json; the folder holds
// a small Llama's config.json and its weights in two shards, so an index
// that parses goes on to the config and to load_params (models/llama.h).
#include <string>

#include "fuzz_util.h"
#include "nabla/checkpoint.h"
#include "nabla/io.h"
#include "nabla/models/llama.h"

namespace {

// Two shards under names a mutated index may or may not use.
const std::string& folder() {
  static const std::string dir = [] {
    using namespace nabla;
    const std::string d = fuzz::scratch_dir() + "/hf";
    std::filesystem::create_directories(d);
    models::LlamaConfig c = models::llama_preset("llama-tiny-byte");
    c.vocab_size = 8;
    c.hidden_size = 8;
    c.intermediate_size = 8;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    models::Llama m(c, 1);
    auto list = m.params().list();
    save_safetensors(d + "/a.safetensors", {list.begin(), list.begin() + 3});
    save_safetensors(d + "/b.safetensors", {list.begin() + 3, list.end()});
    write_file_atomic(d + "/config.json", c.to_json());
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nabla;
  const std::string& dir = folder();
  fuzz::write_input("hf/model.safetensors.index.json", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean(dir, [&] {
    Checkpoint ckpt = load_checkpoint(dir);
    models::Llama m(models::llama_config_from_checkpoint(ckpt), 0);
    load_params(ckpt, m.params());
  });
  return 0;
}
