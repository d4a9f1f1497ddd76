// Convolution and pooling values against direct loops written from PyTorch's
// definitions (the gradient tests only show that forward and backward agree),
// the adjoint identities, tie and padding rules, errors, and thread-count
// independence. Gradients themselves are checked by the registry's cases.
//
// Legend: N batch, C/O input/output channels, G groups, H x W image,
// KH x KW kernel, OH x OW output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "nabla/nabla.hpp"
#include "ops/internal_ops.h"

using namespace nabla;

namespace {

Tensor random_leaf(Shape shape, uint64_t seed, DType dtype = DType::f64) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(numel(shape)));
  for (double& x : v) x = n(rng);
  Tensor t = Tensor::from_vector<double>(shape, v);
  if (dtype == DType::f64) return t;
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_vector<float>(shape, f);
}

std::vector<double> values(const Tensor& t, ExecOptions opt = {.threads = 1}) {
  return eval(t, opt).to_vector<double>();
}

struct Geometry {
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
};

// y[n, o, oh, ow] = b[o] + sum over c in o's group, ki, kj of
// x[n, c, oh*SH - PH + ki*DH, ow*SW - PW + kj*DW] * w[o, c - group start, ki, kj].
std::vector<double> conv_2d_reference(const Tensor& x, const Tensor& w, const Tensor& b, Geometry g,
                                      Shape& out) {
  int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  int64_t O = w.dim(0), CG = w.dim(1), KH = w.dim(2), KW = w.dim(3), OG = O / g.groups;
  int64_t OH = (H + 2 * g.ph - g.dh * (KH - 1) - 1) / g.sh + 1,
          OW = (W + 2 * g.pw - g.dw * (KW - 1) - 1) / g.sw + 1;
  out = {N, O, OH, OW};
  std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(), y(numel(out), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = b.defined() ? b.item(o) : 0.0;
          for (int64_t cg = 0; cg < CG; ++cg)
            for (int64_t ki = 0; ki < KH; ++ki)
              for (int64_t kj = 0; kj < KW; ++kj) {
                int64_t ih = oh * g.sh - g.ph + ki * g.dh, iw = ow * g.sw - g.pw + kj * g.dw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                int64_t c = (o / OG) * CG + cg;
                acc +=
                    xv[((n * C + c) * H + ih) * W + iw] * wv[((o * CG + cg) * KH + ki) * KW + kj];
              }
          y[((n * O + o) * OH + oh) * OW + ow] = acc;
        }
  return y;
}

// PyTorch's transposed convolution: each input pixel (i, j) of channel c adds
// x * w[c, og, ki, kj] at output (i*SH - PH + ki*DH, j*SW - PW + kj*DW) of
// channel group(c)*OG + og.
std::vector<double> conv_transpose_2d_reference(const Tensor& x, const Tensor& w, const Tensor& b,
                                                Geometry g, int64_t oph, int64_t opw, Shape& out) {
  int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  int64_t OG = w.dim(1), KH = w.dim(2), KW = w.dim(3), O = OG * g.groups, CG = C / g.groups;
  int64_t OH = (H - 1) * g.sh - 2 * g.ph + g.dh * (KH - 1) + oph + 1;
  int64_t OW = (W - 1) * g.sw - 2 * g.pw + g.dw * (KW - 1) + opw + 1;
  out = {N, O, OH, OW};
  std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(), y(numel(out), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < OH * OW; ++i)
        y[(n * O + o) * OH * OW + i] = b.defined() ? b.item(o) : 0.0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < H; ++i)
        for (int64_t j = 0; j < W; ++j)
          for (int64_t og = 0; og < OG; ++og)
            for (int64_t ki = 0; ki < KH; ++ki)
              for (int64_t kj = 0; kj < KW; ++kj) {
                int64_t oh = i * g.sh - g.ph + ki * g.dh, ow = j * g.sw - g.pw + kj * g.dw;
                if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                int64_t o = (c / CG) * OG + og;
                y[((n * O + o) * OH + oh) * OW + ow] +=
                    xv[((n * C + c) * H + i) * W + j] * wv[((c * OG + og) * KH + ki) * KW + kj];
              }
  return y;
}

