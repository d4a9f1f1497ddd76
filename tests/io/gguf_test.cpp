// GGUF: round trips through read_gguf, the byte layout the spec prescribes
// (checked by hand, not by our reader), and corrupt files crafted byte by
// byte. Then checkpoints exported for llama.cpp (models/gguf_export.h).
// The independent reader (@huggingface/gguf) runs as the ctest
// io_gguf_js_reader.
#include "nabla/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "nabla/models/gguf.h"
#include "nabla/models/gpt2.h"
#include "nabla/models/vit.h"
#include "nabla/checkpoint.h"
#include "nabla/error.h"
#include "nabla/ops.h"
#include "nabla/tokenizer.h"

#include "temp_dir.h"

using namespace nabla;
namespace fs = std::filesystem;

namespace {

using nabla::testing_support::TempDir;

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Builds GGUF bytes by hand, field by field, as the spec lists them.
struct Bytes {
  std::string s;
  Bytes& raw(const std::string& b) {
    s += b;
    return *this;
  }
  template <class T>
  Bytes& le(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    s.append(b, sizeof(T));
    return *this;
  }
  Bytes& u32(uint32_t v) { return le(v); }
  Bytes& u64(uint64_t v) { return le(v); }
  Bytes& str(const std::string& v) { return u64(v.size()).raw(v); }
  Bytes& header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    return raw("GGUF").u32(version).u64(tensors).u64(kvs);
  }
  Bytes& pad(size_t alignment = 32) {
    s.resize((s.size() + alignment - 1) / alignment * alignment, '\0');
    return *this;
  }
};

template <class T>
T load_le(const std::string& bytes, size_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof(T));
  return v;
}

// Expects read_gguf(path) to throw IoError whose message names the file and
// contains `what`.
void expect_io_error(const std::string& path, const std::string& what) {
  try {
    read_gguf(path);
    ADD_FAILURE() << "no error for " << path << ", expected '" << what << "'";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos)
        << "message: " << msg << "\nexpected to contain: " << what;
  }
}

Tensor iota(DType dtype, Shape shape, double scale = 1) {
  Tensor t = Tensor::zeros(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = (double(i) - 3) * scale;
    if (dtype == DType::f32)
      t.data_as<float>()[i] = float(v);
    else if (dtype == DType::f64)
      t.data_as<double>()[i] = v;
    else
      t.data_as<int32_t>()[i] = int32_t(v);
  }
  return t;
}

// A tensor-only file: name "w", f32 [rows, cols] of 0, 1, 2, ...
std::string small_file(int64_t rows, int64_t cols) {
  Bytes b;
  b.header(1, 0).str("w").u32(2).u64(uint64_t(cols)).u64(uint64_t(rows)).u32(0).u64(0).pad();
  for (int64_t i = 0; i < rows * cols; ++i) b.le(float(i));
  return b.pad().s;
}

}  // namespace

