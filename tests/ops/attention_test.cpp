// scaled_dot_product_attention is a composition (matmul, transpose, softmax):
// its gradients in q, k and v against finite differences, with causal and
// additive masks, Tq != Tk, and against a plain reference of its value.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "backend/cpu/fusion.h"
#include "core/graph_internal.h"
#include "core/node.h"
#include "core/op.h"
#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"

using namespace nabla;

namespace {

Tensor random_leaf(Shape shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  Tensor t = Tensor::zeros(DType::f64, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<double>()[i] = n(rng);
  return t;
}

// t (f64) as a leaf of dtype.
Tensor in_dtype(const Tensor& t, DType dtype) {
  if (dtype == DType::f64) return t;
  std::vector<double> v = t.to_vector<double>();
  return Tensor::from_vector<float>(t.shape(), std::vector<float>(v.begin(), v.end()));
}

// outs computed on the CPU at 2 threads, as doubles.
std::vector<std::vector<double>> values_of(const std::vector<Tensor>& outs) {
  std::vector<std::vector<double>> values;
  for (const Tensor& t : eval(outs, {.threads = 2})) {
    if (t.dtype() == DType::f64) {
      values.push_back(t.to_vector<double>());
    } else {
      std::vector<float> f = t.to_vector<float>();
      values.emplace_back(f.begin(), f.end());
    }
  }
  return values;
}

// o and the gradients of sum(o * dout) in q, k and v, as values_of gives them.
std::vector<std::vector<double>> output_and_gradients(const Tensor& o, const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& dout) {
  std::vector<Tensor> outs = grad(sum(o * dout), {q, k, v});
  outs.insert(outs.begin(), o);
  return values_of(outs);
}

// Each of got's output, dq, dk and dv within tolerance x the largest
// magnitude of want's (at least floor).
void expect_close(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want,
                  double tolerance, double floor = 0) {
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (size_t n = 0; n < want.size(); ++n) {
    double scale = floor;
    for (double x : want[n]) scale = std::max(scale, std::abs(x));
    for (size_t i = 0; i < got[n].size(); ++i) {
      ASSERT_NEAR(got[n][i], want[n][i], tolerance * scale) << names[n] << " entry " << i;
    }
  }
}

struct AttentionCase {
  const char* name;
  int64_t b, h, tq, tk, d, dv;
  bool causal;
  bool mask;  // an additive [Tq, Tk] mask with some -inf entries
};

// 0 / -inf, with position 0 of every row kept so that no row is fully hidden.
Tensor additive_mask(int64_t tq, int64_t tk, DType dtype) {
  std::vector<double> m(static_cast<size_t>(tq * tk));
  for (int64_t i = 0; i < tq; ++i) {
    for (int64_t j = 0; j < tk; ++j) {
      m[i * tk + j] = (j > 0 && (i + 2 * j) % 3 == 0) ? -std::numeric_limits<double>::infinity()
                                                      : 0.1 * (i - j);
    }
  }
  if (dtype == DType::f64) return Tensor::from_vector<double>({tq, tk}, m);
  return Tensor::from_vector<float>({tq, tk}, std::vector<float>(m.begin(), m.end()));
}

class AttentionGrad : public testing::TestWithParam<std::tuple<AttentionCase, int>> {};

TEST_P(AttentionGrad, MatchesFiniteDifferences) {
  auto [c, threads] = GetParam();
  std::vector<Tensor> in = {random_leaf({c.b, c.h, c.tq, c.d}, 1),
                            random_leaf({c.b, c.h, c.tk, c.d}, 2),
                            random_leaf({c.b, c.h, c.tk, c.dv}, 3)};
  AttentionCase cc = c;
  Function f = [cc](const std::vector<Tensor>& x) {
    Tensor mask = cc.mask ? additive_mask(cc.tq, cc.tk, x[0].dtype()) : Tensor();
    return scaled_dot_product_attention(x[0], x[1], x[2], mask, cc.causal);
  };
  GradcheckOptions opt;
  opt.threads = threads;
  if (threads > 1) opt.max_grain = 1;
  GradcheckResult r = gradcheck(f, in, opt);
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.checked, in[0].numel() + in[1].numel() + in[2].numel());
}

const AttentionCase kCases[] = {
    {"plain", 1, 2, 3, 3, 4, 4, false, false},
    {"causal", 2, 1, 4, 4, 3, 2, true, false},
    {"causal_more_keys", 1, 2, 2, 5, 3, 3, true, false},
    {"masked_fewer_keys", 2, 1, 4, 3, 2, 5, false, true},
    {"causal_and_masked", 1, 2, 3, 5, 4, 2, true, true},
};

INSTANTIATE_TEST_SUITE_P(Attention, AttentionGrad,
                         testing::Combine(testing::ValuesIn(kCases), testing::Values(1, 4)),
                         [](const testing::TestParamInfo<AttentionGrad::ParamType>& p) {
                           return std::string(std::get<0>(p.param).name) + "_t" +
                                  std::to_string(std::get<1>(p.param));
                         });

// The value against a direct loop over one head.
TEST(Attention, MatchesAReferenceLoop) {
  const int64_t tq = 3, tk = 4, d = 2, dv = 3;
  Tensor q = random_leaf({1, 1, tq, d}, 4), k = random_leaf({1, 1, tk, d}, 5),
         v = random_leaf({1, 1, tk, dv}, 6);
  std::vector<double> got =
      eval(scaled_dot_product_attention(q, k, v, Tensor(), true)).to_vector<double>();
  const double *qp = q.data_as<double>(), *kp = k.data_as<double>(), *vp = v.data_as<double>();
  for (int64_t i = 0; i < tq; ++i) {
    // Causal with Tk > Tq: query i sees keys j <= i + (Tk - Tq).
    std::vector<double> w(tk, 0.0);
    double total = 0;
    for (int64_t j = 0; j <= i + (tk - tq); ++j) {
      double s = 0;
      for (int64_t e = 0; e < d; ++e) s += qp[i * d + e] * kp[j * d + e];
      w[j] = std::exp(s / std::sqrt(double(d)));
      total += w[j];
    }
    for (int64_t e = 0; e < dv; ++e) {
      double want = 0;
      for (int64_t j = 0; j < tk; ++j) want += w[j] / total * vp[j * dv + e];
      EXPECT_NEAR(got[i * dv + e], want, 1e-12) << "query " << i << " column " << e;
    }
  }
}

// The fused forms on token-major q, k, v: attention, or attention_probs
// then matmul_heads (the probabilities kept for the backward).
enum class Fused { attention, probs };
Tensor fused_attention(Fused kind, const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  if (kind == Fused::attention) return attention(q, k, v, causal);
  return matmul_heads(attention_probs(q, k, causal), permute(v, {0, 2, 1, 3}));
}

// The fused ops in f32 (vectorised softmax, query blocks, causal key
// skipping) against the composed form in f64, value and every gradient, at
// the models' shapes: fmnist's heads (16 tokens of 24), vit-tiny's (197 of
// 64), GPT-2's causal ones (three query blocks) and 300 tokens (two blocks;
// causal, five, the visible keys crossing the GEMM's 256-deep passes), with
// q, k, v read through strided views.
TEST(Attention, FusedF32MatchesTheCompositeAtModelShapes) {
  for (const Fused kind : {Fused::attention, Fused::probs}) {
    SCOPED_TRACE(kind == Fused::attention ? "attention" : "attention_probs");
    struct Case {
      int64_t b, t, h, d;
      bool causal;
    };
    for (const Case& c : {Case{4, 16, 4, 24, false}, Case{1, 197, 3, 64, false}, Case{2, 130, 2, 32, true},
                          Case{1, 300, 1, 16, false}, Case{1, 300, 1, 16, true}}) {
      SCOPED_TRACE(std::to_string(c.t) + " tokens, causal " + std::to_string(c.causal));
      Tensor qkv64 = random_leaf({c.b, c.t, 3, c.h, c.d}, 11);
      Tensor dout64 = random_leaf({c.b, c.t, c.h, c.d}, 12);
      auto run = [&](DType dtype, bool fused) {
        Tensor qkv = in_dtype(qkv64, dtype), dout = in_dtype(dout64, dtype);
        auto part = [&](int64_t i) { return reshape(slice(qkv, 2, i, i + 1), {c.b, c.t, c.h, c.d}); };
        Tensor q = part(0), k = part(1), v = part(2);
        Tensor o = fused ? fused_attention(kind, q, k, v, c.causal)
                         : permute(scaled_dot_product_attention(permute(q, {0, 2, 1, 3}), permute(k, {0, 2, 1, 3}),
                                                                permute(v, {0, 2, 1, 3}), Tensor(), c.causal),
                                   {0, 2, 1, 3});
        std::vector<Tensor> outs = grad(sum(o * dout), {qkv});
        outs.insert(outs.begin(), o);
        return values_of(outs);
      };
      const auto fused = run(DType::f32, true), reference = run(DType::f64, false);
      for (size_t n = 0; n < fused.size(); ++n) {
        double scale = 0;
        for (double x : reference[n]) scale = std::max(scale, std::abs(x));
        for (size_t i = 0; i < fused[n].size(); ++i) {
          ASSERT_NEAR(fused[n][i], reference[n][i], 2e-5 * scale) << (n == 0 ? "output" : "gradient") << " entry " << i;
        }
      }
    }
  }
}

// The bf16 matmul option reaches the fused op's products as it reaches
// matmul's: its value and gradients move (the option is in effect) by about
// bf16's precision, as the composed form's do under the same option, and stay
// bit-identical at any thread count.
TEST(Attention, FusedFollowsTheBf16MatmulOption) {
  for (const Fused kind : {Fused::attention, Fused::probs}) {
    SCOPED_TRACE(kind == Fused::attention ? "attention" : "attention_probs");
    struct Case {
      int64_t b, t, h, d;
      bool causal;
    };
    for (const Case& c : {Case{1, 197, 3, 64, false}, Case{2, 130, 2, 32, true}}) {
      SCOPED_TRACE(std::to_string(c.t) + " tokens, causal " + std::to_string(c.causal));
      std::vector<double> qkv64 = random_leaf({c.b, c.t, 3, c.h, c.d}, 13).to_vector<double>();
      std::vector<double> dout64 = random_leaf({c.b, c.t, c.h, c.d}, 14).to_vector<double>();
      Tensor qkv = Tensor::from_vector<float>({c.b, c.t, 3, c.h, c.d}, std::vector<float>(qkv64.begin(), qkv64.end()));
      Tensor dout = Tensor::from_vector<float>({c.b, c.t, c.h, c.d}, std::vector<float>(dout64.begin(), dout64.end()));
      auto part = [&](int64_t i) { return reshape(slice(qkv, 2, i, i + 1), {c.b, c.t, c.h, c.d}); };
      auto heads = [](const Tensor& t) { return permute(t, {0, 2, 1, 3}); };
      auto outputs = [&](bool fused) {
        Tensor q = part(0), k = part(1), v = part(2);
        Tensor o = fused ? fused_attention(kind, q, k, v, c.causal)
                         : heads(scaled_dot_product_attention(heads(q), heads(k), heads(v), Tensor(), c.causal));
        std::vector<Tensor> outs = grad(sum(o * dout), {qkv});
        outs.insert(outs.begin(), o);
        return outs;
      };
      auto values = [](const std::vector<Tensor>& outs, ExecOptions options) {
        std::vector<std::vector<float>> v;
        for (const Tensor& t : eval(outs, options)) v.push_back(t.to_vector<float>());
        return v;
      };
      const std::vector<Tensor> fused = outputs(true), composed = outputs(false);
      const auto f32 = values(fused, {.threads = 2});
      const auto bf16 = values(fused, {.threads = 1, .bf16_matmul = true});
      const auto composed_bf16 = values(composed, {.threads = 2, .bf16_matmul = true});
      for (int threads : {2, 3}) {
        EXPECT_EQ(values(fused, {.threads = threads, .bf16_matmul = true}), bf16) << threads << " threads";
      }
      for (size_t n = 0; n < f32.size(); ++n) {
        double scale = 0, moved = 0;
        for (float x : f32[n]) scale = std::max(scale, double(std::abs(x)));
        for (size_t i = 0; i < f32[n].size(); ++i) {
          moved = std::max(moved, double(std::abs(bf16[n][i] - f32[n][i])));
          ASSERT_NEAR(bf16[n][i], f32[n][i], 3e-2 * scale) << (n == 0 ? "output" : "gradient") << " entry " << i;
          ASSERT_NEAR(bf16[n][i], composed_bf16[n][i], 3e-2 * scale) << (n == 0 ? "output" : "gradient") << " entry " << i;
        }
        EXPECT_GT(moved, 1e-4 * scale) << (n == 0 ? "output" : "gradient") << ": the bf16 option had no effect";
      }
    }
  }
}

// A sliding window in f32 (its blocks starting past key 0, the packed
// operands not used) against the composed form in f64 under a mask built
// here: value and every gradient, windows of one key (each query sees only
// itself), within a block, across blocks and past the row (plain causal),
// and with fewer queries than keys.
TEST(Attention, SlidingWindowMatchesAMaskedComposite) {
  struct Case {
    int64_t tq, tk, window;
  };
  const int64_t B = 2, H = 2, D = 16;
  for (const Case& c : {Case{300, 300, 1}, Case{300, 300, 37}, Case{300, 300, 64}, Case{300, 300, 200},
                        Case{130, 130, 400}, Case{20, 90, 9}}) {
    SCOPED_TRACE(std::to_string(c.tq) + " queries, " + std::to_string(c.tk) + " keys, window " +
                 std::to_string(c.window));
    Tensor q64 = random_leaf({B, c.tq, H, D}, 21), k64 = random_leaf({B, c.tk, H, D}, 22);
    Tensor v64 = random_leaf({B, c.tk, H, D}, 23), dout64 = random_leaf({B, c.tq, H, D}, 24);
    std::vector<double> mask(size_t(c.tq * c.tk), 0.0);
    for (int64_t i = 0; i < c.tq; ++i) {
      for (int64_t j = 0; j < c.tk; ++j) {
        if (i + (c.tk - c.tq) - j >= c.window) mask[size_t(i * c.tk + j)] = -std::numeric_limits<double>::infinity();
      }
    }
    auto run = [&](DType dtype) {
      Tensor q = in_dtype(q64, dtype), k = in_dtype(k64, dtype), v = in_dtype(v64, dtype);
      const auto heads = [](const Tensor& t) { return permute(t, {0, 2, 1, 3}); };
      Tensor o = dtype == DType::f32 ? attention(q, k, v, true, std::nullopt, Tensor(), c.window)
                                     : heads(scaled_dot_product_attention(
                                           heads(q), heads(k), heads(v),
                                           Tensor::from_vector<double>({c.tq, c.tk}, mask), true));
      return output_and_gradients(o, q, k, v, in_dtype(dout64, dtype));
    };
    // A window of one makes the output v itself and dq, dk zero: no scale below 1.
    expect_close(run(DType::f32), run(DType::f64), 2e-5, 1.0);
  }
  Tensor q = Tensor::zeros(DType::f32, {1, 3, 2, 4});
  EXPECT_THROW(attention(q, q, q, /*causal=*/false, std::nullopt, Tensor(), 2), UsageError);
  EXPECT_THROW(attention(q, q, q, /*causal=*/true, std::nullopt, Tensor(), -1), UsageError);
}

// Soft-capped scores (Gemma 2) in f32, the cap's tanh vectorized over
// blocks of any width (tails past the vector), against the cap composed in
// f64 (scale, tanh, scale, masked softmax): value and every gradient, causal
// over several blocks, within a window, grouped heads, Gemma 2's head size.
TEST(Attention, SoftCappedMatchesTheComposedCap) {
  struct Case {
    int64_t tq, tk, h, hk, d, window;
    double cap;
  };
  const int64_t B = 2;
  for (const Case& c : {Case{150, 150, 4, 2, 16, 0, 1.5}, Case{130, 130, 2, 1, 256, 37, 0.8},
                        Case{20, 45, 2, 2, 8, 0, 5.0}, Case{70, 70, 2, 1, 24, 9, 50.0}}) {
    SCOPED_TRACE(std::to_string(c.tq) + " queries, " + std::to_string(c.tk) + " keys, head size " +
                 std::to_string(c.d) + ", window " + std::to_string(c.window) + ", cap " + std::to_string(c.cap));
    Tensor q64 = random_leaf({B, c.tq, c.h, c.d}, 31), k64 = random_leaf({B, c.tk, c.hk, c.d}, 32);
    Tensor v64 = random_leaf({B, c.tk, c.hk, c.d}, 33), dout64 = random_leaf({B, c.tq, c.h, c.d}, 34);
    std::vector<double> mask(size_t(c.tq * c.tk), 0.0);
    for (int64_t i = 0; i < c.tq; ++i) {
      for (int64_t j = 0; j < c.tk; ++j) {
        const int64_t behind = i + (c.tk - c.tq) - j;  // causal: hidden below 0
        if (behind < 0 || (c.window > 0 && behind >= c.window)) {
          mask[size_t(i * c.tk + j)] = -std::numeric_limits<double>::infinity();
        }
      }
    }
    const double scale = 1 / std::sqrt(double(c.d)) * 4;  // scores large enough for the cap to bend
    auto run = [&](DType dtype) {
      Tensor q = in_dtype(q64, dtype), k = in_dtype(k64, dtype), v = in_dtype(v64, dtype);
      Tensor o;
      if (dtype == DType::f32) {
        o = attention(q, k, v, true, scale, Tensor(), c.window, c.cap);
      } else {
        const auto heads = [&](const Tensor& t) {
          const Tensor x = permute(t, {0, 2, 1, 3});  // [B, Hk, T, D] -> each head for its group
          return reshape(expand(reshape(x, {B, t.dim(2), 1, t.dim(1), c.d}), {B, t.dim(2), c.h / t.dim(2), t.dim(1), c.d}),
                         {B, c.h, t.dim(1), c.d});
        };
        const Tensor s = matmul(heads(q), transpose(heads(k)));
        const Tensor capped = nabla::scale(tanh(nabla::scale(s, scale / c.cap)), c.cap);
        o = permute(matmul(softmax(capped, 1.0, Tensor::from_vector<double>({c.tq, c.tk}, mask)), heads(v)),
                    {0, 2, 1, 3});
      }
      return output_and_gradients(o, q, k, v, in_dtype(dout64, dtype));
    };
    expect_close(run(DType::f32), run(DType::f64), 2e-5);
  }
  Tensor q = Tensor::zeros(DType::f32, {1, 3, 2, 4});
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(attention(q, q, q, true, std::nullopt, Tensor(), 0, bad), UsageError) << bad;
  }
}