// Pools with kernel K, stride S, padding P; avg divides by KH*KW, max skips padding.
std::vector<double> pool_reference(const Tensor& x, bool is_max, Size2d k, Size2d s, Size2d p,
                                   Shape& out) {
  int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  int64_t OH = (H + 2 * p.h - k.h) / s.h + 1, OW = (W + 2 * p.w - k.w) / s.w + 1;
  out = {N, C, OH, OW};
  std::vector<double> xv = x.to_vector<double>(), y;
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double acc = is_max ? -INFINITY : 0.0;
        for (int64_t ki = 0; ki < k.h; ++ki)
          for (int64_t kj = 0; kj < k.w; ++kj) {
            int64_t ih = oh * s.h - p.h + ki, iw = ow * s.w - p.w + kj;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            double v = xv[(nc * H + ih) * W + iw];
            acc = is_max ? std::max(acc, v) : acc + v;
          }
        y.push_back(is_max ? acc : acc / double(k.h * k.w));
      }
  return y;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want,
                 double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "entry " << i;
}

double dot(const Tensor& a, const Tensor& b) { return values(sum(a * b))[0]; }

}  // namespace

TEST(conv_2d, MatchesDirectLoops) {
  struct Case {
    Shape x, w;
    bool bias;
    Geometry g;
  };
  for (const Case& c : std::vector<Case>{
           {{2, 3, 5, 4}, {4, 3, 3, 3}, true, {}},
           {{2, 3, 5, 4}, {4, 3, 3, 3}, true, {.ph = 1, .pw = 1}},
           {{1, 2, 7, 6},
            {3, 2, 3, 2},
            false,
            {.sh = 2, .sw = 1, .ph = 0, .pw = 2, .dh = 2, .dw = 2}},
           {{2, 4, 5, 5}, {6, 2, 2, 3}, true, {.sh = 1, .sw = 2, .ph = 1, .groups = 2}},
           {{2, 3, 4, 4}, {3, 1, 3, 3}, true, {.ph = 1, .pw = 1, .groups = 3}},
           {{2, 3, 8, 8}, {5, 3, 4, 4}, true, {.sh = 4, .sw = 4}},
       }) {
    Tensor x = random_leaf(c.x, 1), w = random_leaf(c.w, 2),
           b = c.bias ? random_leaf({c.w[0]}, 3) : Tensor();
    Shape shape;
    std::vector<double> want = conv_2d_reference(x, w, b, c.g, shape);
    Tensor y = conv_2d(x, w, b, {c.g.sh, c.g.sw}, {c.g.ph, c.g.pw}, {c.g.dh, c.g.dw}, c.g.groups);
    ASSERT_EQ(y.shape(), shape);
    expect_near(values(y), want);
  }
}

// Each kernel reads strided operands itself: a view and its contiguous copy
// give the same values bit for bit.
TEST(conv_2d, StridedInputsMatchTheirContiguousCopies) {
  Tensor big = random_leaf({2, 4, 7, 12}, 20), wt = random_leaf({5, 3, 4, 3}, 21);
  Tensor x = slice(big, 3, 0, 12, 2);            // [2, 4, 7, 6], column stride 2
  Tensor w = transpose(wt, 1, 2);                // [5, 4, 3, 3], axes 1 and 2 swapped
  Tensor b = expand(random_leaf({1}, 22), {5});  // stride 0
  Tensor xc = eval(contiguous(x)), wc = eval(contiguous(w)), bc = eval(contiguous(b));
  auto same = [](const Tensor& a, const Tensor& c) { EXPECT_EQ(values(a), values(c)); };
  same(conv_2d(x, w, b, 2, 1, 1, 1), conv_2d(xc, wc, bc, 2, 1, 1, 1));
  same(conv_transpose_2d(x, transpose(w, 0, 1), b, 2, 1, 1),
       conv_transpose_2d(xc, eval(contiguous(transpose(w, 0, 1))), bc, 2, 1, 1));
  same(avg_pool_2d(x, 3, 2, 1), avg_pool_2d(xc, 3, 2, 1));
  same(max_pool_2d(x, 3, 2, 1), max_pool_2d(xc, 3, 2, 1));
  Tensor cols = im2col(xc, 2);  // [2, 30, 16]
  Tensor cols_t = transpose(eval(contiguous(transpose(cols))));
  same(col2im(cols_t, 4, {7, 6}, 2), col2im(cols, 4, {7, 6}, 2));
  Tensor dy = slice(random_leaf({2, 4, 4, 6}, 23), 3, 0, 6, 2);  // [2, 4, 4, 3]
  same(avg_pool_2d_back(dy, {7, 6}, 3, 2, 1),
       avg_pool_2d_back(eval(contiguous(dy)), {7, 6}, 3, 2, 1));
  same(max_pool_2d_back(x, dy, 3, 2, 1), max_pool_2d_back(xc, eval(contiguous(dy)), 3, 2, 1));
}