TEST(Gguf, RoundTripMetadataAndTensors) {
  TempDir dir;
  GgufWriter w;
  w.set("general.architecture", "gpt2");
  w.set("general.name", std::string("nabla test model"));
  w.set("t.u8", uint8_t{200});
  w.set("t.i8", int8_t{-100});
  w.set("t.u16", uint16_t{60000});
  w.set("t.i16", int16_t{-30000});
  w.set("t.u32", uint32_t{4000000000u});
  w.set("t.i32", int32_t{-2000000000});
  w.set("t.f32", 0.1f);
  w.set("t.bool", true);
  w.set("t.u64", uint64_t{1} << 40);
  w.set("t.i64", -(int64_t{1} << 40));
  w.set("t.f64", 1e-300);
  w.set("t.u32s", std::vector<uint32_t>{1, 2, 3});
  w.set("t.strings", std::vector<std::string>{"a", "", "ünïcode"});
  w.set("t.bools", std::vector<bool>{true, false});
  w.set("t.empty", std::vector<float>{});
  w.set("t.nested",
        GgufArray{GgufType::array, {std::vector<int32_t>{1, 2}, std::vector<int32_t>{}}});
  w.set("t.u8", uint8_t{201});  // replaces the value, keeps the position

  Tensor a = iota(DType::f32, {3, 5}), b = iota(DType::f32, {7}, 0.5),
         c = iota(DType::f64, {2, 3, 4}, 0.25), d = iota(DType::i32, {4}, 1000),
         e = iota(DType::f32, {2, 1, 3, 2}), s = Tensor::scalar(2.5),
         z = Tensor::zeros(DType::f32, {0, 3});
  w.add_tensor("a", a);
  w.add_tensor("b", b);
  w.add_tensor("c", c);
  w.add_tensor("d", d);
  w.add_tensor("e", e);
  w.add_tensor("scalar", s);
  w.add_tensor("empty", z);
  w.write(dir.file("m.gguf"));
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"m.gguf"});  // no temporary left behind

  GgufFile f = read_gguf(dir.file("m.gguf"));
  EXPECT_EQ(f.version, 3u);
  EXPECT_EQ(f.alignment, 32u);
  std::vector<std::string> keys;
  for (const auto& [k, v] : f.metadata) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"general.architecture", "general.name", "t.u8", "t.i8",
                                            "t.u16", "t.i16", "t.u32", "t.i32", "t.f32", "t.bool",
                                            "t.u64", "t.i64", "t.f64", "t.u32s", "t.strings",
                                            "t.bools", "t.empty", "t.nested"}));
  EXPECT_EQ(f.value("general.architecture").get<std::string>(), "gpt2");
  EXPECT_EQ(f.value("t.u8").get<uint8_t>(), 201);
  EXPECT_EQ(f.value("t.i8").get<int8_t>(), -100);
  EXPECT_EQ(f.value("t.u16").get<uint16_t>(), 60000);
  EXPECT_EQ(f.value("t.i16").get<int16_t>(), -30000);
  EXPECT_EQ(f.value("t.u32").get<uint32_t>(), 4000000000u);
  EXPECT_EQ(f.value("t.i32").get<int32_t>(), -2000000000);
  EXPECT_EQ(f.value("t.f32").get<float>(), 0.1f);
  EXPECT_EQ(f.value("t.bool").get<bool>(), true);
  EXPECT_EQ(f.value("t.u64").get<uint64_t>(), uint64_t{1} << 40);
  EXPECT_EQ(f.value("t.i64").get<int64_t>(), -(int64_t{1} << 40));
  EXPECT_EQ(f.value("t.f64").get<double>(), 1e-300);
  EXPECT_EQ(f.value("t.u32s"), GgufValue(std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(f.value("t.strings"), GgufValue(std::vector<std::string>{"a", "", "ünïcode"}));
  EXPECT_EQ(f.value("t.bools").get<GgufArray>().items.size(), 2u);
  EXPECT_EQ(f.value("t.empty").get<GgufArray>().type, GgufType::f32);
  EXPECT_TRUE(f.value("t.empty").get<GgufArray>().items.empty());
  const GgufArray& nested = f.value("t.nested").get<GgufArray>();
  ASSERT_EQ(nested.items.size(), 2u);
  EXPECT_EQ(nested.items[0], GgufValue(std::vector<int32_t>{1, 2}));
  EXPECT_EQ(nested.items[1].get<GgufArray>().type, GgufType::i32);
  EXPECT_THROW(f.value("t.u8").get<uint32_t>(), UsageError);
  EXPECT_THROW(f.value("no.such.key"), IoError);

  ASSERT_EQ(f.tensors.size(), 7u);
  EXPECT_EQ(f.at("a").shape, (Shape{3, 5}));
  EXPECT_EQ(f.at("a").type, GgmlType::f32);
  EXPECT_EQ(f.at("a").tensor.to_vector<float>(), a.to_vector<float>());
  EXPECT_EQ(f.at("b").tensor.to_vector<float>(), b.to_vector<float>());
  EXPECT_EQ(f.at("c").type, GgmlType::f64);
  EXPECT_EQ(f.at("c").shape, (Shape{2, 3, 4}));
  EXPECT_EQ(f.at("c").tensor.to_vector<double>(), c.to_vector<double>());
  EXPECT_EQ(f.at("d").type, GgmlType::i32);
  EXPECT_EQ(f.at("d").tensor.to_vector<int32_t>(), d.to_vector<int32_t>());
  EXPECT_EQ(f.at("e").shape, (Shape{2, 1, 3, 2}));
  EXPECT_EQ(f.at("e").tensor.to_vector<float>(), e.to_vector<float>());
  EXPECT_EQ(f.at("scalar").shape, (Shape{1}));  // ggml has no rank 0
  EXPECT_EQ(f.at("scalar").tensor.to_vector<float>(), std::vector<float>{2.5f});
  EXPECT_EQ(f.at("empty").shape, (Shape{0, 3}));
  EXPECT_EQ(f.at("empty").tensor.numel(), 0);
  for (const GgufTensor& t : f.tensors) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_TRUE(t.tensor.is_leaf());
  }
  EXPECT_EQ(f.data_offset % 32, 0u);
  EXPECT_THROW(f.at("missing"), IoError);
}

// The bytes themselves, read by hand: dims reversed (ggml order), offsets
// relative to the data section, zero padding to the alignment between the
// infos and the data, between tensors and after the last one.
TEST(Gguf, ByteLayoutMatchesTheSpec) {
  TempDir dir;
  GgufWriter w;
  w.set("general.alignment", uint32_t{64});
  w.add_tensor("w", iota(DType::f32, {3, 5}));  // 60 bytes -> padded to 64
  w.add_tensor("b", iota(DType::f32, {17}));    // 68 bytes -> padded to 128
  w.write(dir.file("m.gguf"));
  std::string bytes = read_raw(dir.file("m.gguf"));

  Bytes expect;
  expect.header(2, 1).str("general.alignment").u32(4).u32(64);
  expect.str("w").u32(2).u64(5).u64(3).u32(0).u64(0);  // NumPy [3, 5] is ggml {5, 3}
  expect.str("b").u32(1).u64(17).u32(0).u64(64);
  expect.pad(64);
  size_t data = expect.s.size();
  for (int i = 0; i < 15; ++i) expect.le(float(i - 3));
  expect.pad(64);
  for (int i = 0; i < 17; ++i) expect.le(float(i - 3));
  expect.pad(64);
  EXPECT_EQ(bytes.size(), data + 64 + 128);
  EXPECT_TRUE(bytes == expect.s) << "file differs from the hand-built layout";

  GgufFile f = read_gguf(dir.file("m.gguf"));
  EXPECT_EQ(f.alignment, 64u);
  EXPECT_EQ(f.data_offset, data);
  EXPECT_EQ(f.at("b").offset, 64u);
}

