// End to end: a full pre-LN ViT block graph and a GPT-2 block graph, every
// weight a parameter, every gradient against f64 finite differences, and the
// f32 run against f64. These are the graphs ggml cannot differentiate
// (LayerNorm, GELU, conv_2d feeding non-contiguous gradients).
//
// Dimensions: N batch, C channels, P patch, T tokens, D model width,
// H heads, F MLP width, K classes, V vocabulary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

Tensor random_f64(Shape shape, std::mt19937_64& rng, double scale = 0.5) {
  Tensor t = Tensor::zeros(DType::f64, shape);
  std::normal_distribution<double> n(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<double>()[i] = n(rng);
  return t;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) { return matmul(x, transpose(w)) + b; }

// Multi-head self-attention with a fused qkv projection, as timm and GPT-2.
// x [N, T, D], wqkv [3D, D], bqkv [3D], wproj [D, D], bproj [D].
Tensor attention(const Tensor& x, const Tensor& wqkv, const Tensor& bqkv, const Tensor& wproj,
                 const Tensor& bproj, int64_t heads, bool causal) {
  int64_t N = x.dim(0), T = x.dim(1), D = x.dim(2), hd = D / heads;
  Tensor qkv = reshape(linear(x, wqkv, bqkv), {N, T, 3, heads, hd});
  qkv = permute(qkv, {2, 0, 3, 1, 4});  // [3, N, H, T, hd]
  auto part = [&](int i) { return reshape(slice(qkv, 0, i, i + 1), {N, heads, T, hd}); };
  Tensor o = scaled_dot_product_attention(part(0), part(1), part(2), Tensor(), causal);
  o = reshape(permute(o, {0, 2, 1, 3}), {N, T, D});
  return linear(o, wproj, bproj);
}

// Pre-LN block: x + attn(ln1(x)), then + mlp(ln2(.)) with a GELU MLP; its
// twelve weights start at p[i] in the order add_block_weights makes them.
Tensor block(const Tensor& x, const std::vector<Tensor>& p, int i, int64_t heads, bool causal) {
  Tensor h = x + attention(layer_norm(x, p[i], p[i + 1]), p[i + 2], p[i + 3], p[i + 4], p[i + 5], heads, causal);
  Tensor m = linear(gelu(linear(layer_norm(h, p[i + 6], p[i + 7]), p[i + 8], p[i + 9])), p[i + 10], p[i + 11]);
  return h + m;
}

// Weights of one block: ln1 (w, b), qkv (w, b), proj (w, b), ln2 (w, b), fc1 (w, b), fc2 (w, b).
void add_block_weights(std::vector<Tensor>& p, int64_t D, int64_t F, std::mt19937_64& rng) {
  p.push_back(eval(random_f64({D}, rng, 0.3) + 1.0));
  p.push_back(random_f64({D}, rng, 0.1));
  p.push_back(random_f64({3 * D, D}, rng));
  p.push_back(random_f64({3 * D}, rng, 0.1));
  p.push_back(random_f64({D, D}, rng));
  p.push_back(random_f64({D}, rng, 0.1));
  p.push_back(eval(random_f64({D}, rng, 0.3) + 1.0));
  p.push_back(random_f64({D}, rng, 0.1));
  p.push_back(random_f64({F, D}, rng));
  p.push_back(random_f64({F}, rng, 0.1));
  p.push_back(random_f64({D, F}, rng));
  p.push_back(random_f64({D}, rng, 0.1));
}

void expect_gradients_match(const Function& f, const std::vector<Tensor>& inputs, const std::vector<bool>& diff) {
  for (int threads : {1, 4}) {
    GradcheckOptions opt;
    opt.threads = threads;
    opt.max_grain = threads > 1 ? 1 : 0;
    GradcheckResult r = gradcheck(f, inputs, opt, diff);
    EXPECT_TRUE(r.ok) << "threads " << threads << ": " << r.message;
    EXPECT_GT(r.checked, 200);
    EXPECT_LE(r.f32_max_error, 1.0);
  }
}

}  // namespace