TEST(Attention, FusedRejectsBadShapes) {
  Tensor q = Tensor::zeros(DType::f32, {1, 3, 2, 4}), k = Tensor::zeros(DType::f32, {1, 2, 2, 4});
  Tensor v = Tensor::zeros(DType::f32, {1, 2, 2, 5});
  EXPECT_NO_THROW(attention(q, k, v));
  EXPECT_THROW(attention(q, k, v, /*causal=*/true), ShapeError);  // a query would see no key
  EXPECT_THROW(attention(q, reshape(k, {1, 2, 8}), v), ShapeError);
  EXPECT_THROW(attention(q, k, Tensor::zeros(DType::f32, {1, 3, 2, 5})), ShapeError);
  EXPECT_THROW(attention(q, k, Tensor::zeros(DType::f64, {1, 2, 2, 5})), DTypeError);
}

TEST(Attention, ProbabilitiesRejectBadShapes) {
  Tensor q = Tensor::zeros(DType::f32, {1, 3, 2, 4}), k = Tensor::zeros(DType::f32, {1, 2, 2, 4});
  EXPECT_EQ(attention_probs(q, k).shape(), (Shape{1, 2, 3, 2}));
  EXPECT_THROW(attention_probs(q, k, /*causal=*/true), ShapeError);  // a query would see no key
  EXPECT_THROW(attention_probs(q, Tensor::zeros(DType::f32, {1, 2, 2, 5})), ShapeError);
  EXPECT_THROW(attention_probs(q, Tensor::zeros(DType::f32, {1, 2, 3, 4})), ShapeError);
  EXPECT_THROW(attention_probs(q, Tensor::zeros(DType::f64, {1, 2, 2, 4})), DTypeError);
  EXPECT_THROW(attention_probs(reshape(q, {1, 3, 8}), k), ShapeError);
  Tensor p = Tensor::zeros(DType::f32, {1, 2, 3, 2});
  EXPECT_NO_THROW(attention_probs_back(q, k, p, p, 0.5));
  EXPECT_THROW(attention_probs_back(q, k, Tensor::zeros(DType::f32, {1, 2, 2, 3}), p, 0.5), ShapeError);
  EXPECT_THROW(attention_probs_back(q, k, p, Tensor::zeros(DType::f64, {1, 2, 3, 2}), 0.5), DTypeError);
  try {
    attention_probs_back(q, k, p, Tensor::zeros(DType::f32, {1, 2, 3}), 0.5);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("attention_probs_back"), std::string::npos) << e.what();
  }
  Tensor v = Tensor::zeros(DType::f32, {1, 2, 2, 5}), dout = Tensor::zeros(DType::f32, {1, 3, 2, 5});
  EXPECT_NO_THROW(attention_probs_values_back(q, k, p, v, dout, 0.5));
  EXPECT_THROW(attention_probs_values_back(q, k, p, v, Tensor::zeros(DType::f32, {1, 3, 2, 4}), 0.5), ShapeError);
  EXPECT_THROW(attention_probs_values_back(q, k, p, Tensor::zeros(DType::f32, {1, 3, 2, 5}), dout, 0.5), ShapeError);
  EXPECT_THROW(attention_probs_values_back(q, k, Tensor::zeros(DType::f32, {1, 2, 2, 3}), v, dout, 0.5), ShapeError);
  EXPECT_THROW(attention_probs_values_back(q, k, p, v, Tensor::zeros(DType::f64, {1, 3, 2, 5}), 0.5), DTypeError);
  try {
    attention_probs_values_back(q, k, p, reshape(v, {1, 2, 10}), dout, 0.5);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("attention_probs_values_back"), std::string::npos) << e.what();
  }
}

