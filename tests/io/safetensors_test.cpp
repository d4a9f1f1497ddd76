// safetensors: round trips, the byte layout the spec prescribes, conversions
// of foreign dtypes, corrupt files, and writes that never damage a file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "nabla/error.h"
#include "nabla/io.h"
#include "nabla/ops.h"

#include "temp_dir.h"

using namespace nabla;
namespace fs = std::filesystem;
using json = nlohmann::json;

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

std::string le64(uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return s;
}

// A file as the spec lays it out: header length, JSON header, data.
std::string st_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

template <class T>
std::string raw_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

void expect_io_error(const std::function<void()>& f, const std::string& path,
                     const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "expected an IoError about " << path << " (" << what << ")";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
    EXPECT_NE(msg.find(what), std::string::npos)
        << "message does not say '" << what << "': " << msg;
  }
}

std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  return {
      {"blocks.0.attn.qkv.weight",
       Tensor::from_vector<float>({2, 3}, {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f})},
      {"scale", Tensor::from_vector<double>({4}, {1.0, -1e300, 3.141592653589793, 5e-324})},
      {"ids", Tensor::from_vector<int32_t>({2, 2}, {0, -1, std::numeric_limits<int32_t>::max(),
                                                    std::numeric_limits<int32_t>::min()})},
      {"temperature", Tensor::scalar(0.5)},
      {"empty", Tensor::zeros(DType::f32, {0, 3})},
  };
}

}  // namespace

TEST(Safetensors, RoundTrip) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  auto tensors = sample_tensors();
  std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"step", "12"}, {"note", "quotes \" and \\ ok"}};
  save_safetensors(path, tensors, meta);
  Safetensors st = load_safetensors(path);
  EXPECT_EQ(st.metadata, meta);
  ASSERT_EQ(st.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, want] = tensors[i];
    EXPECT_EQ(st.tensors[i].first, name) << "file order is save order";
    const Tensor& got = st.at(name);
    EXPECT_TRUE(got.is_leaf());
    EXPECT_EQ(got.dtype(), want.dtype()) << name;
    EXPECT_EQ(got.shape(), want.shape()) << name;
    size_t bytes = want.numel() * dtype_size(want.dtype());
    if (bytes) {
      EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << name << " is bit-exact";
    }
  }
  EXPECT_EQ(st.find("missing"), nullptr);
  try {
    st.at("missing");
    ADD_FAILURE() << "at() of a missing tensor";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos) << e.what();
  }

  // No metadata, no tensors.
  save_safetensors(path, {});
  Safetensors none = load_safetensors(path);
  EXPECT_TRUE(none.tensors.empty());
  EXPECT_TRUE(none.metadata.empty());
}

// Read back with nothing but the spec: 8-byte little-endian header length,
// JSON header, data offsets relative to the end of the header.
TEST(Safetensors, FileFollowsTheSpecByteForByte) {
  TempDir dir;
  std::string path = dir.file("spec.safetensors");
  auto tensors = sample_tensors();
  save_safetensors(path, tensors, {{"format", "pt"}});
  std::string file = read_raw(path);
  ASSERT_GE(file.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<uint8_t>(file[i])) << (8 * i);
  ASSERT_LE(8 + n, file.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data starts 8-byte aligned";
  std::string header_text = file.substr(8, n);
  EXPECT_EQ(header_text.front(), '{');
  json header = json::parse(header_text);  // trailing padding is spaces, which JSON allows
  EXPECT_EQ(header["__metadata__"], (json{{"format", "pt"}}));
  const char* data = file.data() + 8 + n;
  uint64_t data_size = file.size() - 8 - n;

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(header.contains(name)) << name;
    const json& e = header[name];
    EXPECT_EQ(e["dtype"], t.dtype() == DType::f32   ? "F32"
                          : t.dtype() == DType::f64 ? "F64"
                                                    : "I32");
    EXPECT_EQ(e["shape"].get<Shape>(), t.shape());
    uint64_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    ASSERT_EQ(end - begin, t.numel() * dtype_size(t.dtype())) << name;
    ASSERT_LE(end, data_size);
    if (end > begin) {
      EXPECT_EQ(std::memcmp(data + begin, t.data(), end - begin), 0) << name;
    }
    ranges.emplace_back(begin, end);
  }
  EXPECT_EQ(header.size(), tensors.size() + 1);
  // The data buffer is fully indexed: no holes, no overlap, nothing after.
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (auto [begin, end] : ranges) {
    EXPECT_EQ(begin, at);
    at = end;
  }
  EXPECT_EQ(at, data_size);

  // The f32 values are little-endian IEEE 754: 1.5f is 00 00 c0 3f.
  uint64_t begin = header["blocks.0.attn.qkv.weight"]["data_offsets"][0];
  EXPECT_EQ(std::string(data + begin, 4), std::string("\x00\x00\xc0\x3f", 4));
}

