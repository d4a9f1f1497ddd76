// Regression: ggml could not train a ViT because conv_2d ended in a CONT whose
// backward asserted a contiguous incoming gradient, and in a transformer the
// gradient reaching the patch embedding is a transposed view
// (shared/reference/ggml-backward-gaps-issue.txt, gap 3). Here the whole
// patch-embedding path is gradient-checked in f64 (and f32 against f64) at 1,
// 2 and 4 threads, with the strided gradients asserted, not assumed.
//
// Legend: N batch, C image channels, H x W image, P patch size,
// D embedding width, T = (H/P)*(W/P) tokens, K head outputs.
#include <gtest/gtest.h>

#include <random>

#include "nabla/nabla.hpp"

using namespace nabla;

namespace {

constexpr int64_t N = 2, C = 3, H = 8, W = 8, P = 4, D = 6, T = (H / P) * (W / P), K = 5;

Tensor random_leaf(Shape shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  for (double& x : v) x = n(rng);
  return Tensor::from_vector<double>(shape, v);
}

// Layer normalisation over the last axis from primitives (the fused op is
// tested on its own): (t - mean) * rsqrt(var + eps) * gamma + beta.
Tensor layer_norm_composed(const Tensor& t, const Tensor& gamma, const Tensor& beta) {
  Tensor centred = t - mean(t, {-1}, true);
  Tensor var = mean(centred * centred, {-1}, true);
  return centred * rsqrt(var + 1e-5) * gamma + beta;
}

// Inputs: x [N, C, H, W], w [D, C, P, P], b [D], gamma [D], beta [D], head [D, K].
std::vector<Tensor> vit_inputs() {
  return {random_leaf({N, C, H, W}, 1), random_leaf({D, C, P, P}, 2), random_leaf({D}, 3),
          random_leaf({D}, 4),          random_leaf({D}, 5),          random_leaf({D, K}, 6)};
}

// timm's PatchEmbed: proj(x).flatten(2).transpose(1, 2), then a LayerNorm and
// a linear head. `flat` receives the [N, D, T] view of the conv output.
Tensor vit_head(const std::vector<Tensor>& in, Tensor* flat = nullptr) {
  Tensor y = conv_2d(in[0], in[1], in[2], P);  // [N, D, H/P, W/P]
  Tensor f = reshape(y, {N, D, T});            // [N, D, T]
  if (flat) *flat = f;
  Tensor tokens = transpose(f, 1, 2);                    // [N, T, D], a strided view
  Tensor h = layer_norm_composed(tokens, in[3], in[4]);  // [N, T, D]
  return matmul(h, in[5]);                               // [N, T, K]
}

// The same tokens through permute -> reshape (which copies): the gradient
// reaching the conv output itself is then the permuted view of a contiguous one.
Tensor vit_head_permuted(const std::vector<Tensor>& in, Tensor* conv_out = nullptr) {
  Tensor y = conv_2d(in[0], in[1], in[2], P);  // [N, D, H/P, W/P]
  if (conv_out) *conv_out = y;
  Tensor tokens = reshape(permute(y, {0, 2, 3, 1}), {N, T, D});
  return matmul(layer_norm_composed(tokens, in[3], in[4]), in[5]);
}

void check_all_threads(const Function& f, const std::vector<Tensor>& inputs) {
  for (Cotangent route : {Cotangent::dense, Cotangent::transposed}) {
    for (int threads : {1, 2, 4}) {
      GradcheckOptions opt;
      opt.threads = threads;
      opt.max_grain = threads > 1 ? 1 : 0;  // split every kernel into one-item chunks
      opt.cotangent = route;
      GradcheckResult r = gradcheck(f, inputs, opt);
      EXPECT_TRUE(r.ok) << "threads " << threads << ", cotangent " << int(route) << ": "
                        << r.message;
      int64_t entries = 0;
      for (const Tensor& t : inputs) entries += t.numel();
      EXPECT_EQ(r.checked, entries);
    }
  }
}

// The gradient flowing into `at` when differentiating sum(out * v).
Tensor gradient_at(const Tensor& out, const Tensor& at) {
  Tensor v = random_leaf(out.shape(), 7);
  return grad(sum(out * v), {at})[0];
}

}  // namespace

TEST(conv_regression, VitPatchEmbeddingGradientIsStrided) {
  std::vector<Tensor> in = vit_inputs();
  Tensor flat;
  Tensor out = vit_head(in, &flat);
  EXPECT_FALSE(gradient_at(out, flat).is_contiguous());
  Tensor conv_out;
  out = vit_head_permuted(in, &conv_out);
  EXPECT_FALSE(gradient_at(out, conv_out).is_contiguous());
}

TEST(conv_regression, VitPatchEmbeddingGradcheck) {
  check_all_threads([](const std::vector<Tensor>& in) { return vit_head(in); }, vit_inputs());
}

TEST(conv_regression, VitPatchEmbeddingPermutedGradcheck) {
  check_all_threads([](const std::vector<Tensor>& in) { return vit_head_permuted(in); },
                    vit_inputs());
}

// ggml's failing pattern, contiguous(transpose(contiguous(transpose(.)))), on
// both sides of a convolution, with an overlapping, padded second conv.
TEST(conv_regression, ContiguousTransposeChainsAroundConv) {
  auto f = [](const std::vector<Tensor>& in) {
    const Tensor &x = in[0], &w1 = in[1], &b1 = in[2], &w2 = in[3];
    Tensor xr = contiguous(transpose(contiguous(transpose(x, 2, 3)), 2, 3));  // [2, 3, 5, 6]
    Tensor y = conv_2d(xr, w1, b1, 1, 1);                                     // [2, 4, 5, 6]
    Tensor yr = contiguous(transpose(contiguous(transpose(y, 1, 3)), 1, 3));  // [2, 4, 5, 6]
    Tensor z = conv_2d(yr, w2, Tensor(), 2, 1, 1, 2);                         // [2, 2, 3, 3]
    return contiguous(transpose(z, 2, 3));
  };
  std::vector<Tensor> in = {random_leaf({2, 3, 5, 6}, 8), random_leaf({4, 3, 3, 3}, 9),
                            random_leaf({4}, 10), random_leaf({2, 2, 3, 3}, 11)};
  check_all_threads(f, in);
}

// The same chain between a conv and its transpose (an autoencoder's skip).
TEST(conv_regression, ContiguousTransposeChainIntoConvTranspose) {
  auto f = [](const std::vector<Tensor>& in) {
    Tensor y = conv_2d(in[0], in[1], Tensor(), 2, 1);                         // [2, 4, 3, 3]
    Tensor yr = contiguous(transpose(contiguous(transpose(y, 0, 3)), 0, 3));  // [2, 4, 3, 3]
    return conv_transpose_2d(yr, in[2], in[3], 2, 1, 1);                      // [2, 3, 6, 6]
  };
  std::vector<Tensor> in = {random_leaf({2, 3, 6, 6}, 12), random_leaf({4, 3, 3, 3}, 13),
                            random_leaf({4, 3, 3, 3}, 14), random_leaf({3}, 15)};
  check_all_threads(f, in);
}