TEST(Attention, RejectsMismatchedShapes) {
  Tensor q = Tensor::zeros(DType::f32, {1, 2, 3, 4}), k = Tensor::zeros(DType::f32, {1, 2, 5, 3});
  Tensor v = Tensor::zeros(DType::f32, {1, 2, 5, 4});
  EXPECT_THROW(scaled_dot_product_attention(q, k, v), ShapeError);
}

}  // namespace

// ViT's attention over up to 256 tokens (nn::Attention: composed up to 64,
// attention_probs past that) reads q, k and v as heads-first views of its
// projections, or token-major, and writes its output and their gradients
// token-major (matmul_heads, attention_probs_values_back): no head copies
// forward or backward, and the same gradients as scaled_dot_product_attention
// on copied heads.
TEST(Attention, VitAttentionCopiesNoHeadsEitherWay) {
  for (const int64_t T : {5, 70}) {
    SCOPED_TRACE(std::to_string(T) + " tokens");
    const int64_t N = 2, D = 12, H = 3;
    nn::Params params;
    nn::Init init(3);
    const nn::Attention attn(params, "", {.dim = D, .heads = H, .resid_std = 0.2}, init);
    const auto f32 = [](Shape shape, uint64_t seed) {
      Tensor t = random_leaf(shape, seed), f = Tensor::zeros(DType::f32, shape);
      for (int64_t i = 0; i < t.numel(); ++i) f.data_as<float>()[i] = float(t.data_as<double>()[i]);
      return f;
    };
    Tensor x = f32({N, T, D}, 4);
    Tensor w = f32({N, T, D}, 5);
    Tensor loss = sum(attn(x) * w);
    Graph g({loss});
    g.backward(loss, {x});
    ASSERT_TRUE(g.has_grad(x));
    bool probs = false, values_back = false;
    for (const Tensor& t : topo_order(cpu::fuse(g.outputs()))) {  // as the CPU backend compiles it
      const Node* n = t.node();
      const std::string op = n->op->name;
      EXPECT_FALSE(op == "contiguous" && numel(n->shape) >= N * T * D)
          << "a head copy of shape " << to_string(n->shape);
      probs = probs || op == "attention_probs";
      values_back = values_back || op == "attention_probs_values_back";
      // With the probabilities kept, their gradient dP = dO V^T is made in
      // attention_probs_values_back's cache and never stored.
      EXPECT_FALSE(T > 64 && op == "matmul" && n->shape == (Shape{N, H, T, T})) << "dP stored";
    }
    EXPECT_EQ(probs, T > 64);
    EXPECT_EQ(values_back, T > 64);
    // The reference: the same weights through sdpa on copied heads.
    const auto linear = [&](const Tensor& t, const std::string& name) {
      return matmul(t, transpose(params.get(name + ".weight"))) + params.get(name + ".bias");
    };
    Tensor qkv = reshape(linear(x, "attn.qkv"), {N, T, 3, H, D / H});
    auto part = [&](int64_t i) { return contiguous(permute(reshape(slice(qkv, 2, i, i + 1), {N, T, H, D / H}), {0, 2, 1, 3})); };
    Tensor o = reshape(contiguous(permute(scaled_dot_product_attention(part(0), part(1), part(2)), {0, 2, 1, 3})), {N, T, D});
    Tensor ref_loss = sum(linear(o, "attn.proj") * w);
    const std::vector<Tensor> got = eval(std::vector<Tensor>{loss, g.grad(x)}, {.threads = 2});
    const std::vector<Tensor> want = eval(std::vector<Tensor>{ref_loss, grad(ref_loss, {x})[0]}, {.threads = 1});
    for (size_t i = 0; i < got.size(); ++i) {
      const std::vector<float> a = got[i].to_vector<float>(), b = want[i].to_vector<float>();
      ASSERT_EQ(a.size(), b.size());
      for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], b[j], 1e-5 * (1 + std::abs(b[j]))) << i << " " << j;
    }
  }
}