TEST(conv_2d, AllOnesByHand) {
  // A 3x3 image of ones, a 2x2 kernel of ones, padding 1: corners see one
  // pixel, edges two, the middle four.
  Tensor x = Tensor::full(DType::f64, {1, 1, 3, 3}, 1.0),
         w = Tensor::full(DType::f64, {1, 1, 2, 2}, 1.0);
  EXPECT_EQ(values(conv_2d(x, w, Tensor(), 1, 1)),
            (std::vector<double>{1, 2, 2, 1, 2, 4, 4, 2, 2, 4, 4, 2, 1, 2, 2, 1}));
}

TEST(conv_transpose_2d, MatchesDirectLoops) {
  struct Case {
    Shape x, w;
    bool bias;
    Geometry g;
    int64_t oph, opw;
  };
  for (const Case& c : std::vector<Case>{
           {{2, 3, 3, 4}, {3, 2, 3, 3}, true, {}, 0, 0},
           {{2, 2, 3, 3}, {2, 3, 3, 2}, true, {.sh = 2, .sw = 2, .ph = 1, .pw = 1}, 1, 0},
           {{2, 4, 3, 3}, {4, 3, 2, 3}, true, {.sh = 2, .sw = 1, .pw = 1, .groups = 2}, 0, 0},
           {{1, 2, 3, 4}, {2, 2, 2, 2}, false, {.pw = 1, .dh = 3, .dw = 2}, 2, 0},
           {{1, 2, 4, 4},
            {2, 1, 3, 3},
            false,
            {.sh = 3, .sw = 2, .ph = 2, .pw = 1, .groups = 2},
            2,
            1},
       }) {
    Tensor x = random_leaf(c.x, 4), w = random_leaf(c.w, 5),
           b = c.bias ? random_leaf({c.w[1] * c.g.groups}, 6) : Tensor();
    Shape shape;
    std::vector<double> want = conv_transpose_2d_reference(x, w, b, c.g, c.oph, c.opw, shape);
    Tensor y = conv_transpose_2d(x, w, b, {c.g.sh, c.g.sw}, {c.g.ph, c.g.pw}, {c.oph, c.opw},
                                 {c.g.dh, c.g.dw}, c.g.groups);
    ASSERT_EQ(y.shape(), shape);
    expect_near(values(y), want);
  }
}

// <conv_2d(x), y> = <x, conv_transpose_2d(y)>: the transposed convolution is
// the adjoint in x, with the same weights and geometry.
TEST(conv_transpose_2d, IsTheAdjointOfConv2d) {
  Tensor x = random_leaf({2, 4, 8, 6}, 7), w = random_leaf({6, 2, 3, 2}, 8);
  Tensor cx = conv_2d(x, w, Tensor(), {2, 1}, {1, 1}, {1, 2}, 2);  // [2, 6, 4, 6]
  Tensor y = random_leaf(cx.shape(), 9);
  // output_padding restores the row the stride dropped: 8 = (4-1)*2 - 2 + 2 + 1 + 1.
  Tensor ty = conv_transpose_2d(y, w, Tensor(), {2, 1}, {1, 1}, {1, 0}, {1, 2}, 2);
  ASSERT_EQ(ty.shape(), x.shape());
  EXPECT_NEAR(dot(cx, y), dot(x, ty), 1e-10);
}

TEST(im2col, Col2imIsItsAdjoint) {
  Tensor x = random_leaf({2, 3, 6, 5}, 10);
  Tensor cols = im2col(x, {3, 2}, {2, 1}, {1, 2}, {2, 1});
  Tensor c = random_leaf(cols.shape(), 11);
  Tensor back = col2im(c, 3, {6, 5}, {3, 2}, {2, 1}, {1, 2}, {2, 1});
  EXPECT_NEAR(dot(cols, c), dot(x, back), 1e-10);
}