TEST(Gguf, ReadsFilesWrittenByOthers) {
  TempDir dir;
  // Version 2 (same layout for little-endian files), F16 and BF16 data, no
  // padding after the last tensor, a tensor of 0 dims, and metadata types our
  // writer never chooses on its own.
  Bytes b;
  b.header(3, 2, 2)
      .str("k.f16_note")
      .u32(8)
      .str("half")
      .str("k.u16s")
      .u32(9)
      .u32(2)
      .u64(2)
      .le(uint16_t{1})
      .le(uint16_t{2});
  b.str("h").u32(1).u64(4).u32(1).u64(0);
  b.str("g").u32(1).u64(2).u32(30).u64(32);
  b.str("s").u32(0).u32(0).u64(64);
  b.pad();
  for (uint16_t h : {0x3c00, 0xc000, 0x3800, 0x0001}) b.le(h);  // 1, -2, 0.5, smallest subnormal
  b.pad();
  for (uint16_t h : {0x3f80, 0xc0a0}) b.le(h);  // bf16: 1, -5
  b.pad();
  b.le(7.0f);
  write_raw(dir.file("v2.gguf"), b.s);

  GgufFile f = read_gguf(dir.file("v2.gguf"));
  EXPECT_EQ(f.version, 2u);
  EXPECT_EQ(f.value("k.u16s"), GgufValue(std::vector<uint16_t>{1, 2}));
  EXPECT_EQ(f.at("h").type, GgmlType::f16);
  std::vector<float> h = f.at("h").tensor.to_vector<float>();
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 0.5f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(f.at("g").tensor.to_vector<float>(), (std::vector<float>{1.0f, -5.0f}));
  EXPECT_EQ(f.at("s").shape, Shape{});
  EXPECT_EQ(f.at("s").tensor.to_vector<float>(), std::vector<float>{7.0f});
}

TEST(Gguf, WriterRejectsWhatReadersCannotLoad) {
  GgufWriter w;
  EXPECT_THROW(w.set("", 1), UsageError);
  EXPECT_THROW(w.set("bad\x80key", 1), UsageError);
  EXPECT_THROW(w.set("general.alignment", 64), UsageError);  // i32, not u32
  EXPECT_THROW(w.set("general.alignment", uint32_t{24}), UsageError);
  EXPECT_THROW(w.set("general.alignment", uint32_t{4}), UsageError);
  EXPECT_THROW(w.set("k", GgufArray{GgufType::u32, {uint32_t{1}, 2.0f}}), UsageError);
  EXPECT_EQ(w.alignment(), 32u);
  Tensor t = iota(DType::f32, {2, 2});
  EXPECT_THROW(w.add_tensor("", t), UsageError);
  EXPECT_THROW(w.add_tensor(std::string(64, 'x'), t), UsageError);
  EXPECT_NO_THROW(w.add_tensor(std::string(63, 'x'), t));
  w.add_tensor("t", t);
  EXPECT_THROW(w.add_tensor("t", t), UsageError);
  EXPECT_THROW(w.add_tensor("r5", Tensor::zeros(DType::f32, {1, 1, 1, 1, 2})), ShapeError);
  EXPECT_THROW(w.add_tensor("sum", t + t), UsageError);  // not a leaf: no data yet
  EXPECT_THROW(w.add_tensor("none", Tensor()), UsageError);
}

// write_file_atomic's guarantees (old file or new, never half) are tested
// with safetensors; here: failures surface as IoError and leave no litter.
TEST(Gguf, FailedWriteIsAnIoError) {
  TempDir dir;
  GgufWriter w;
  w.add_tensor("a", iota(DType::f32, {4}));
  EXPECT_THROW(w.write(dir.file("no/such/dir/m.gguf")), IoError);
  fs::create_directories(dir.file("taken/sub"));  // a non-empty directory where the file should go
  EXPECT_THROW(w.write(dir.file("taken")), IoError);
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"taken"});
}

