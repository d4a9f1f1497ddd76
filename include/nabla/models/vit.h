// Vision Transformer (Dosovitskiy et al.), laid out as timm's
// VisionTransformer so that parameter names and shapes match its checkpoints.
#pragma once

#include <cstdint>
#include <string>

#include "nabla/nn.h"

namespace nabla {
struct Checkpoint;
}

namespace nabla::models {

struct VitConfig {
  std::string preset;          // informational
  int64_t img_size = 224;
  int64_t patch_size = 16;
  int64_t in_chans = 3;
  int64_t embed_dim = 192;
  int64_t depth = 12;
  int64_t num_heads = 3;
  double mlp_ratio = 4.0;
  int64_t num_classes = 1000;
  std::string global_pool = "token";  // "token" (cls token) or "avg" (mean of patch tokens)
  bool qkv_bias = true;
  double norm_eps = 1e-6;             // timm's ViT LayerNorm eps
  std::string gelu = "gelu_erf";      // timm's nn.GELU is the exact (erf) GELU
  double drop_rate = 0.0;             // dropout after attention and MLP (timm's proj_drop)

  int64_t tokens() const { return (img_size / patch_size) * (img_size / patch_size) + (global_pool == "token"); }
  int64_t mlp_hidden() const { return static_cast<int64_t>(embed_dim * mlp_ratio); }
  // Throws UsageError on inconsistent values (patch does not divide the image...).
  void validate() const;
  // Elements in the parameters Vit builds from this (valid) config (saturates at
  // INT64_MAX); known before anything is allocated.
  int64_t parameter_count() const;
  // {"architecture": "vit", "img_size": ..., ...} with timm's names.
  std::string to_json() const;
  static VitConfig from_json(const std::string& json);
};

// "vit-tiny" (timm vit_tiny_patch16_224), "fmnist" (28x28x1, see vit.cpp).
VitConfig vit_preset(const std::string& name);
std::vector<std::string> vit_presets();

// The config of a ViT checkpoint. IoError naming the file when it holds
// another architecture, a bad config, or fewer values than the config's
// parameters need (so a damaged config cannot make Vit allocate without bound).
VitConfig vit_config_from_checkpoint(const Checkpoint& ckpt);

class Vit {
 public:
  Vit(const VitConfig& config, uint64_t seed);

  // images [N, C, H, W] (normalised) -> logits [N, classes]. With train,
  // dropout draws from `dropout_seed` (an i32 leaf the trainer rewrites).
  Tensor forward(const Tensor& images, bool train) const;
  // Gradient checkpointing: each block's activations recomputed in the
  // backward from its input. The same values and gradients for a fraction
  // of the activation memory (a block's forward runs twice).
  void set_gradient_checkpointing(bool on) {
    for (nn::TransformerBlock& b : blocks_) b.checkpointed = on;
  }

  const VitConfig& config() const { return config_; }
  nn::Params& params() { return params_; }
  const nn::Params& params() const { return params_; }
  Tensor dropout_seed;

 private:
  VitConfig config_;
  nn::Params params_;
  Tensor cls_token_, pos_embed_;
  nn::PatchEmbed patch_embed_;
  std::vector<nn::TransformerBlock> blocks_;
  nn::Norm norm_;
  nn::Linear head_;
};

}  // namespace nabla::models
