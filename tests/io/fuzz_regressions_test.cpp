// Inputs found by the fuzz targets in fuzz/ (scripts/fuzz), or built after
// one of their reports, each once a crash, an undefined behaviour or an
// error that did not name the file. Every one must now be an IoError
// naming the file and what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "nabla/error.h"
#include "nabla/gguf.h"
#include "nabla/io.h"

#include "temp_dir.h"

using namespace nabla;

namespace {

using nabla::testing_support::TempDir;

std::string write_temp(const TempDir& dir, const std::string& name, const std::string& bytes) {
  std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

template <class T>
std::string le(T v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);
  return s;
}
std::string gguf_string(const std::string& s) { return le<uint64_t>(s.size()) + s; }

// The IoError message of read(path), which must name the file.
template <class F>
std::string io_error(const std::string& path, F&& read) {
  try {
    read();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an IoError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}

// One F64 tensor of the given ggml dims at offset 0, with 64 bytes of data.
std::string gguf_one_tensor(const std::vector<uint64_t>& dims) {
  std::string b = "GGUF" + le<uint32_t>(3) + le<uint64_t>(1) + le<uint64_t>(0);
  b += gguf_string("t") + le<uint32_t>(uint32_t(dims.size()));
  for (uint64_t d : dims) b += le<uint64_t>(d);
  b += le<uint32_t>(28) + le<uint64_t>(0);
  b.resize((b.size() + 31) / 32 * 32, '\0');
  return b + std::string(64, '\0');
}

}  // namespace

// 2^61 F64 elements: the byte count 2^64 wrapped to 0, the tensor passed the
// size check and came back with 2^61 elements over a 64-byte buffer.
TEST(FuzzRegressions, GgufByteCountOverflow) {
  TempDir dir;
  std::string path = write_temp(dir, "overflow.gguf", gguf_one_tensor({uint64_t(1) << 61}));
  EXPECT_NE(io_error(path, [&] { read_gguf(path); }).find("is too large"), std::string::npos);
}

// fuzz_gguf: a tensor with ggml dims {0, 3841982464, 253403070464}. The
// zero made the element count 0, so the later dimensions escaped the size
// check and numel() of the shape overflowed int64 (UBSan: signed integer
// overflow in shape.cpp).
TEST(FuzzRegressions, GgufEmptyTensorWithHugeDimensions) {
  TempDir dir;
  std::string path = write_temp(dir, "empty.gguf", gguf_one_tensor({0, 3841982464, 253403070464}));
  EXPECT_NE(io_error(path, [&] { read_gguf(path); }).find("is too large"), std::string::npos);
}

TEST(FuzzRegressions, SafetensorsEmptyTensorWithHugeDimensions) {
  std::string header = R"({"t":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}})";
  TempDir dir;
  std::string path = write_temp(dir, "empty.safetensors", le<uint64_t>(header.size()) + header);
  EXPECT_NE(io_error(path, [&] { load_safetensors(path); }).find("shape too large"), std::string::npos);
}