TEST(Gguf, RejectsBadHeaders) {
  TempDir dir;
  expect_io_error(dir.file("missing.gguf"), "cannot open");
  std::string good = small_file(2, 3);

  std::string bad = good;
  bad[3] = 'X';
  write_raw(dir.file("magic.gguf"), bad);
  expect_io_error(dir.file("magic.gguf"), "not a GGUF file: magic is 47 47 55 58");

  for (uint32_t v : {0u, 1u, 4u, 99u}) {
    bad = good;
    std::memcpy(bad.data() + 4, &v, 4);
    write_raw(dir.file("version.gguf"), bad);
    expect_io_error(dir.file("version.gguf"), "unsupported GGUF version " + std::to_string(v));
  }
  bad = good;
  uint32_t big_endian_3 = 0x03000000u;
  std::memcpy(bad.data() + 4, &big_endian_3, 4);
  write_raw(dir.file("be.gguf"), bad);
  expect_io_error(dir.file("be.gguf"), "big-endian");

  bad = good;
  uint64_t huge = uint64_t(1) << 60;
  std::memcpy(bad.data() + 8, &huge, 8);
  write_raw(dir.file("tensors.gguf"), bad);
  expect_io_error(dir.file("tensors.gguf"), "tensor_count 1152921504606846976 is too large");
  bad = good;
  std::memcpy(bad.data() + 16, &huge, 8);
  write_raw(dir.file("kvs.gguf"), bad);
  expect_io_error(dir.file("kvs.gguf"), "metadata_kv_count 1152921504606846976 is too large");
}

// Every proper prefix of a valid file is an IoError, never a crash or a
// silently short tensor.
TEST(Gguf, EveryTruncationIsAnError) {
  TempDir dir;
  GgufWriter w;
  w.set("general.architecture", "x");
  w.set("k.arr", std::vector<std::string>{"ab", "cd"});
  w.set("k.f", 1.5f);
  w.add_tensor("a", iota(DType::f32, {2, 3}));
  w.add_tensor("b", iota(DType::f64, {5}));
  w.write(dir.file("full.gguf"));
  std::string full = read_raw(dir.file("full.gguf"));
  ASSERT_NO_THROW(read_gguf(dir.file("full.gguf")));
  // The last tensor's trailing padding is optional; everything before its
  // last byte is required.
  GgufFile f = read_gguf(dir.file("full.gguf"));
  size_t required = f.data_offset + f.at("b").offset + 5 * 8;
  for (size_t n = 0; n < required; ++n) {
    write_raw(dir.file("cut.gguf"), full.substr(0, n));
    EXPECT_THROW(read_gguf(dir.file("cut.gguf")), IoError) << "prefix of " << n << " bytes";
  }
  write_raw(dir.file("cut.gguf"), full.substr(0, required));
  EXPECT_NO_THROW(read_gguf(dir.file("cut.gguf")));
  write_raw(dir.file("cut.gguf"), full.substr(0, 10));
  expect_io_error(dir.file("cut.gguf"),
                  "truncated: tensor_count needs 8 bytes at offset 8, the file has 10");
}

TEST(Gguf, RejectsBadTensorInfos) {
  TempDir dir;
  auto check = [&](const std::string& name, const std::function<void(Bytes&)>& info,
                   const std::string& what, size_t data_bytes = 64) {
    Bytes b;
    b.header(1, 0);
    info(b);
    b.pad();
    b.s.append(data_bytes, '\0');
    write_raw(dir.file(name), b.s);
    expect_io_error(dir.file(name), what);
  };
  check(
      "misaligned.gguf", [](Bytes& b) { b.str("w").u32(1).u64(4).u32(0).u64(4); },
      "tensor 'w' offset 4 is not a multiple of the alignment 32");
  check(
      "outside.gguf", [](Bytes& b) { b.str("w").u32(1).u64(4).u32(0).u64(64); },
      "tensor 'w' at offset 64 with 16 bytes lies outside the data section of 64 bytes");
  check(
      "toolarge.gguf", [](Bytes& b) { b.str("w").u32(1).u64(17).u32(0).u64(0); },
      "lies outside the data section");
  check(
      "dims.gguf",
      [](Bytes& b) { b.str("w").u32(5).u64(1).u64(1).u64(1).u64(1).u64(1).u32(0).u64(0); },
      "tensor 'w' has 5 dimensions, at most 4 allowed");
  check(
      "overflow.gguf",
      [](Bytes& b) {
        b.str("w").u32(2).u64(uint64_t(1) << 40).u64(uint64_t(1) << 40).u32(0).u64(0);
      },
      "tensor 'w' is too large");
  check(
      "quant.gguf", [](Bytes& b) { b.str("w").u32(1).u64(256).u32(13).u64(0); },
      "ggml type Q5_K (13), nabla reads");
  check(
      "blocks.gguf", [](Bytes& b) { b.str("w").u32(2).u64(100).u64(2).u32(12).u64(0); },
      "Q4_K with rows of 100 elements, not a whole number of its 256-element blocks");
  check(
      "unknown.gguf", [](Bytes& b) { b.str("w").u32(1).u64(4).u32(99).u64(0); },
      "unknown ggml type 99");
  check(
      "longname.gguf", [](Bytes& b) { b.str(std::string(65, 'n')).u32(1).u64(4).u32(0).u64(0); },
      "tensor name 0 is 65 bytes, at most 64 allowed");
  check(
      "hugename.gguf", [](Bytes& b) { b.u64(uint64_t(1) << 62); }, "tensor name 0");

  Bytes twice;
  twice.header(2, 0)
      .str("w")
      .u32(1)
      .u64(4)
      .u32(0)
      .u64(0)
      .str("w")
      .u32(1)
      .u64(4)
      .u32(0)
      .u64(32)
      .pad();
  twice.s.append(64, '\0');
  write_raw(dir.file("twice.gguf"), twice.s);
  expect_io_error(dir.file("twice.gguf"), "tensor name 'w' appears twice");

  Bytes overlap;
  overlap.header(2, 0)
      .str("w")
      .u32(1)
      .u64(16)
      .u32(0)
      .u64(0)
      .str("v")
      .u32(1)
      .u64(4)
      .u32(0)
      .u64(32)
      .pad();
  overlap.s.append(96, '\0');
  write_raw(dir.file("overlap.gguf"), overlap.s);
  expect_io_error(dir.file("overlap.gguf"), "tensors 'w' and 'v' overlap");
}

