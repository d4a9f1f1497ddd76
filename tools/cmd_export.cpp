// `nabla export gguf`: a checkpoint's weights as a GGUF file (ggml's
// format), with the model's hyperparameters as metadata under
// general.architecture's prefix. ViT tensors keep their timm names; shapes
// are written in ggml order (innermost first) by GgufWriter.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "models/vit.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/gguf.h"

namespace nabla::cli {

int run_export_gguf(const ExportArgs& a) {
  Checkpoint ckpt = load_checkpoint(a.checkpoint);
  nlohmann::json cfg = nlohmann::json::parse(ckpt.config_json);
  std::string arch = cfg.value("architecture", "");
  GgufWriter w;
  w.set("general.architecture", arch);
  w.set("general.name", cfg.value("preset", arch).empty() ? arch : cfg.value("preset", arch));
  w.set("general.file_type", uint32_t(0));  // all tensors f32
  if (arch == "vit") {
    models::VitConfig c = models::VitConfig::from_json(ckpt.config_json);
    w.set("vit.image_size", uint32_t(c.img_size));
    w.set("vit.patch_size", uint32_t(c.patch_size));
    w.set("vit.num_channels", uint32_t(c.in_chans));
    w.set("vit.embedding_length", uint32_t(c.embed_dim));
    w.set("vit.block_count", uint32_t(c.depth));
    w.set("vit.attention.head_count", uint32_t(c.num_heads));
    w.set("vit.feed_forward_length", uint32_t(c.mlp_hidden()));
    w.set("vit.attention.layer_norm_epsilon", float(c.norm_eps));
    w.set("vit.num_classes", uint32_t(c.num_classes));
    w.set("vit.global_pool", c.global_pool);
    w.set("vit.gelu", c.gelu);
    w.set("vit.qkv_bias", c.qkv_bias);
    models::Vit model(c, 0);
    load_params(ckpt, model.params());
    for (const auto& [name, t] : model.params().list()) w.add_tensor(name, t);
  } else {
    throw UsageError(a.checkpoint + ": GGUF export supports architecture \"vit\", got \"" + arch + "\"");
  }
  w.write(a.out);
  fmt::print("wrote {} ({} architecture)\n", a.out, arch);
  return kExitOk;
}

}  // namespace nabla::cli
