#include <cmath>

#include "nabla/error.h"
#include "nabla/nn.h"

namespace nabla::nn {

Tensor Params::add(const std::string& name, Tensor t) {
  for (const auto& [n, _] : list_) {
    if (n == name) throw UsageError("params: '" + name + "' is added twice");
  }
  t.requires_grad();
  t.set_name(name);
  list_.emplace_back(name, t);
  return t;
}

const Tensor& Params::get(const std::string& name) const {
  for (const auto& [n, t] : list_) {
    if (n == name) return t;
  }
  throw UsageError("params: no parameter named '" + name + "'");
}

int64_t Params::count() const {
  int64_t n = 0;
  for (const auto& [_, t] : list_) n += t.numel();
  return n;
}

Tensor Init::trunc_normal(Shape shape, double std) {
  Tensor t = Tensor::zeros(DType::f32, std::move(shape));
  std::normal_distribution<double> n(0.0, 1.0);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v;
    do v = n(rng_);
    while (std::abs(v) > 2.0);
    p[i] = static_cast<float>(v * std);
  }
  return t;
}

Tensor Init::normal(Shape shape, double std) {
  Tensor t = Tensor::zeros(DType::f32, std::move(shape));
  std::normal_distribution<double> n(0.0, std);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(n(rng_));
  return t;
}

Gelu parse_gelu(const std::string& name) {
  if (name == "gelu" || name == "gelu_tanh") return Gelu::tanh;
  if (name == "gelu_erf") return Gelu::erf;
  if (name == "gelu_quick") return Gelu::quick;
  throw UsageError("gelu: unknown variant '" + name + "' (expected gelu, gelu_erf or gelu_quick)");
}

const char* gelu_name(Gelu g) {
  switch (g) {
    case Gelu::tanh: return "gelu";
    case Gelu::erf: return "gelu_erf";
    case Gelu::quick: return "gelu_quick";
  }
  return "?";
}

Tensor apply_gelu(Gelu g, const Tensor& x) {
  switch (g) {
    case Gelu::tanh: return gelu(x);
    case Gelu::erf: return gelu_erf(x);
    case Gelu::quick: return gelu_quick(x);
  }
  return x;
}

Linear::Linear(Params& p, const std::string& prefix, int64_t in, int64_t out, bool with_bias, Init& init,
               double std) {
  weight = p.add(prefix + ".weight", init.trunc_normal({out, in}, std));
  if (with_bias) bias = p.add(prefix + ".bias", init.zeros({out}));
}

// x [..., in] @ W^T: matmul reads the transposed view without a copy.
Tensor Linear::operator()(const Tensor& x) const {
  return bias.defined() ? matmul_add(x, transpose(weight), bias) : matmul(x, transpose(weight));
}

LayerNorm::LayerNorm(Params& p, const std::string& prefix, int64_t dim, double eps_, Init& init) : eps(eps_) {
  weight = p.add(prefix + ".weight", init.ones({dim}));
  bias = p.add(prefix + ".bias", init.zeros({dim}));
}

Embedding::Embedding(Params& p, const std::string& name, int64_t vocab, int64_t dim, Init& init, double std) {
  weight = p.add(name, init.normal({vocab, dim}, std));
}

Tensor Dropout::operator()(const Tensor& x, bool train, int64_t salt) const {
  if (!train || p <= 0 || !seed.defined()) return x;
  // Each call site gets its own mask stream: the seed leaf plus its salt.
  return dropout(x, p, seed, true, salt);
}

Attention::Attention(Params& p, const std::string& prefix, const std::string& qkv_name,
                     const std::string& proj_name, int64_t dim, int64_t heads_, bool qkv_bias, bool causal_,
                     Init& init, double proj_std)
    : heads(heads_), causal(causal_) {
  if (dim % heads != 0) {
    throw UsageError("attention: width " + std::to_string(dim) + " is not divisible by " + std::to_string(heads) +
                     " heads");
  }
  qkv = Linear(p, prefix + "." + qkv_name, dim, 3 * dim, qkv_bias, init);
  proj = Linear(p, prefix + "." + proj_name, dim, dim, true, init, proj_std);
}