TEST(Gguf, RejectsBadMetadata) {
  TempDir dir;
  auto check = [&](const std::string& name, const std::function<void(Bytes&)>& kvs, uint64_t count,
                   const std::string& what) {
    Bytes b;
    b.header(0, count);
    kvs(b);
    b.s.append(64, '\0');  // room, so that counts are not rejected up front
    write_raw(dir.file(name), b.s);
    expect_io_error(dir.file(name), what);
  };
  check(
      "type.gguf", [](Bytes& b) { b.str("k").u32(13).u32(0); }, 1,
      "metadata 'k': unknown value type 13");
  check(
      "bool.gguf", [](Bytes& b) { b.str("k").u32(7).raw("\x02"); }, 1,
      "metadata 'k': bool byte is 2");
  check(
      "dup.gguf", [](Bytes& b) { b.str("k").u32(4).u32(1).str("k").u32(4).u32(2); }, 2,
      "metadata key 'k' appears twice");
  check(
      "array.gguf", [](Bytes& b) { b.str("k").u32(9).u32(6).u64(uint64_t(1) << 40); }, 1,
      "metadata 'k': array of 1099511627776 f32 items cannot fit");
  check(
      "arraytype.gguf", [](Bytes& b) { b.str("k").u32(9).u32(77).u64(1); }, 1,
      "unknown array item type 77");
  check(
      "string.gguf", [](Bytes& b) { b.str("k").u32(8).u64(uint64_t(1) << 50); }, 1,
      "truncated: metadata 'k'");
  check(
      "key.gguf", [](Bytes& b) { b.u64(70000); }, 1,
      "metadata key 0 is 70000 bytes, at most 65535 allowed");
  check(
      "nested.gguf",
      [](Bytes& b) {
        b.str("k").u32(9);
        for (int i = 0; i < 9; ++i) b.u32(9).u64(1);
      },
      1, "arrays nest deeper than 8");
  check(
      "align_type.gguf", [](Bytes& b) { b.str("general.alignment").u32(10).u64(32); }, 1,
      "general.alignment is u64, must be u32");
  check(
      "align_value.gguf", [](Bytes& b) { b.str("general.alignment").u32(4).u32(12); }, 1,
      "general.alignment is 12, must be a non-zero multiple of 8");
}

TEST(Gguf, ValueTypesFollowTheCppType) {
  EXPECT_EQ(GgufValue(uint8_t{1}).type(), GgufType::u8);
  EXPECT_EQ(GgufValue(int16_t{1}).type(), GgufType::i16);
  EXPECT_EQ(GgufValue(1).type(), GgufType::i32);
  EXPECT_EQ(GgufValue(1u).type(), GgufType::u32);
  EXPECT_EQ(GgufValue(1ll).type(), GgufType::i64);
  EXPECT_EQ(GgufValue(size_t{1}).type(), GgufType::u64);
  EXPECT_EQ(GgufValue(1.0f).type(), GgufType::f32);
  EXPECT_EQ(GgufValue(1.0).type(), GgufType::f64);
  EXPECT_EQ(GgufValue(false).type(), GgufType::boolean);
  EXPECT_EQ(GgufValue("s").type(), GgufType::string);  // not bool
  EXPECT_EQ(GgufValue(std::vector<double>{}).get<GgufArray>().type, GgufType::f64);
  EXPECT_STREQ(gguf_type_name(GgufType::boolean), "bool");
}

// ---- Checkpoints exported for llama.cpp (models/gguf_export.h)

namespace {

models::Gpt2Config tiny_gpt2(const std::string& tokenizer, int64_t vocab) {
  models::Gpt2Config c;
  c.preset = "tiny";
  c.vocab_size = vocab;
  c.n_positions = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.tokenizer = tokenizer;
  return c;
}

// Saves a freshly initialised GPT-2 and returns its parameters by name.
nn::Params save_gpt2(const std::string& path, const models::Gpt2Config& c) {
  models::Gpt2 model(c, 7);
  save_checkpoint(path, c.to_json(), model.params());
  return model.params();
}

GgufWriter export_checkpoint(const std::string& ckpt,
                             const models::GgufExportOptions& options = {}) {
  return models::gguf_from_checkpoint(load_checkpoint(ckpt), options);
}

GgufFile export_and_read(const std::string& ckpt, const std::string& out,
                         const models::GgufExportOptions& options = {}) {
  export_checkpoint(ckpt, options).write(out);
  return read_gguf(out);
}

// Expects `what` to throw E whose message names `file` and contains `text`.
template <class E>
void expect_error(const std::function<void()>& what, const std::string& file,
                  const std::string& text) {
  try {
    what();
    ADD_FAILURE() << "no error, expected '" << text << "'";
  } catch (const E& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(text), std::string::npos) << "message: " << msg << "\nexpected: " << text;
  }
}

}  // namespace