TEST(im2col, LayoutIsRowPerWindow) {
  // x [1, 2, 2, 3] = 0..11; kernel 2x2: two windows, columns (c, ki, kj).
  std::vector<double> v(12);
  for (int i = 0; i < 12; ++i) v[i] = i;
  Tensor x = Tensor::from_vector<double>({1, 2, 2, 3}, v);
  Tensor cols = im2col(x, 2);
  ASSERT_EQ(cols.shape(), (Shape{1, 2, 8}));
  EXPECT_EQ(values(cols), (std::vector<double>{0, 1, 3, 4, 6, 7, 9, 10, 1, 2, 4, 5, 7, 8, 10, 11}));
}

TEST(pool_2d, MatchesDirectLoops) {
  struct Case {
    Shape x;
    Size2d k, s, p;
  };
  for (const Case& c : std::vector<Case>{
           {{2, 3, 4, 6}, 2, 2, 0},
           {{2, 2, 5, 4}, {3, 2}, {2, 1}, {1, 1}},
           {{1, 2, 7, 7}, 3, 2, 1},
       }) {
    Tensor x = random_leaf(c.x, 12);
    Shape shape;
    std::vector<double> avg = pool_reference(x, false, c.k, c.s, c.p, shape);
    Tensor ya = avg_pool_2d(x, c.k, c.s, c.p);
    ASSERT_EQ(ya.shape(), shape);
    expect_near(values(ya), avg);
    std::vector<double> mx = pool_reference(x, true, c.k, c.s, c.p, shape);
    Tensor ym = max_pool_2d(x, c.k, c.s, c.p);
    ASSERT_EQ(ym.shape(), shape);
    expect_near(values(ym), mx, 0.0);
  }
}

TEST(pool_2d, PaddingIsZeroForAvgAndNeverWinsForMax) {
  // All -1: avg windows that overlap the padding shrink towards 0
  // (count_include_pad), max windows stay -1.
  Tensor x = Tensor::full(DType::f64, {1, 1, 2, 2}, -1.0);
  EXPECT_EQ(values(avg_pool_2d(x, 2, 1, 1)),
            (std::vector<double>{-0.25, -0.5, -0.25, -0.5, -1, -0.5, -0.25, -0.5, -0.25}));
  EXPECT_EQ(values(max_pool_2d(x, 2, 1, 1)), std::vector<double>(9, -1.0));
}

TEST(pool_2d, MaxTiesGoToTheFirstInWindowOrder) {
  // Constant 4x4, 2x2 windows: each window's gradient lands on its top-left
  // pixel, as PyTorch's max_pool2d does.
  Tensor x = Tensor::full(DType::f64, {1, 1, 4, 4}, 3.0);
  Tensor dx = grad(sum(max_pool_2d(x, 2, 2)), {x})[0];
  EXPECT_EQ(values(dx), (std::vector<double>{1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0}));
  // Overlapping windows (stride 1) that share a maximum add their gradients.
  std::vector<double> v = {0, 1, 0, 0, 5, 0, 0, 0, 0};
  Tensor y = Tensor::from_vector<double>({1, 1, 3, 3}, v);
  Tensor dy = grad(sum(max_pool_2d(y, 2, 1)), {y})[0];
  EXPECT_EQ(values(dy), (std::vector<double>{0, 0, 0, 0, 4, 0, 0, 0, 0}));
}

TEST(pool_2d, MaxPropagatesNaN) {
  std::vector<double> v = {1, std::numeric_limits<double>::quiet_NaN(), 2, 3};
  Tensor x = Tensor::from_vector<double>({1, 1, 2, 2}, v);
  EXPECT_TRUE(std::isnan(values(max_pool_2d(x, 2, 2))[0]));
}

