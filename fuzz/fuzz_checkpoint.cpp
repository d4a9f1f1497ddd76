// The checkpoint reader as `nabla eval`, `sample` and `--resume` use it:
// load_checkpoint (include/nabla/checkpoint.h), the model config it carries,
// then the weights and optimizer moments copied into a model built from that
// config (include/nabla/checkpoint.h, models/vit.h, models/gpt2.h, models/llama.h).
#include <optional>
#include <vector>

#include "fuzz_util.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/llama.h"
#include "nabla/models/vit.h"
#include "nabla/checkpoint.h"
#include "nabla/optim.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace nabla;
  const std::string path = fuzz::write_input("ckpt.safetensors", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean(path, [&] {
    Checkpoint ckpt = load_checkpoint(path);
    nn::Params* params = nullptr;
    std::optional<models::Vit> vit;
    std::optional<models::Gpt2> gpt2;
    std::optional<models::Llama> llama;
    if (ckpt.architecture == "vit") {
      vit.emplace(models::vit_config_from_checkpoint(ckpt), 0);
      params = &vit->params();
    } else if (ckpt.architecture == "llama") {
      llama.emplace(models::llama_config_from_checkpoint(ckpt), 0);
      params = &llama->params();
    } else {
      gpt2.emplace(models::gpt2_config_from_checkpoint(ckpt), 0);
      params = &gpt2->params();
    }
    load_params(ckpt, *params);
    if (ckpt.has_position) {
      std::vector<optim::Slot> slots;
      for (const auto& [name, t] : params->list()) slots.push_back({name, t});
      optim::AdamW adamw(slots, {}, 1);
      load_optimizer_state(ckpt, adamw);
    }
  });
  return 0;
}
