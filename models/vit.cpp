// Vision Transformer, timm layout.
//
// Dimensions:
//   N  batch            C  image channels      H, W  image height, width
//   P  patch size       T  tokens = (H/P)(W/P) (+1 with a cls token)
//   D  embed_dim        L  depth (blocks)      heads, hd = D / heads
//   F  MLP width = D * mlp_ratio               K  classes
//
// Parameters (timm names):
//   cls_token                    [1, 1, D]      (global_pool "token" only)
//   pos_embed                    [1, T, D]
//   patch_embed.proj.weight      [D, C, P, P]   patch_embed.proj.bias  [D]
//   blocks.i.norm1.weight/bias   [D]
//   blocks.i.attn.qkv.weight     [3D, D]        blocks.i.attn.qkv.bias [3D]
//   blocks.i.attn.proj.weight    [D, D]         blocks.i.attn.proj.bias [D]
//   blocks.i.norm2.weight/bias   [D]
//   blocks.i.mlp.fc1.weight      [F, D]         blocks.i.mlp.fc1.bias  [F]
//   blocks.i.mlp.fc2.weight      [D, F]         blocks.i.mlp.fc2.bias  [D]
//   norm.weight/bias             [D]
//   head.weight                  [K, D]         head.bias              [K]
#include "nabla/models/vit.h"

#include "nabla/checkpoint.h"
#include "nabla/config.h"
#include "nabla/error.h"