// Overlapping windows make col2im and the pool backwards scatter-adds; they
// must still give bit-identical results at any thread count and chunking.
TEST(conv_2d, BitIdenticalAcrossThreadCounts) {
  auto run = [](int threads, int64_t max_grain) {
    Tensor x = random_leaf({2, 4, 9, 8}, 13, DType::f32),
           w = random_leaf({6, 2, 3, 3}, 14, DType::f32);
    Tensor b = random_leaf({6}, 15, DType::f32), wt = random_leaf({6, 2, 2, 2}, 16, DType::f32);
    Tensor h = conv_2d(x, w, b, 1, 1, 1, 2);                       // [2, 6, 9, 8]
    Tensor a = avg_pool_2d(max_pool_2d(h, 3, 1, 1), 3, 2, 1);      // [2, 6, 5, 4]
    Tensor y = conv_transpose_2d(a, wt, Tensor(), 2, 1, 1, 1, 2);  // [2, 4, 9, 7]
    Tensor loss = sum(square(y));
    std::vector<Tensor> g = grad(loss, {x, w, b, wt});
    std::vector<Tensor> outs =
        eval({loss, g[0], g[1], g[2], g[3]}, {.threads = threads, .max_grain = max_grain});
    std::vector<std::vector<float>> r;
    for (const Tensor& t : outs) r.push_back(t.to_vector<float>());
    return r;
  };
  auto one = run(1, 0);
  for (auto [threads, grain] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{4, 0}}) {
    auto other = run(threads, grain);
    for (size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(one[i].size(), other[i].size());
      EXPECT_EQ(std::memcmp(one[i].data(), other[i].data(), one[i].size() * sizeof(float)), 0)
          << "output " << i << " differs at " << threads << " threads, max_grain " << grain;
    }
  }
}

TEST(conv_2d, ErrorsNameTheOpAndTheShapes) {
  auto f32 = [](Shape s) { return Tensor::zeros(DType::f32, std::move(s)); };
  Tensor x = f32({2, 3, 8, 8}), w = f32({5, 3, 3, 3}), none;
  struct Case {
    std::function<Tensor()> call;
    std::string message;
  };
  // One case per entry: a table reads better than the wrapped form.
  // clang-format off
  std::vector<Case> cases = {
      {[&] { return conv_2d(f32({3, 4}), w); },
       "conv_2d: x must be [N, C, H, W], got [3, 4]"},
      {[&] { return conv_2d(x, f32({5, 4, 3, 3})); },
       "conv_2d: channels differ: x has 3, w expects 4 (groups 1)"},
      {[&] { return conv_2d(x, f32({4, 1, 3, 3}), none, 1, 0, 1, 2); },
       "conv_2d: channels differ: x has 3, w expects 2 (groups 2)"},
      {[&] { return conv_2d(x, f32({5, 3, 3})); },
       "conv_2d: w must be [O, C/groups, KH, KW], got [5, 3, 3]"},
      {[&] { return conv_2d(x, w, f32({4})); }, "conv_2d: bias must be [5], got [4]"},
      // Stride 2: the window overshoots by one row, which truncating division hides.
      {[&] { return conv_2d(x, f32({5, 3, 9, 3}), none, 2); },
       "conv_2d: kernel 9x3 (dilation 1x1) does not fit the 8x8 image padded by 0x0"},
      {[&] { return conv_2d(x, w, none, 0); }, "conv_2d: stride must be positive, got 0x0"},
      {[&] { return conv_transpose_2d(x, f32({4, 2, 3, 3})); },
       "conv_transpose_2d: channels differ: x has 3, w expects 4 (groups 1)"},
      {[&] { return conv_transpose_2d(x, f32({3, 2, 3, 3}), none, 2, 0, 2); },
       "conv_transpose_2d: output_padding must be smaller than stride or dilation, got 2x2"},
      {[&] { return max_pool_2d(x, 2, 2, 2); },
       "max_pool_2d: padding must be at most half the kernel, got padding 2x2 for kernel 2x2"},
      // Found by fuzz_c_api_graph: padding made a window of an empty image,
      // and max pooling divided by its width of 0.
      {[&] { return max_pool_2d(f32({1, 2, 3, 0}), {1, 2}, {1, 1}, {0, 1}); },
       "max_pool_2d: the image must not be empty, got 3x0"},
      {[&] { return avg_pool_2d(f32({1, 2, 0, 3}), {2, 1}, {1, 1}, {1, 0}); },
       "avg_pool_2d: the image must not be empty, got 0x3"},
      {[&] { return col2im(f32({2, 5, 27}), 3, {8, 8}, 3); },
       "col2im: cols must be [N, 36, 27] for C 3 and a 8x8 image, got [2, 5, 27]"},
  };
  // clang-format on
  for (const Case& c : cases) {
    try {
      c.call();
      ADD_FAILURE() << "no error, expected: " << c.message;
    } catch (const ShapeError& e) {
      EXPECT_EQ(std::string(e.what()), c.message);
    }
  }
  EXPECT_THROW(conv_2d(x, Tensor::zeros(DType::f64, {5, 3, 3, 3})), DTypeError);
}