TEST(TransformerBlocks, VitBlockEveryParameterMatchesFiniteDifferences) {
  const int64_t N = 2, C = 2, HW = 4, P = 2, D = 4, H = 2, F = 8, K = 3;
  const int64_t T = (HW / P) * (HW / P) + 1;
  std::mt19937_64 rng(11);
  std::vector<Tensor> in;
  in.push_back(random_f64({N, C, HW, HW}, rng, 1.0));      // 0 images
  in.push_back(Tensor::from_vector<int32_t>({N}, {2, 0}));  // 1 labels
  in.push_back(random_f64({D, C, P, P}, rng));              // 2 patch_embed.proj.weight
  in.push_back(random_f64({D}, rng, 0.1));                  // 3 patch_embed.proj.bias
  in.push_back(random_f64({1, 1, D}, rng));                 // 4 cls_token
  in.push_back(random_f64({1, T, D}, rng));                 // 5 pos_embed
  add_block_weights(in, D, F, rng);                         // 6..17 blocks.0.*
  in.push_back(eval(random_f64({D}, rng, 0.3) + 1.0));      // 18 norm.weight
  in.push_back(random_f64({D}, rng, 0.1));                  // 19 norm.bias
  in.push_back(random_f64({K, D}, rng));                    // 20 head.weight
  in.push_back(random_f64({K}, rng, 0.1));                  // 21 head.bias

  Function vit = [=](const std::vector<Tensor>& p) {
    Tensor x = conv_2d(p[0], p[2], p[3], P);                 // [N, D, HW/P, HW/P]
    x = transpose(reshape(x, {N, D, T - 1}));                // [N, T-1, D], non-contiguous
    Tensor cls = expand(p[4], {N, 1, D});
    x = concat({cls, x}, 1) + p[5];                          // [N, T, D]
    x = block(x, p, 6, H, /*causal=*/false);
    x = layer_norm(x, p[18], p[19]);
    Tensor pooled = reshape(slice(x, 1, 0, 1), {N, D});      // the cls token
    return cross_entropy(linear(pooled, p[20], p[21]), p[1]);
  };
  std::vector<bool> diff(in.size(), true);
  diff[0] = false;  // the images: checked too would be fine, but they are data
  expect_gradients_match(vit, in, diff);
}

TEST(TransformerBlocks, Gpt2BlockEveryParameterMatchesFiniteDifferences) {
  const int64_t B = 2, T = 4, D = 4, H = 2, F = 8, V = 7;
  std::mt19937_64 rng(12);
  std::vector<Tensor> in;
  in.push_back(Tensor::from_vector<int32_t>({B, T}, {1, 5, 2, 2, 6, 0, 3, 1}));  // 0 tokens
  in.push_back(Tensor::from_vector<int32_t>({B, T}, {5, 2, 2, 4, 0, 3, 1, 6}));  // 1 targets
  in.push_back(random_f64({V, D}, rng));                                         // 2 wte.weight
  in.push_back(random_f64({T, D}, rng));                                         // 3 wpe.weight
  add_block_weights(in, D, F, rng);                                              // 4..15 h.0.*
  in.push_back(eval(random_f64({D}, rng, 0.3) + 1.0));                           // 16 ln_f.weight
  in.push_back(random_f64({D}, rng, 0.1));                                       // 17 ln_f.bias

  Function gpt2 = [=](const std::vector<Tensor>& p) {
    Tensor pos = Tensor::from_vector<int32_t>({T}, {0, 1, 2, 3});
    Tensor x = get_rows(p[2], p[0]) + get_rows(p[3], pos);   // [B, T, D]
    x = block(x, p, 4, H, /*causal=*/true);
    x = layer_norm(x, p[16], p[17]);
    Tensor logits = matmul(x, transpose(p[2]));              // tied head: [B, T, V]
    return cross_entropy(logits, p[1]);
  };
  expect_gradients_match(gpt2, in, std::vector<bool>(in.size(), true));
}