TEST(Safetensors, ReadsFilesWrittenByOthers) {
  TempDir dir;
  std::string path = dir.file("foreign.safetensors");
  // F16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), -0, inf, NaN, 2^-14 (smallest normal).
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x7c00, 0x7e00, 0x0400};
  // BF16: 1, -5, 3.140625.
  std::vector<uint16_t> bf16 = {0x3f80, 0xc0a0, 0x4049};
  std::vector<int64_t> i64 = {-3, std::numeric_limits<int32_t>::max(),
                              std::numeric_limits<int32_t>::min()};
  std::vector<int16_t> i16 = {-32768, 7};
  std::vector<int8_t> i8 = {-128, 127};
  std::vector<uint8_t> u8 = {0, 255};
  std::string data = raw_bytes(f16) + raw_bytes(bf16) + raw_bytes(i64) + raw_bytes(i16) +
                     raw_bytes(i8) + raw_bytes(u8);
  json header = {
      {"h", {{"dtype", "F16"}, {"shape", {2, 4}}, {"data_offsets", {0, 16}}}},
      {"b", {{"dtype", "BF16"}, {"shape", {3}}, {"data_offsets", {16, 22}}}},
      {"l", {{"dtype", "I64"}, {"shape", {3}}, {"data_offsets", {22, 46}}}},
      {"s", {{"dtype", "I16"}, {"shape", {2}}, {"data_offsets", {46, 50}}}},
      {"c", {{"dtype", "I8"}, {"shape", {2}}, {"data_offsets", {50, 52}}}},
      {"u", {{"dtype", "U8"}, {"shape", {2}}, {"data_offsets", {52, 54}}}},
      {"__metadata__", {{"format", "np"}}},
  };
  write_raw(path, st_file(header.dump() + "   ", data));
  Safetensors st = load_safetensors(path);
  std::vector<std::string> order;
  for (const auto& [name, t] : st.tensors) order.push_back(name);
  EXPECT_EQ(order, (std::vector<std::string>{"h", "b", "l", "s", "c", "u"}))
      << "tensors come in data order";
  EXPECT_EQ(st.metadata.at("format"), "np");

  const Tensor& h = st.at("h");
  EXPECT_EQ(h.dtype(), DType::f32);
  EXPECT_EQ(h.shape(), (Shape{2, 4}));
  std::vector<float> hv = h.to_vector<float>();
  EXPECT_EQ(hv[0], 1.0f);
  EXPECT_EQ(hv[1], -2.0f);
  EXPECT_EQ(hv[2], 65504.0f);
  EXPECT_EQ(hv[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(hv[4], 0.0f);
  EXPECT_TRUE(std::signbit(hv[4]));
  EXPECT_EQ(hv[5], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(hv[6]));
  EXPECT_EQ(hv[7], std::ldexp(1.0f, -14));
  EXPECT_EQ(st.at("b").to_vector<float>(), (std::vector<float>{1.0f, -5.0f, 3.140625f}));
  EXPECT_EQ(st.at("l").dtype(), DType::i32);
  EXPECT_EQ(st.at("l").to_vector<int32_t>(),
            (std::vector<int32_t>{-3, std::numeric_limits<int32_t>::max(),
                                  std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ(st.at("s").to_vector<int32_t>(), (std::vector<int32_t>{-32768, 7}));
  EXPECT_EQ(st.at("c").to_vector<int32_t>(), (std::vector<int32_t>{-128, 127}));
  EXPECT_EQ(st.at("u").to_vector<int32_t>(), (std::vector<int32_t>{0, 255}));

  // An I64 value outside i32 cannot be narrowed.
  std::vector<int64_t> big = {1, 5000000000};
  json h64 = {{"l", {{"dtype", "I64"}, {"shape", {2}}, {"data_offsets", {0, 16}}}}};
  write_raw(path, st_file(h64.dump(), raw_bytes(big)));
  expect_io_error([&] { load_safetensors(path); }, path, "value 5000000000 at 1 does not fit i32");
}

TEST(Safetensors, CorruptFilesNameTheFile) {
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  std::string f32x4 = raw_bytes(std::vector<float>{1, 2, 3, 4});
  auto entry = [](const char* dtype, Shape shape, uint64_t begin, uint64_t end) {
    return json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
  };
  auto check = [&](const std::string& bytes, const std::string& what) {
    SCOPED_TRACE(what);
    write_raw(path, bytes);
    expect_io_error([&] { load_safetensors(path); }, path, what);
  };
  expect_io_error([&] { load_safetensors(dir.file("missing")); }, dir.file("missing"),
                  "cannot open");
  check("", "0 bytes, need at least 8");
  check(std::string("\x10\0\0", 3), "3 bytes, need at least 8");
  check(le64(100) + "{}", "header length 100 does not fit the file of 10 bytes");
  check(le64(~uint64_t(0)) + "{}", "does not fit the file");
  check(st_file("{\"a\": ", ""), "header is not valid JSON");
  check(st_file("[1, 2]", ""), "header is not a JSON object");
  check(st_file(json{{"a", entry("F32", {4}, 0, 16)}}.dump(), f32x4.substr(0, 12)),
        "tensor 'a': data_offsets [0, 16) outside the data of 12 bytes");
  check(st_file(json{{"a", entry("F32", {0}, 8, 4)}}.dump(), f32x4),
        "data_offsets [8, 4) end before they begin");
  check(
      st_file(json{{"a", entry("F32", {4}, 0, 16)}, {"b", entry("F32", {2}, 8, 16)}}.dump(), f32x4),
      "tensors 'a' and 'b' overlap");
  // An empty tensor between them must not hide an overlap with an earlier one.
  check(st_file(json{{"a", entry("F32", {4}, 0, 16)},
                     {"b", entry("F32", {0}, 4, 4)},
                     {"c", entry("F32", {1}, 8, 12)}}
                    .dump(),
                f32x4),
        "tensors 'a' and 'c' overlap");
  check(st_file(json{{"a", entry("F32", {3}, 0, 16)}}.dump(), f32x4),
        "tensor 'a': holds 16 bytes, shape [3] of F32 needs 12");
  check(st_file(json{{"a", entry("F64", {4}, 0, 16)}}.dump(), f32x4), "shape [4] of F64 needs 32");
  check(st_file(json{{"a", entry("Q4", {4}, 0, 16)}}.dump(), f32x4),
        "tensor 'a': unsupported dtype Q4");
  check(st_file(json{{"a", {{"dtype", "F32"}, {"shape", {4}}}}}.dump(), f32x4),
        "needs dtype, shape and data_offsets");
  check(st_file(json{{"a", {{"dtype", "F32"}, {"shape", {-4}}, {"data_offsets", {0, 16}}}}}.dump(),
                f32x4),
        "shape entries must be non-negative integers");
  check(st_file(json{{"a", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, -16}}}}}.dump(),
                f32x4),
        "data_offsets must be integers");
  check(st_file(json{{"__metadata__", {{"step", 3}}}}.dump(), ""),
        "metadata 'step' is not a string");
  check(st_file(json{{"__metadata__", {1, 2}}}.dump(), ""), "__metadata__ is not an object");
  // The file is fine: separate data-size checks must not reject it.
  write_raw(path, st_file(json{{"a", entry("F32", {2, 2}, 0, 16)}}.dump(), f32x4));
  EXPECT_EQ(load_safetensors(path).at("a").to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
}

TEST(Safetensors, FailedSaveLeavesTheFileIntact) {
  TempDir dir;
  std::string path = dir.file("ckpt.safetensors");
  save_safetensors(path, sample_tensors(), {{"step", "1"}});
  std::string before = read_raw(path);

  Tensor a = Tensor::from_vector<float>({2}, {1, 2});
  Tensor b = Tensor::from_vector<float>({2}, {3, 4});
  auto expect_usage = [&](const std::vector<std::pair<std::string, Tensor>>& tensors,
                          const std::string& what) {
    try {
      save_safetensors(path, tensors);
      ADD_FAILURE() << "save should fail: " << what;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    EXPECT_EQ(read_raw(path), before) << "the old file is untouched";
    EXPECT_EQ(dir.listing(), (std::vector<std::string>{"ckpt.safetensors"}))
        << "no temporary left behind";
  };
  expect_usage({{"a", a}, {"sum", a + b}}, "tensor 'sum' is not a leaf");
  expect_usage({{"a", a}, {"t", transpose(Tensor::zeros(DType::f32, {2, 3}))}},
               "tensor 't' is not a leaf");
  expect_usage({{"a", a}, {"undefined", Tensor()}}, "tensor 'undefined' is not a leaf");
  expect_usage({{"a", a}, {"a", b}}, "tensor name 'a' appears twice");
  expect_usage({{"__metadata__", a}}, "invalid tensor name '__metadata__'");
  expect_usage({{"", a}}, "invalid tensor name ''");

  // A directory that does not exist: IoError, nothing created.
  std::string nowhere = dir.file("no/such/dir/x.safetensors");
  expect_io_error([&] { save_safetensors(nowhere, {{"a", a}}); }, nowhere, "cannot create");
  EXPECT_FALSE(fs::exists(dir.file("no")));
}

TEST(Safetensors, SaveReplacesAtomically) {
  TempDir dir;
  std::string path = dir.file("ckpt.safetensors");
  save_safetensors(path, sample_tensors());
  EXPECT_EQ(fs::status(path).type(), fs::file_type::regular);
  save_safetensors(path, {{"w", Tensor::from_vector<float>({3}, {7, 8, 9})}}, {{"step", "2"}});
  Safetensors st = load_safetensors(path);
  ASSERT_EQ(st.tensors.size(), 1u);
  EXPECT_EQ(st.at("w").to_vector<float>(), (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(st.metadata.at("step"), "2");
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"ckpt.safetensors"}))
      << "no temporary left behind";

  // A reader holding the old file keeps reading the old bytes: the new file
  // is a new inode renamed over the name, never written in place.
  std::ifstream old_reader(path, std::ios::binary);
  std::string old_bytes = read_raw(path);
  save_safetensors(path, sample_tensors());
  std::string seen((std::istreambuf_iterator<char>(old_reader)), std::istreambuf_iterator<char>());
  EXPECT_EQ(seen, old_bytes);
  EXPECT_NE(read_raw(path), old_bytes);

  // Relative paths (no directory part) work too.
  std::string cwd = fs::current_path();
  fs::current_path(dir.file(""));
  save_safetensors("relative.safetensors", {{"w", Tensor::scalar(1.0)}});
  fs::current_path(cwd);
  EXPECT_EQ(load_safetensors(dir.file("relative.safetensors")).at("w").item(), 1.0);

  write_file_atomic(dir.file("plain.txt"), "hello");
  EXPECT_EQ(read_raw(dir.file("plain.txt")), "hello");
  write_file_atomic(dir.file("plain.txt"), "");
  EXPECT_EQ(read_raw(dir.file("plain.txt")), "");
}