namespace nabla::models {

namespace {
constexpr int64_t kMaxSize = INT32_MAX;
}  // namespace

void VitConfig::validate() const {
  auto fail = [](const std::string& m) { throw UsageError("vit config: " + m); };
  if (img_size <= 0 || patch_size <= 0 || img_size % patch_size) {
    fail("patch_size " + std::to_string(patch_size) + " must divide img_size " + std::to_string(img_size));
  }
  if (in_chans <= 0 || embed_dim <= 0 || depth < 0 || num_heads <= 0 || num_classes <= 0) {
    fail("sizes must be positive");
  }
  // Bounds that keep every size computed from the config far from overflow.
  if (img_size > (1 << 20) || in_chans > kMaxSize || embed_dim > kMaxSize || depth > kMaxSize ||
      num_classes > kMaxSize) {
    fail("sizes must be at most 2^31 - 1 (img_size at most 2^20)");
  }
  if (embed_dim % num_heads) {
    fail("embed_dim " + std::to_string(embed_dim) + " is not divisible by num_heads " + std::to_string(num_heads));
  }
  if (global_pool != "token" && global_pool != "avg") fail("global_pool must be \"token\" or \"avg\"");
  if (!(mlp_ratio > 0) || !(double(embed_dim) * mlp_ratio <= double(kMaxSize))) {
    fail("mlp_ratio must be positive, with embed_dim * mlp_ratio at most 2^31 - 1");
  }
  if (!(norm_eps >= 0 && norm_eps < 1)) fail("norm_eps must be in [0, 1)");
  if (!(drop_rate >= 0 && drop_rate < 1)) fail("drop_rate must be in [0, 1)");
  nn::parse_gelu(gelu);
}

namespace {

// The checkpoint's "nabla.config": timm's names.
ConfigFields fields_of(VitConfig& c) {
  ConfigFields f("vit config", "vit");
  f.optional("preset", c.preset)
      .required("img_size", c.img_size)
      .required("patch_size", c.patch_size)
      .required("in_chans", c.in_chans)
      .required("embed_dim", c.embed_dim)
      .required("depth", c.depth)
      .required("num_heads", c.num_heads)
      .required("mlp_ratio", c.mlp_ratio)
      .required("num_classes", c.num_classes)
      .optional("global_pool", c.global_pool)
      .optional("qkv_bias", c.qkv_bias)
      .optional("norm_eps", c.norm_eps)
      .optional("gelu", c.gelu)
      .optional("drop_rate", c.drop_rate);
  return f;
}

}  // namespace

std::string VitConfig::to_json() const {
  VitConfig c = *this;
  return fields_of(c).to_json();
}

VitConfig VitConfig::from_json(const std::string& text) {
  VitConfig c;
  fields_of(c).from_json(text);
  c.validate();
  return c;
}

int64_t VitConfig::parameter_count() const {
  // Mirrors Vit::Vit (a test compares it with the built model), in double so
  // that no config can overflow it.
  const double D = double(embed_dim), C = double(in_chans), P = double(patch_size), F = double(mlp_hidden()),
               K = double(num_classes), T = double(img_size / patch_size) * double(img_size / patch_size) +
                                           (global_pool == "token");
  const double block = 2 * D + 3 * D * D + (qkv_bias ? 3 * D : 0) + D * D + D + 2 * D + F * D + F + D * F + D;
  const double n = (global_pool == "token" ? D : 0) + T * D + D * C * P * P + D + double(depth) * block + 2 * D +
                   K * D + K;
  return n >= 9.2e18 ? INT64_MAX : int64_t(n);
}

VitConfig vit_config_from_checkpoint(const Checkpoint& ckpt) { return config_from_checkpoint<VitConfig>(ckpt); }

VitConfig vit_preset(const std::string& name) {
  VitConfig c;
  c.preset = name;
  if (name == "vit-tiny") {
    // timm's vit_tiny_patch16_224.
    return c;
  }
  if (name == "fmnist") {
    // 28x28 grey images in 7x7 patches: 16 tokens keep a step cheap enough
    // on two cores to see ~36 epochs in 15 minutes; mean pooling over tokens.
    // Six blocks of width 96 learn faster per epoch than four of 128 at about
    // the same cost per image.
    c.img_size = 28;
    c.patch_size = 7;
    c.in_chans = 1;
    c.embed_dim = 96;
    c.depth = 6;
    c.num_heads = 4;
    c.mlp_ratio = 2.0;
    c.num_classes = 10;
    c.global_pool = "avg";
    c.drop_rate = 0.0;
    return c;
  }
  throw UsageError("vit: unknown preset '" + name + "' (presets: vit-tiny, fmnist)");
}

std::vector<std::string> vit_presets() { return {"vit-tiny", "fmnist"}; }

Vit::Vit(const VitConfig& config, uint64_t seed) : config_(config) {
  config_.validate();
  const VitConfig& c = config_;
  nn::Init init(seed);
  int64_t D = c.embed_dim, T = c.tokens();
  dropout_seed = Tensor::zeros(DType::i32, {});
  if (c.global_pool == "token") cls_token_ = params_.add("cls_token", init.trunc_normal({1, 1, D}, 0.02));
  pos_embed_ = params_.add("pos_embed", init.trunc_normal({1, T, D}, 0.02));
  patch_embed_ = nn::PatchEmbed(params_, "patch_embed.proj", c.in_chans, D, c.patch_size, init);
  nn::BlockConfig block;
  block.dim = D;
  block.heads = c.num_heads;
  block.mlp_hidden = c.mlp_hidden();
  block.norm_eps = c.norm_eps;
  block.gelu = nn::parse_gelu(c.gelu);
  block.qkv_bias = c.qkv_bias;
  block.dropout = c.drop_rate;
  block.dropout_seed = dropout_seed;
  for (int64_t i = 0; i < c.depth; ++i) blocks_.emplace_back(params_, "blocks." + std::to_string(i), block, init);
  norm_ = nn::Norm(params_, "norm", D, c.norm_eps, init);
  head_ = nn::Linear(params_, "head", D, c.num_classes, true, init);
}

Tensor Vit::forward(const Tensor& images, bool train) const {
  const VitConfig& c = config_;
  if (images.rank() != 4 || images.dim(1) != c.in_chans || images.dim(2) != c.img_size ||
      images.dim(3) != c.img_size) {
    throw ShapeError("vit: images must be [N, " + std::to_string(c.in_chans) + ", " + std::to_string(c.img_size) +
                     ", " + std::to_string(c.img_size) + "], got " + to_string(images.shape()));
  }
  int64_t N = images.dim(0), D = c.embed_dim;
  Tensor x = patch_embed_(images);                            // [N, T', D]
  if (c.global_pool == "token") x = concat({expand(cls_token_, {N, 1, D}), x}, 1);
  x = x + pos_embed_;                                         // [N, T, D]
  // With the class token pooled, the loss reads no other token of the last
  // block's output: that block computes the class token's row alone (its
  // attention still reads every token's key and value), work that timm's
  // model spends on rows it then drops.
  const bool token = c.global_pool == "token";
  for (size_t i = 0; i < blocks_.size(); ++i) {
    x = blocks_[i](x, train, int64_t(2 * i), token && i + 1 == blocks_.size() ? 1 : 0);
  }
  x = norm_(x);
  Tensor pooled = token ? reshape(slice(x, 1, 0, 1), {N, D}) : mean(x, {1});  // [N, D]
  return head_(pooled);                                       // [N, K]
}

}  // namespace nabla::models