// llama.cpp's gpt2 loader (src/models/gpt2.cpp) wants these names and ggml
// shapes: token_embd {D, V}, position_embd {D, P}, attn_qkv {D, 3D},
// attn_output {D, D}, ffn_up {D, F}, ffn_down {F, D}; our reader reports
// NumPy order, the reverse.
TEST(GgufExport, Gpt2TensorsFollowLlamaCpp) {
  TempDir dir;
  models::Gpt2Config c = tiny_gpt2("byte", 256);
  nn::Params p = save_gpt2(dir.file("g.safetensors"), c);
  GgufFile f = export_and_read(dir.file("g.safetensors"), dir.file("g.gguf"));

  EXPECT_EQ(f.value("general.architecture").get<std::string>(), "gpt2");
  EXPECT_EQ(f.value("general.name").get<std::string>(), "tiny");
  EXPECT_EQ(f.value("general.file_type").get<uint32_t>(), 0u);
  EXPECT_EQ(f.value("gpt2.context_length").get<uint32_t>(), 16u);
  EXPECT_EQ(f.value("gpt2.embedding_length").get<uint32_t>(), 8u);
  EXPECT_EQ(f.value("gpt2.feed_forward_length").get<uint32_t>(), 32u);
  EXPECT_EQ(f.value("gpt2.block_count").get<uint32_t>(), 2u);
  EXPECT_EQ(f.value("gpt2.attention.head_count").get<uint32_t>(), 2u);
  EXPECT_EQ(f.value("gpt2.attention.layer_norm_epsilon").get<float>(), 1e-5f);

  std::vector<std::string> names;
  for (const GgufTensor& t : f.tensors) names.push_back(t.name);
  std::vector<std::string> expected = {"token_embd.weight", "position_embd.weight"};
  for (const char* blk : {"blk.0.", "blk.1."}) {
    for (const char* t :
         {"attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down"}) {
      expected.push_back(std::string(blk) + t + ".weight");
      expected.push_back(std::string(blk) + t + ".bias");
    }
  }
  expected.push_back("output_norm.weight");
  expected.push_back("output_norm.bias");
  EXPECT_EQ(names, expected);  // no output.weight: the head is tied to token_embd

  EXPECT_EQ(f.at("token_embd.weight").shape, (Shape{256, 8}));
  EXPECT_EQ(f.at("position_embd.weight").shape, (Shape{16, 8}));
  EXPECT_EQ(f.at("blk.1.attn_norm.weight").shape, (Shape{8}));
  EXPECT_EQ(f.at("blk.1.attn_qkv.weight").shape, (Shape{24, 8}));
  EXPECT_EQ(f.at("blk.1.attn_qkv.bias").shape, (Shape{24}));
  EXPECT_EQ(f.at("blk.1.attn_output.weight").shape, (Shape{8, 8}));
  EXPECT_EQ(f.at("blk.1.ffn_up.weight").shape, (Shape{32, 8}));
  EXPECT_EQ(f.at("blk.1.ffn_up.bias").shape, (Shape{32}));
  EXPECT_EQ(f.at("blk.1.ffn_down.weight").shape, (Shape{8, 32}));
  EXPECT_EQ(f.at("output_norm.bias").shape, (Shape{8}));
  for (const GgufTensor& t : f.tensors) EXPECT_EQ(t.type, GgmlType::f32) << t.name;

  // Copied tensors are bit-identical; Conv1D weights [in, out] arrive as [out, in].
  auto same = [&](const std::string& gguf, const std::string& hf) {
    EXPECT_EQ(f.at(gguf).tensor.to_vector<float>(), p.get(hf).to_vector<float>()) << gguf;
  };
  same("token_embd.weight", "wte.weight");
  same("position_embd.weight", "wpe.weight");
  same("blk.1.attn_norm.weight", "h.1.ln_1.weight");
  same("blk.1.attn_qkv.bias", "h.1.attn.c_attn.bias");
  same("blk.1.ffn_down.bias", "h.1.mlp.c_proj.bias");
  same("output_norm.weight", "ln_f.weight");
  auto transposed = [&](const std::string& gguf, const std::string& hf) {
    std::vector<float> g = f.at(gguf).tensor.to_vector<float>(), w = p.get(hf).to_vector<float>();
    int64_t in = p.get(hf).dim(0), out = p.get(hf).dim(1);
    ASSERT_EQ(g.size(), w.size()) << gguf;
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o)
        ASSERT_EQ(g[o * in + i], w[i * out + o]) << gguf << " [" << o << ", " << i << "]";
  };
  transposed("blk.0.attn_qkv.weight", "h.0.attn.c_attn.weight");
  transposed("blk.1.attn_output.weight", "h.1.attn.c_proj.weight");
  transposed("blk.1.ffn_up.weight", "h.1.mlp.c_fc.weight");
  transposed("blk.0.ffn_down.weight", "h.0.mlp.c_proj.weight");
}