// A block that keeps only its first tokens' outputs (a ViT's last block
// under class-token pooling) against the whole block sliced: the same
// values and, for a loss on those tokens, the same gradients in x and every
// parameter. Bit for bit where each element sums the same terms in the same
// order (a kept row's products); the sums over rows (a norm's dgamma and
// dbeta: the whole block's adds the other rows' zeros, in other groups) to
// f32 rounding. 70 tokens take attention_probs, 20 the composed softmax.
TEST(TransformerBlocks, KeptTokensMatchTheWholeBlockSliced) {
  for (const int64_t T : {20, 70}) {
    for (const int64_t keep : {1, 3}) {
      SCOPED_TRACE(std::to_string(T) + " tokens, " + std::to_string(keep) + " kept");
      const int64_t N = 2, D = 12, H = 3, F = 24;
      nn::Params params;
      nn::Init init(5);
      const nn::TransformerBlock b(params, "", {.dim = D, .heads = H, .mlp_hidden = F, .norm_eps = 1e-6, .resid_std = 0.2},
                                   init);
      std::mt19937_64 rng(T + keep);
      const auto f32 = [&](Shape shape) {
        Tensor t = random_f64(shape, rng, 1.0), f = Tensor::zeros(DType::f32, shape);
        for (int64_t i = 0; i < t.numel(); ++i) f.data_as<float>()[i] = float(t.data_as<double>()[i]);
        return f;
      };
      Tensor x = f32({N, T, D}), w = f32({N, keep, D});
      std::vector<Tensor> wrt{x};
      for (const auto& [name, p] : params.list()) wrt.push_back(p);
      const auto run = [&](const Tensor& y) {
        std::vector<Tensor> outs{y};
        for (const Tensor& g : grad(sum(y * w), wrt)) outs.push_back(g);
        return eval(outs, {.threads = 2});
      };
      const std::vector<Tensor> kept = run(b(x, false, 0, keep));
      const std::vector<Tensor> whole = run(slice(b(x, false, 0), 1, 0, keep));
      ASSERT_EQ(kept.size(), whole.size());
      for (size_t i = 0; i < kept.size(); ++i) {
        const std::string what = i == 0 ? "output" : i == 1 ? "x's gradient" : params.list()[i - 2].first + "'s gradient";
        const std::vector<float> a = kept[i].to_vector<float>(), e = whole[i].to_vector<float>();
        ASSERT_EQ(a.size(), e.size()) << what;
        float scale = 0;
        for (float v : e) scale = std::max(scale, std::abs(v));
        const bool row_sum = what.find("norm") != std::string::npos;
        for (size_t j = 0; j < a.size(); ++j) {
          if (row_sum) {
            EXPECT_NEAR(a[j], e[j], 1e-6f * scale) << what << " " << j;
          } else {
            EXPECT_EQ(a[j], e[j]) << what << " " << j;
          }
        }
      }
    }
  }
  nn::Params params;
  nn::Init init(1);
  const nn::TransformerBlock b(params, "", {.dim = 4, .heads = 2, .mlp_hidden = 8}, init);
  EXPECT_THROW(b(Tensor::zeros(DType::f32, {1, 3, 4}), false, 0, 4), UsageError);
}

// The block's decode path: a causal block fed one token per row at a time,
// with its keys and values kept in a cache, gives each position the output
// the whole sequence's forward gives it. Two rows, timm's [out, in] weights
// (GPT-2's test covers Conv1D's [in, out] through the model).
TEST(TransformerBlocks, DecodeWithACacheMatchesTheForward) {
  const int64_t N = 2, T = 5, D = 8, H = 2, hd = D / H, F = 16;
  nn::Params params;
  nn::Init init(9);
  const nn::TransformerBlock b(params, "", {.dim = D, .heads = H, .mlp_hidden = F, .causal = true, .resid_std = 0.2},
                               init);
  std::mt19937_64 rng(4);
  Tensor x = Tensor::zeros(DType::f32, {N, T, D});
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = normal(rng);
  const std::vector<float> full = eval(b(x, false, 0)).to_vector<float>();  // [N, T, D]

  Tensor token = Tensor::zeros(DType::f32, {N, 1, D});
  nn::KvCache cache{.keys = Tensor::zeros(DType::f32, {N, H, T, hd}),
                    .values = Tensor::zeros(DType::f32, {N, H, T, hd}),
                    .mask = Tensor::full(DType::f32, {1, T + 1}, -std::numeric_limits<double>::infinity())};
  cache.mask.data_as<float>()[T] = 0;
  Tensor y = b.decode(token, cache);
  Graph g({y, cache.new_keys, cache.new_values});
  Executor ex(g, {.threads = 2});
  for (int64_t p = 0; p < T; ++p) {
    for (int64_t n = 0; n < N; ++n) {
      std::copy_n(x.data_as<float>() + (n * T + p) * D, D, token.data_as<float>() + n * D);
    }
    ex.run();
    const std::vector<float> out = ex.read<float>(y);  // [N, 1, D]
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t d = 0; d < D; ++d) {
        EXPECT_NEAR(out[n * D + d], full[(n * T + p) * D + d], 1e-5) << "row " << n << " position " << p;
      }
    }
    for (auto [fresh, kept] : {std::pair{cache.new_keys, cache.keys}, std::pair{cache.new_values, cache.values}}) {
      const std::vector<float> kv = ex.read<float>(fresh);  // [N, H, 1, hd]
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t h = 0; h < H; ++h) {
          std::copy_n(kv.data() + (n * H + h) * hd, hd, kept.data_as<float>() + ((n * H + h) * T + p) * hd);
        }
      }
    }
    cache.mask.data_as<float>()[p] = 0;
  }
  // A cache of the wrong shape is refused when the graph is built.
  nn::KvCache bad{.keys = Tensor::zeros(DType::f32, {N, H, T, hd + 1}), .values = Tensor::zeros(DType::f32, {N, H, T, hd})};
  EXPECT_THROW(b.decode(token, bad), ShapeError);
}