// x [N, T, D] -> q, k, v [N, T, D] -> [N, T, H, hd] each (a reshape, no
// copy) -> attention -> [N, T, D]. q, k and v come from row slices of the
// fused weight [3D, D]: the same maths as slicing the fused output, but the
// backward adds into the small weight instead of zero-filling and summing
// three activation-sized gradients. With queries, only the first `queries`
// tokens ask (q and the output [N, queries, D] are theirs); every token is
// a key and a value.
// Causal or long attention runs fused (whole key blocks skipped, no T x T
// probabilities kept: 1.57x faster than composed at GPT-2 small's 256
// tokens). Bidirectional attention over at most 256 tokens keeps its
// probabilities for the backward, where the fused op recomputes the scores,
// +1/6 of the products, which measured 4% slower per Fashion-MNIST step and
// 2.5% per vit-tiny step (bench/ops_bench.cpp, BM_attention). Past 64 tokens
// the probabilities come from attention_probs, the scores softmaxed in
// cache (vit-tiny's 197: 1% faster per step); at fmnist's 16 the composed
// form's batched products and row kernels were faster (backward 240 against
// 285 us a layer).
Tensor Attention::operator()(const Tensor& x, int64_t queries) const {
  const int64_t N = x.dim(0), T = x.dim(1), D = x.dim(2), hd = D / heads;
  if (queries < 0 || queries > T) {
    throw UsageError("attention: queries must be in [0, " + std::to_string(T) + "] (0: every token), got " +
                     std::to_string(queries));
  }
  const int64_t Tq = queries > 0 ? queries : T;
  if (causal && Tq != T) throw UsageError("attention: causal attention takes every token as a query");
  auto project = [&](int64_t i, const Tensor& in) {
    Tensor w = transpose(slice(qkv.weight, 0, i * D, (i + 1) * D));
    Tensor y = qkv.bias.defined() ? matmul_add(in, w, slice(qkv.bias, 0, i * D, (i + 1) * D)) : matmul(in, w);
    return reshape(y, {N, in.dim(1), heads, hd});
  };
  const Tensor q = project(0, Tq == T ? x : slice(x, 1, 0, Tq)), k = project(1, x), v = project(2, x);
  if (causal || T > 256) return proj(reshape(attention(q, k, v, causal), {N, Tq, D}));
  // Composed on heads-first views of the token-major projections; the
  // values' product writes its output token-major (matmul_heads), and the
  // backward products write dq, dk and dv so too: no head copies either way.
  auto heads_first = [](const Tensor& t) { return permute(t, {0, 2, 1, 3}); };
  Tensor p = T > 64 ? attention_probs(q, k)
                    : softmax(matmul(heads_first(q), transpose(heads_first(k))), 1.0 / std::sqrt(double(hd)));
  return proj(reshape(matmul_heads(p, heads_first(v)), {N, Tq, D}));
}

Mlp::Mlp(Params& p, const std::string& prefix, const std::string& fc1_name, const std::string& fc2_name,
         int64_t dim, int64_t hidden, Gelu gelu_, Init& init, double fc2_std)
    : gelu(gelu_) {
  fc1 = Linear(p, prefix + "." + fc1_name, dim, hidden, true, init);
  fc2 = Linear(p, prefix + "." + fc2_name, hidden, dim, true, init, fc2_std);
}

Tensor TransformerBlock::operator()(const Tensor& x, bool train, int64_t salt, int64_t keep) const {
  const Tensor a = attn(norm1(x), keep);  // checks keep
  const Tensor first = keep > 0 && keep < x.dim(1) ? slice(x, 1, 0, keep) : x;
  Tensor h = first + drop(a, train, salt);
  return h + drop(mlp(norm2(h)), train, salt + 1);
}

PatchEmbed::PatchEmbed(Params& p, const std::string& prefix, int64_t in_chans, int64_t dim, int64_t patch_,
                       Init& init)
    : patch(patch_) {
  weight = p.add(prefix + ".weight", init.trunc_normal({dim, in_chans, patch, patch}, 0.02));
  bias = p.add(prefix + ".bias", init.zeros({dim}));
}

// conv [N, D, H/P, W/P] -> [N, D, T] -> tokens [N, T, D] (a transposed view).
Tensor PatchEmbed::operator()(const Tensor& images) const {
  Tensor y = conv_2d(images, weight, bias, patch);
  return transpose(reshape(y, {y.dim(0), y.dim(1), y.dim(2) * y.dim(3)}));
}

}  // namespace nabla::nn
