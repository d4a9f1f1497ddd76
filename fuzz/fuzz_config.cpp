// The JSON a checkpoint carries: the model configs (VitConfig::from_json in
// models/vit.h, Gpt2Config::from_json in models/gpt2.h, LlamaConfig::from_json
// in models/llama.h, which also reads Hugging Face's config.json) and the training
// position (TrainPosition::from_json in include/nabla/checkpoint.h).
#include <string>

#include "fuzz_util.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/models/vit.h"
#include "nabla/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nabla;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean("", [&] {
    models::VitConfig c = models::VitConfig::from_json(text);
    // A config that parses round-trips.
    if (models::VitConfig::from_json(c.to_json()).to_json() != c.to_json()) std::abort();
    (void)c.parameter_count();
  });
  fuzz::expect_clean("", [&] {
    models::Gpt2Config c = models::Gpt2Config::from_json(text);
    if (models::Gpt2Config::from_json(c.to_json()).to_json() != c.to_json()) std::abort();
    (void)c.parameter_count();
  });
  fuzz::expect_clean("", [&] {
    models::LlamaConfig c = models::LlamaConfig::from_json(text);
    if (models::LlamaConfig::from_json(c.to_json()).to_json() != c.to_json()) std::abort();
    (void)c.parameter_count();
  });
  fuzz::expect_clean("position.json", [&] { TrainPosition::from_json(text, "position.json"); });
  return 0;
}
