// `nabla export gguf`: a checkpoint's weights as a GGUF file (ggml's
// format). The mapping of each architecture (tensor names, transposes,
// metadata keys, GPT-2's tokenizer) lives in models/gguf_export.h.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "nabla/models/gguf_export.h"
#include "nabla/checkpoint.h"

namespace nabla::cli {

int run_export_gguf(const ExportArgs& a) {
  Checkpoint ckpt = load_checkpoint(a.checkpoint);
  GgufWriter w = models::gguf_from_checkpoint(ckpt, {.vocab_dir = a.vocab});
  w.write(a.out);
  // gguf_from_checkpoint accepted the config, so it is an object naming its architecture.
  std::string arch = nlohmann::json::parse(ckpt.config_json).at("architecture").get<std::string>();
  fmt::print("wrote {} ({} architecture)\n", a.out, arch);
  return kExitOk;
}

}  // namespace nabla::cli
