// ggml's block formats: blocks written out by hand decode to the values
// ggml-common.h's layouts define; nabla's encoder stays within each format's
// rounding bound; GGUF files carry quantized tensors both ways; 16-bit
// float conversions round to nearest even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "io/ggml_quants.h"
#include "io/half.h"
#include "nabla/error.h"
#include "nabla/gguf.h"

#include "temp_dir.h"

using namespace nabla;
using nabla::testing_support::TempDir;

namespace {

void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) { std::memcpy(b.data() + at, &v, 2); }

std::vector<float> decode(GgmlType t, const std::vector<uint8_t>& b) {
  std::vector<float> y(size_t(io::ggml_block(t).elements));
  io::dequantize(t, b.data(), int64_t(y.size()), y.data());
  return y;
}

}  // namespace

TEST(HalfFloats, F16RoundsToNearestEven) {
  // Every finite f16 survives f32 and back.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN
    ASSERT_EQ(io::f32_to_f16(io::f16_to_f32(uint16_t(h))), h) << std::hex << h;
  }
  EXPECT_EQ(io::f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // halfway: to even (1.0)
  EXPECT_EQ(io::f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // halfway: to even (up)
  EXPECT_EQ(io::f32_to_f16(65520.0f), 0x7c00);  // halfway to 65536: infinity
  EXPECT_EQ(io::f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(io::f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // halfway to the smallest subnormal: to even
  EXPECT_EQ(io::f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(io::f32_to_f16(-std::ldexp(3.0f, -24)), 0x8003);
  EXPECT_TRUE(std::isnan(io::f16_to_f32(io::f32_to_f16(NAN))));
}

TEST(HalfFloats, Bf16RoundsToNearestEven) {
  EXPECT_EQ(io::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(io::f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // halfway: to even
  EXPECT_EQ(io::f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // halfway: to even (up)
  EXPECT_EQ(io::f32_to_bf16(-3.140625f), 0xc049);
  EXPECT_TRUE(std::isnan(io::bf16_to_f32(io::f32_to_bf16(NAN))));
}

// One block of each format, laid out byte by byte as ggml-common.h defines it.
TEST(GgmlQuants, HandWrittenBlocksDecodeAsGgmlDefinesThem) {
  std::vector<uint8_t> q8(34, 0);
  put16(q8, 0, 0x3800);  // d = 0.5
  q8[2 + 7] = uint8_t(int8_t(-3));
  EXPECT_EQ(decode(GgmlType::q8_0, q8)[7], -1.5f);
  EXPECT_EQ(decode(GgmlType::q8_0, q8)[6], 0.0f);

  std::vector<uint8_t> q4(18, 0x88);  // every nibble 8: zero
  put16(q4, 0, 0x4000);               // d = 2
  q4[2 + 0] = 0x1F;                   // element 0: low nibble 15, element 16: high nibble 1
  const std::vector<float> y4 = decode(GgmlType::q4_0, q4);
  EXPECT_EQ(y4[0], 14.0f);
  EXPECT_EQ(y4[16], -14.0f);
  EXPECT_EQ(y4[1], 0.0f);

  // Q4_K: d = 1, dmin = 0.5; sub-block 5 has scale 37 and min 42, split over
  // the 12 scale bytes: low 4 bits in byte 9 (scale low, min high nibble),
  // top 2 bits in bits 6-7 of bytes 1 (scale) and 5 (min).
  std::vector<uint8_t> qk(144, 0);
  put16(qk, 0, 0x3c00);
  put16(qk, 2, 0x3800);
  qk[4 + 9] = uint8_t((37 & 0xF) | ((42 & 0xF) << 4));
  qk[4 + 1] = uint8_t((37 >> 4) << 6);
  qk[4 + 5] = uint8_t((42 >> 4) << 6);
  // Sub-block 5 = chunk 2's high nibbles (bytes 64..95 of the quants).
  qk[16 + 64 + 3] = 0x70;
  const std::vector<float> yk = decode(GgmlType::q4_k, qk);
  EXPECT_EQ(yk[5 * 32 + 3], 1.0f * 37 * 7 - 0.5f * 42);
  EXPECT_EQ(yk[5 * 32 + 4], -0.5f * 42);
  EXPECT_EQ(yk[4 * 32 + 3], 0.0f);  // sub-block 4: scale and min 0

  // Q6_K: d = 0.25 (last 2 bytes); sub-block 9 (elements 144..159, second
  // half, l = 16) has scale -3; element 144 is q = 45: low 4 bits in
  // ql[64 + 16], high 2 bits in bits 0-1 of qh[32 + 16].
  std::vector<uint8_t> q6(210, 0);
  put16(q6, 208, 0x3400);
  q6[192 + 9] = uint8_t(int8_t(-3));
  q6[64 + 16] = 45 & 0xF;
  q6[128 + 32 + 16] = 45 >> 4;
  const std::vector<float> y6 = decode(GgmlType::q6_k, q6);
  EXPECT_EQ(y6[144], 0.25f * -3 * (45 - 32));
  EXPECT_EQ(y6[145], 0.25f * -3 * -32);  // q = 0
  EXPECT_EQ(y6[143], 0.0f);              // sub-block 8: scale 0
}

// nabla's encoder: each value within the format's step of the original.
TEST(GgmlQuants, EncodingStaysWithinTheFormatsStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(1024);
  for (float& v : x) v = normal(rng);
  x[5] = 0;
  x[300] = -4.5f;  // an outlier sets its blocks' scale, its opposite is clamped
  x[301] = 4.5f;
  // Bound on |x - decoded| relative to the block's largest |x|: half a step,
  // plus what the format's rounding of its scales costs. Q8_0: steps of
  // amax / 127. Q4_0 and Q6_K map the signed extreme to -8 (-32), so its
  // opposite is clamped at +7 (+31): a whole step, amax / 8 (amax / 32, plus
  // 1/4 of it for Q6_K's 8-bit sub-block scales). Q4_K: steps of up to
  // 2 amax / 15, plus 6-bit scales and mins (amax / 63 + amax / 126).
  for (auto [type, bound] : {std::pair{GgmlType::q8_0, 0.5 / 127 * 1.01}, std::pair{GgmlType::q4_0, 1.0 / 8 * 1.01},
                             std::pair{GgmlType::q6_k, 1.0 / 32 * 1.26},
                             std::pair{GgmlType::q4_k, 1.0 / 15 + 1.0 / 63 + 1.0 / 126 + 1e-3}}) {
    const std::string bytes = io::quantize(type, x.data(), int64_t(x.size()));
    ASSERT_EQ(bytes.size(), x.size() / size_t(io::ggml_block(type).elements) * io::ggml_block(type).bytes);
    std::vector<float> y(x.size());
    io::dequantize(type, reinterpret_cast<const uint8_t*>(bytes.data()), int64_t(x.size()), y.data());
    const size_t block = size_t(io::ggml_block(type).elements);
    for (size_t b = 0; b < x.size(); b += block) {
      float amax = 0;
      for (size_t i = b; i < b + block; ++i) amax = std::max(amax, std::fabs(x[i]));
      for (size_t i = b; i < b + block; ++i) {
        ASSERT_LE(std::fabs(y[i] - x[i]), bound * amax) << ggml_type_name(type) << " element " << i;
      }
    }
  }
}

TEST(GgmlQuants, GgufFilesCarryQuantizedTensors) {
  TempDir dir;
  std::vector<float> v(2 * 256);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * float(i));
  const Tensor t = Tensor::from_vector<float>({2, 256}, v);
  GgufWriter w;
  for (GgmlType type : {GgmlType::f16, GgmlType::bf16, GgmlType::q8_0, GgmlType::q4_0, GgmlType::q4_k, GgmlType::q6_k}) {
    w.add_tensor(std::string("w.") + ggml_type_name(type), t, type);
  }
  EXPECT_THROW(w.add_tensor("odd", Tensor::zeros(DType::f32, {2, 100}), GgmlType::q4_k), ShapeError);
  w.write(dir.file("q.gguf"));
  const GgufFile f = read_gguf(dir.file("q.gguf"));
  for (GgmlType type : {GgmlType::f16, GgmlType::bf16, GgmlType::q8_0, GgmlType::q4_0, GgmlType::q4_k, GgmlType::q6_k}) {
    const GgufTensor& g = f.at(std::string("w.") + ggml_type_name(type));
    EXPECT_EQ(g.type, type);
    EXPECT_EQ(g.shape, (Shape{2, 256}));
    const std::string bytes = io::quantize(type, v.data(), int64_t(v.size()));
    std::vector<float> want(v.size());
    io::dequantize(type, reinterpret_cast<const uint8_t*>(bytes.data()), int64_t(v.size()), want.data());
    EXPECT_EQ(g.tensor.to_vector<float>(), want) << ggml_type_name(type);
  }
}
