// Building blocks for models: named parameters, seeded initialisers, and the
// layers ViT and GPT-2 are made of. A layer holds its parameter leaves and
// builds graph ops when called; it computes nothing itself.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "nabla/ops.h"
#include "nabla/tensor.h"

namespace nabla::nn {

// Parameters by name (timm / Hugging Face names), in creation order.
class Params {
 public:
  // Adds a leaf as a trainable parameter under `name`.
  Tensor add(const std::string& name, Tensor t);
  const std::vector<std::pair<std::string, Tensor>>& list() const { return list_; }
  const Tensor& get(const std::string& name) const;  // UsageError naming it when absent
  int64_t count() const;                               // total elements

 private:
  std::vector<std::pair<std::string, Tensor>> list_;
};

// Seeded initialisers writing into f32 leaves.
class Init {
 public:
  explicit Init(uint64_t seed) : rng_(seed) {}
  // Normal(0, std) redrawn outside +-2 std (timm's trunc_normal_ with a = -2std, b = 2std).
  Tensor trunc_normal(Shape shape, double std);
  Tensor normal(Shape shape, double std);
  Tensor zeros(Shape shape) { return Tensor::zeros(DType::f32, std::move(shape)); }
  Tensor ones(Shape shape) { return Tensor::full(DType::f32, std::move(shape), 1.0); }

 private:
  std::mt19937_64 rng_;
};

enum class Gelu { tanh, erf, quick };
Gelu parse_gelu(const std::string& name);  // "gelu" (tanh), "gelu_erf", "gelu_quick"
const char* gelu_name(Gelu g);
Tensor apply_gelu(Gelu g, const Tensor& x);

// y = x W^T + b; weight [out, in] as PyTorch's nn.Linear.
struct Linear {
  Tensor weight, bias;  // bias undefined when not used
  Linear() = default;
  Linear(Params& p, const std::string& prefix, int64_t in, int64_t out, bool bias, Init& init, double std = 0.02);
  Tensor operator()(const Tensor& x) const;
};

// Over the last axis, with weight (ones) and bias (zeros).
struct LayerNorm {
  Tensor weight, bias;
  double eps = 1e-5;
  LayerNorm() = default;
  LayerNorm(Params& p, const std::string& prefix, int64_t dim, double eps, Init& init);
  Tensor operator()(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }
};

// Rows of weight [vocab, dim] by i32 index.
struct Embedding {
  Tensor weight;
  Embedding() = default;
  Embedding(Params& p, const std::string& name, int64_t vocab, int64_t dim, Init& init, double std = 0.02);
  Tensor operator()(const Tensor& indices) const { return get_rows(weight, indices); }
};

// Zeroes activations with probability p while training. The seed is an i32
// leaf the trainer rewrites every step, so one compiled graph draws new masks.
struct Dropout {
  double p = 0;
  Tensor seed;
  Tensor operator()(const Tensor& x, bool train, int64_t salt) const;
};

// Multi-head self-attention with one fused qkv projection (timm's Attention,
// GPT-2's c_attn). x [N, T, D] -> [N, T, D]; with queries > 0, only the first
// `queries` tokens' outputs, [N, queries, D] (all T tokens are keys and
// values; not causal).
struct Attention {
  Linear qkv, proj;
  int64_t heads = 1;
  bool causal = false;
  Attention() = default;
  Attention(Params& p, const std::string& prefix, const std::string& qkv_name, const std::string& proj_name,
            int64_t dim, int64_t heads, bool qkv_bias, bool causal, Init& init, double proj_std = 0.02);
  Tensor operator()(const Tensor& x, int64_t queries = 0) const;
};

// fc1 -> GELU -> fc2.
struct Mlp {
  Linear fc1, fc2;
  Gelu gelu = Gelu::erf;
  Mlp() = default;
  Mlp(Params& p, const std::string& prefix, const std::string& fc1_name, const std::string& fc2_name, int64_t dim,
      int64_t hidden, Gelu gelu, Init& init, double fc2_std = 0.02);
  Tensor operator()(const Tensor& x) const { return fc2(apply_gelu(gelu, fc1(x))); }
};

// Pre-LN transformer block: x + attn(norm1(x)), then + mlp(norm2(.)). With
// keep > 0, only the first `keep` tokens' outputs [N, keep, D], the other
// tokens serving as keys and values only: a last block whose output feeds
// a class token alone computes no other token's rows (the same values and
// gradients as the whole block sliced, without dropout; dropout then draws
// its masks over the smaller tensor).
struct TransformerBlock {
  LayerNorm norm1, norm2;
  Attention attn;
  Mlp mlp;
  Dropout drop;
  Tensor operator()(const Tensor& x, bool train, int64_t salt, int64_t keep = 0) const;
};

// Non-overlapping patches by a conv with stride = kernel = patch:
// [N, C, H, W] -> tokens [N, (H/P)(W/P), D].
struct PatchEmbed {
  Tensor weight, bias;  // [D, C, P, P], [D]
  int64_t patch = 16;
  PatchEmbed() = default;
  PatchEmbed(Params& p, const std::string& prefix, int64_t in_chans, int64_t dim, int64_t patch, Init& init);
  Tensor operator()(const Tensor& images) const;
};

}  // namespace nabla::nn