// The byte tokenizer becomes 256 tokens in GPT-2's byte alphabet with no
// merges; a padded embedding gets unused padding tokens.
TEST(GgufExport, Gpt2ByteVocabulary) {
  TempDir dir;
  save_gpt2(dir.file("g.safetensors"), tiny_gpt2("byte", 260));
  GgufFile f = export_and_read(dir.file("g.safetensors"), dir.file("g.gguf"));
  EXPECT_EQ(f.value("tokenizer.ggml.model").get<std::string>(), "gpt2");
  EXPECT_EQ(f.value("tokenizer.ggml.pre").get<std::string>(), "gpt-2");
  const GgufArray& tokens = f.value("tokenizer.ggml.tokens").get<GgufArray>();
  const GgufArray& types = f.value("tokenizer.ggml.token_type").get<GgufArray>();
  const GgufArray& merges = f.value("tokenizer.ggml.merges").get<GgufArray>();
  ASSERT_EQ(tokens.items.size(), 260u);
  ASSERT_EQ(types.items.size(), 260u);
  EXPECT_EQ(types.type, GgufType::i32);  // llama.cpp insists on INT32
  EXPECT_EQ(merges.type, GgufType::string);
  EXPECT_TRUE(merges.items.empty());
  auto token = [&](size_t i) { return tokens.items[i].get<std::string>(); };
  EXPECT_EQ(token('A'), "A");
  EXPECT_EQ(token('~'), "~");
  EXPECT_EQ(token(0), "\u0100");     // the first non-printable byte
  EXPECT_EQ(token('\n'), "\u010A");  // GPT-2's "Ċ"
  EXPECT_EQ(token(' '), "\u0120");   // GPT-2's "Ġ"
  EXPECT_EQ(token(0xA1), "\u00A1");
  EXPECT_EQ(token(0xAD), "\u0143");  // soft hyphen: the last of the 68
  EXPECT_EQ(token(0xFF), "\u00FF");
  EXPECT_EQ(token(256), "[PAD256]");
  EXPECT_EQ(token(259), "[PAD259]");
  for (size_t i = 0; i < 260; ++i) EXPECT_EQ(types.items[i].get<int32_t>(), i < 256 ? 1 : 5) << i;
  EXPECT_EQ(f.value("tokenizer.ggml.bos_token_id").get<uint32_t>(), 10u);
  EXPECT_EQ(f.value("tokenizer.ggml.eos_token_id").get<uint32_t>(), 10u);
  EXPECT_EQ(f.value("tokenizer.ggml.eot_token_id").get<uint32_t>(), 10u);
  EXPECT_EQ(f.value("tokenizer.ggml.add_bos_token").get<bool>(), false);
  EXPECT_EQ(f.at("token_embd.weight").shape, (Shape{260, 8}));
}

// GPT-2's BPE vocabulary, when installed (scripts/fetch-gpt2-vocab).
TEST(GgufExport, Gpt2BpeVocabulary) {
  std::string vocab = find_gpt2_vocab();
  if (vocab.empty())
    GTEST_SKIP() << "GPT-2's vocabulary is not installed: run scripts/fetch-gpt2-vocab";
  TempDir dir;
  save_gpt2(dir.file("g.safetensors"), tiny_gpt2("gpt2", 50257));
  GgufFile f = export_and_read(dir.file("g.safetensors"), dir.file("g.gguf"), {.vocab_dir = vocab});
  const GgufArray& tokens = f.value("tokenizer.ggml.tokens").get<GgufArray>();
  const GgufArray& types = f.value("tokenizer.ggml.token_type").get<GgufArray>();
  const GgufArray& merges = f.value("tokenizer.ggml.merges").get<GgufArray>();
  ASSERT_EQ(tokens.items.size(), 50257u);
  ASSERT_EQ(types.items.size(), 50257u);
  ASSERT_EQ(merges.items.size(), 50000u);
  EXPECT_EQ(tokens.items[15496].get<std::string>(), "Hello");
  EXPECT_EQ(tokens.items[995].get<std::string>(), "\u0120world");  // " world"
  EXPECT_EQ(tokens.items[198].get<std::string>(), "\u010A");       // "\n"
  EXPECT_EQ(tokens.items[50256].get<std::string>(), "<|endoftext|>");
  EXPECT_EQ(merges.items[0].get<std::string>(), "\u0120 t");  // vocab.bpe's first merge
  EXPECT_EQ(types.items[50256].get<int32_t>(), 3);            // control
  EXPECT_EQ(types.items[15496].get<int32_t>(), 1);
  EXPECT_EQ(f.value("tokenizer.ggml.bos_token_id").get<uint32_t>(), 50256u);
  EXPECT_EQ(f.value("tokenizer.ggml.eos_token_id").get<uint32_t>(), 50256u);
  EXPECT_EQ(f.value("tokenizer.ggml.eot_token_id").get<uint32_t>(), 50256u);
  EXPECT_EQ(f.at("token_embd.weight").shape, (Shape{50257, 8}));
}

TEST(GgufExport, Gpt2WithoutBiasesGetsZeroBiases) {
  TempDir dir;
  models::Gpt2Config c = tiny_gpt2("byte", 256);
  c.bias = false;
  save_gpt2(dir.file("g.safetensors"), c);
  GgufFile f = export_and_read(dir.file("g.safetensors"), dir.file("g.gguf"));
  EXPECT_EQ(f.at("blk.0.attn_qkv.bias").tensor.to_vector<float>(), std::vector<float>(24, 0.0f));
  EXPECT_EQ(f.at("blk.1.ffn_up.bias").tensor.to_vector<float>(), std::vector<float>(32, 0.0f));
  EXPECT_EQ(f.at("blk.1.ffn_down.bias").shape, (Shape{8}));
}

// ViT keeps timm's names and shapes, with nabla's vit.* keys.
TEST(GgufExport, Vit) {
  TempDir dir;
  models::VitConfig c;
  c.preset = "tiny-vit";
  c.img_size = 8;
  c.patch_size = 4;
  c.in_chans = 1;
  c.embed_dim = 8;
  c.depth = 1;
  c.num_heads = 2;
  c.num_classes = 3;
  models::Vit model(c, 3);
  save_checkpoint(dir.file("v.safetensors"), c.to_json(), model.params());
  GgufFile f = export_and_read(dir.file("v.safetensors"), dir.file("v.gguf"));
  EXPECT_EQ(f.value("general.architecture").get<std::string>(), "vit");
  EXPECT_EQ(f.value("general.name").get<std::string>(), "tiny-vit");
  EXPECT_EQ(f.value("vit.image_size").get<uint32_t>(), 8u);
  EXPECT_EQ(f.value("vit.feed_forward_length").get<uint32_t>(), 32u);
  EXPECT_EQ(f.value("vit.gelu").get<std::string>(), "gelu_erf");
  ASSERT_EQ(f.tensors.size(), model.params().list().size());
  for (const auto& [name, t] : model.params().list()) {
    EXPECT_EQ(f.at(name).shape, t.shape()) << name;
    EXPECT_EQ(f.at(name).tensor.to_vector<float>(), t.to_vector<float>()) << name;
  }
}

TEST(GgufExport, RefusesWhatLlamaCppWouldComputeDifferently) {
  TempDir dir;
  models::Gpt2Config c = tiny_gpt2("byte", 256);
  c.gelu = "gelu_erf";
  save_gpt2(dir.file("erf.safetensors"), c);
  expect_error<UsageError>([&] { export_checkpoint(dir.file("erf.safetensors")); },
                           dir.file("erf.safetensors"), "tanh GELU");
}

TEST(GgufExport, BadCheckpointsAreErrorsNamingTheFile) {
  TempDir dir;
  // Exporting dir/name must throw UsageError / IoError naming that file and saying `text`.
  auto expect_usage = [&](const std::string& name, const std::string& text) {
    expect_error<UsageError>([&] { export_checkpoint(dir.file(name)); }, dir.file(name), text);
  };
  auto expect_io = [&](const std::string& name, const std::string& text) {
    expect_error<IoError>([&] { export_checkpoint(dir.file(name)); }, dir.file(name), text);
  };
  nn::Params p;
  p.add("w", Tensor::zeros(DType::f32, {2}));
  save_checkpoint(dir.file("mlp.safetensors"), R"({"architecture": "mlp"})", p);
  expect_usage("mlp.safetensors", R"(supports the architectures "vit", "gpt2" and "llama", got "mlp")");
  save_checkpoint(dir.file("none.safetensors"), R"({"preset": "x"})", p);
  expect_usage("none.safetensors", "got none");
  save_checkpoint(dir.file("json.safetensors"), "{not json", p);
  expect_io("json.safetensors", "nabla.config is not a JSON object");
  // A GPT-2 config with fields missing, and weights that do not fit the config.
  save_checkpoint(dir.file("field.safetensors"), R"({"architecture": "gpt2"})", p);
  expect_io("field.safetensors", "gpt2 config");
  save_checkpoint(dir.file("weights.safetensors"), tiny_gpt2("byte", 256).to_json(), p);
  EXPECT_THROW(export_checkpoint(dir.file("weights.safetensors")), IoError);
  // A smaller vocabulary than the tokenizer's.
  save_gpt2(dir.file("small.safetensors"), tiny_gpt2("byte", 200));
  expect_io("small.safetensors", "vocab_size is 200, smaller than the byte tokenizer's 256 tokens");
  // A gpt2-tokenizer checkpoint whose vocabulary folder lacks the files.
  save_gpt2(dir.file("bpe.safetensors"), tiny_gpt2("gpt2", 50257));
  fs::create_directories(dir.file("empty"));
  expect_error<IoError>(
      [&] { export_checkpoint(dir.file("bpe.safetensors"), {.vocab_dir = dir.file("empty")}); },
      dir.file("empty/encoder.json"), "cannot open");
}
