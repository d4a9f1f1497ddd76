// GGUF writer and reader. Layout and the dimension-order convention are in
// include/nabla/gguf.h; the spec is ggml's docs/gguf.md.
#include "nabla/gguf.h"

#include "io/ggml_quants.h"
#include "io/half.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "nabla/error.h"
#include "nabla/io.h"

namespace nabla {

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kVersion = 3;
constexpr uint32_t kDefaultAlignment = 32;
constexpr int kMaxDims = 4;             // GGML_MAX_DIMS
constexpr size_t kMaxKeyBytes = 65535;  // spec
constexpr size_t kMaxNameBytes = 64;    // spec; ggml needs one byte less (see add_tensor)
constexpr int kMaxArrayDepth = 8;       // nested arrays: bounds the reader's recursion
// Smallest encodings, used to reject counts the file cannot hold before
// allocating for them: a key-value pair is a key length (8), a type (4) and at
// least one byte of value; a tensor info is a name length (8), n_dims (4), a
// type (4) and an offset (8).
constexpr uint64_t kMinKvBytes = 13;
constexpr uint64_t kMinTensorInfoBytes = 24;

// Scalars are copied through their bit pattern: the file is little-endian.
static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");
static_assert(std::variant_size_v<GgufValue::Storage> == 13, "one alternative per GgufType");
static_assert(
    std::is_same_v<std::variant_alternative_t<size_t(GgufType::string), GgufValue::Storage>,
                   std::string>);
static_assert(
    std::is_same_v<std::variant_alternative_t<size_t(GgufType::f64), GgufValue::Storage>, double>);

uint64_t align_up(uint64_t x, uint64_t a) { return x + (a - x % a) % a; }

// Bytes one item of a metadata type needs at least (its full size for scalars).
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
    case GgufType::string:
      return 8;  // the length
    case GgufType::array:
      return 12;  // item type + length
  }
  return 1;
}

const char* type_name_of(uint32_t t) {
  // ggml_type numbering; gaps are types ggml removed.
  static const char* const names[] = {
      "F32",   "F16",        "Q4_0",       "Q4_1",       "Q4_2",     "Q4_3",     "Q5_0",
      "Q5_1",  "Q8_0",       "Q8_1",       "Q2_K",       "Q3_K",     "Q4_K",     "Q5_K",
      "Q6_K",  "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
      "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
      "F64",   "IQ1_M",      "BF16",       "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
      "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};
  return t < std::size(names) ? names[t] : nullptr;
}

bool nabla_reads(uint32_t t) { return io::ggml_block(static_cast<GgmlType>(t)).elements > 0; }

// ---- writing

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
template <class T>
void put_le(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_string(std::string& out, const std::string& s) {
  put_u64(out, s.size());
  out += s;
}

void put_value(std::string& out, const GgufValue& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          put_string(out, x);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          put_u32(out, static_cast<uint32_t>(x.type));
          put_u64(out, x.items.size());
          for (const GgufValue& item : x.items) put_value(out, item);
        } else if constexpr (std::is_same_v<T, bool>) {
          out.push_back(x ? 1 : 0);
        } else {
          put_le(out, x);
        }
      },
      v.value);
}

// Every array item has the array's declared type, at every depth.
void check_array_types(const std::string& key, const GgufValue& v, int depth) {
  const GgufArray* a = std::get_if<GgufArray>(&v.value);
  if (!a) return;
  if (depth >= kMaxArrayDepth) {
    throw UsageError("gguf: metadata '" + key + "': arrays nest deeper than " +
                     std::to_string(kMaxArrayDepth));
  }
  for (size_t i = 0; i < a->items.size(); ++i) {
    if (a->items[i].type() != a->type) {
      throw UsageError("gguf: metadata '" + key + "': array of " + gguf_type_name(a->type) +
                       " has a " + gguf_type_name(a->items[i].type()) + " at index " +
                       std::to_string(i));
    }
    check_array_types(key, a->items[i], depth + 1);
  }
}

// ---- reading

// Reads the file front to back, checking every read against the file size so
// that a truncated or lying file is an IoError, never a huge allocation.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw IoError(path + ": cannot open for reading");
    in_.seekg(0, std::ios::end);
    size_ = static_cast<uint64_t>(in_.tellg());
    in_.seekg(0);
  }

  uint64_t size() const { return size_; }
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  IoError error(const std::string& what) const { return IoError(path_ + ": " + what); }

  void need(uint64_t n, const std::string& what) const {
    if (n > left()) {
      throw error("truncated: " + what + " needs " + std::to_string(n) + " bytes at offset " +
                  std::to_string(pos_) + ", the file has " + std::to_string(size_));
    }
  }
  void read(void* dst, uint64_t n, const std::string& what) {
    need(n, what);
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in_) throw error("read failed at offset " + std::to_string(pos_));
    pos_ += n;
  }
  template <class T>
  T scalar(const std::string& what) {
    unsigned char b[sizeof(T)];
    read(b, sizeof(T), what);
    T v;
    std::memcpy(&v, b, sizeof(T));
    return v;
  }
  std::string string(const std::string& what, uint64_t max_len) {
    uint64_t n = scalar<uint64_t>(what + " length");
    if (n > max_len) {
      throw error(what + " is " + std::to_string(n) + " bytes, at most " + std::to_string(max_len) +
                  " allowed");
    }
    need(n, what);
    std::string s(n, '\0');
    read(s.data(), n, what);
    return s;
  }
  void seek(uint64_t p) {
    in_.seekg(static_cast<std::streamoff>(p));
    pos_ = p;
  }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0, pos_ = 0;
};

GgufValue read_value(Reader& r, GgufType type, const std::string& what, int depth) {
  switch (type) {
    case GgufType::u8:
      return r.scalar<uint8_t>(what);
    case GgufType::i8:
      return r.scalar<int8_t>(what);
    case GgufType::u16:
      return r.scalar<uint16_t>(what);
    case GgufType::i16:
      return r.scalar<int16_t>(what);
    case GgufType::u32:
      return r.scalar<uint32_t>(what);
    case GgufType::i32:
      return r.scalar<int32_t>(what);
    case GgufType::f32:
      return r.scalar<float>(what);
    case GgufType::u64:
      return r.scalar<uint64_t>(what);
    case GgufType::i64:
      return r.scalar<int64_t>(what);
    case GgufType::f64:
      return r.scalar<double>(what);
    case GgufType::boolean: {
      uint8_t b = r.scalar<uint8_t>(what);
      if (b > 1) throw r.error(what + ": bool byte is " + std::to_string(b) + ", must be 0 or 1");
      return b == 1;
    }
    case GgufType::string:
      return r.string(what, std::numeric_limits<uint64_t>::max());
    case GgufType::array: {
      if (depth >= kMaxArrayDepth) {
        throw r.error(what + ": arrays nest deeper than " + std::to_string(kMaxArrayDepth));
      }
      uint32_t raw = r.scalar<uint32_t>(what + " item type");
      if (raw > uint32_t(GgufType::f64)) {
        throw r.error(what + ": unknown array item type " + std::to_string(raw));
      }
      GgufArray a{static_cast<GgufType>(raw), {}};
      uint64_t n = r.scalar<uint64_t>(what + " length");
      if (n > r.left() / min_value_bytes(a.type)) {
        throw r.error(what + ": array of " + std::to_string(n) + " " + gguf_type_name(a.type) +
                      " items cannot fit in the " + std::to_string(r.left()) +
                      " bytes left in the file");
      }
      a.items.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        a.items.push_back(read_value(r, a.type, what + "[" + std::to_string(i) + "]", depth + 1));
      }
      return a;
    }
  }
  throw r.error(what + ": unknown value type");
}

}  // namespace

// ---- values

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::u8:
      return "u8";
    case GgufType::i8:
      return "i8";
    case GgufType::u16:
      return "u16";
    case GgufType::i16:
      return "i16";
    case GgufType::u32:
      return "u32";
    case GgufType::i32:
      return "i32";
    case GgufType::f32:
      return "f32";
    case GgufType::boolean:
      return "bool";
    case GgufType::string:
      return "string";
    case GgufType::array:
      return "array";
    case GgufType::u64:
      return "u64";
    case GgufType::i64:
      return "i64";
    case GgufType::f64:
      return "f64";
  }
  return "?";
}

bool GgufArray::operator==(const GgufArray& other) const {
  return type == other.type && items == other.items;
}

void GgufValue::throw_wrong_type(GgufType wanted) const {
  throw UsageError(std::string("gguf: value is ") + gguf_type_name(type()) + ", not " +
                   gguf_type_name(wanted));
}

// ---- writer

void GgufWriter::set(const std::string& key, GgufValue value) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    throw UsageError("gguf: metadata key must be 1 to 65535 bytes, got " +
                     std::to_string(key.size()));
  }
  for (unsigned char c : key) {
    if (c == 0 || c > 0x7f)
      throw UsageError("gguf: metadata key '" + key + "' is not printable ASCII");
  }
  check_array_types(key, value, 0);
  if (key == "general.alignment") {
    const uint32_t* a = std::get_if<uint32_t>(&value.value);
    // The spec asks for a multiple of 8; ggml's reader also asks for a power of two.
    if (!a || *a == 0 || *a % 8 != 0 || (*a & (*a - 1)) != 0) {
      throw UsageError("gguf: general.alignment must be a u32 power of two, multiple of 8");
    }
    alignment_ = *a;
  }
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

const char* ggml_type_name(GgmlType t) { return type_name_of(uint32_t(t)); }
int64_t ggml_block_elements(GgmlType t) { return std::max<int64_t>(io::ggml_block(t).elements, 1); }

void GgufWriter::add_tensor(const std::string& name, const Tensor& leaf, GgmlType type) {
  if (!leaf.defined() || !leaf.is_leaf() || leaf.dtype() != DType::f32) {
    throw UsageError("gguf: tensor '" + name + "' must be an f32 leaf with data to be stored as " +
                     ggml_type_name(type));
  }
  const io::GgmlBlock block = io::ggml_block(type);
  if (block.elements == 0 || type == GgmlType::f64 || type == GgmlType::i32) {
    throw UsageError("gguf: tensor '" + name + "': f32 data cannot be stored as " + ggml_type_name(type));
  }
  const int64_t row = leaf.rank() == 0 ? 1 : leaf.dim(-1);
  if (row % block.elements != 0) {
    throw ShapeError("gguf: tensor '" + name + "' has rows of " + std::to_string(row) + " elements; " +
                     ggml_type_name(type) + " needs a multiple of " + std::to_string(block.elements));
  }
  add_tensor(name, leaf);  // the checks on name and shape
  tensors_.back().type = type;
  tensors_.back().bytes = io::quantize(type, static_cast<const float*>(leaf.data()), leaf.numel());
}

void GgufWriter::add_tensor(const std::string& name, const Tensor& leaf) {
  // NOTE: ggml stores names in char[GGML_MAX_NAME = 64] with a terminator, so
  // it rejects 64-byte names that the spec allows.
  if (name.empty() || name.size() >= kMaxNameBytes) {
    throw UsageError("gguf: tensor name '" + name + "' must be 1 to 63 bytes");
  }
  for (const Entry& e : tensors_) {
    if (e.name == name) throw UsageError("gguf: tensor name '" + name + "' appears twice");
  }
  if (!leaf.defined() || !leaf.is_leaf()) {
    throw UsageError("gguf: tensor '" + name +
                     "' is not a leaf with data (fetch it from the executor first)");
  }
  if (leaf.rank() > kMaxDims) {
    throw ShapeError("gguf: tensor '" + name + "' has shape " + to_string(leaf.shape()) +
                     ", GGUF readers (ggml) take at most 4 dimensions");
  }
  GgmlType type = leaf.dtype() == DType::f32   ? GgmlType::f32
                  : leaf.dtype() == DType::f64 ? GgmlType::f64
                                               : GgmlType::i32;
  std::string bytes;
  if (leaf.numel() > 0) {
    bytes.assign(static_cast<const char*>(leaf.data()),
                 size_t(leaf.numel()) * dtype_size(leaf.dtype()));
  }
  tensors_.push_back({name, leaf.shape(), type, std::move(bytes)});
}

void GgufWriter::write(const std::string& path) const {
  std::string out;
  out.append(kMagic, 4);
  put_u32(out, kVersion);
  put_u64(out, tensors_.size());
  put_u64(out, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    put_string(out, key);
    put_u32(out, static_cast<uint32_t>(value.type()));
    put_value(out, value);
  }
  uint64_t offset = 0;
  for (const Entry& e : tensors_) {
    put_string(out, e.name);
    // ggml order: innermost first, i.e. the NumPy shape reversed. A rank-0
    // tensor becomes {1}: ggml has no rank 0.
    Shape dims(e.shape.rbegin(), e.shape.rend());
    if (dims.empty()) dims.push_back(1);
    put_u32(out, static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) put_u64(out, static_cast<uint64_t>(d));
    put_u32(out, static_cast<uint32_t>(e.type));
    put_u64(out, offset);
    offset = align_up(offset + e.bytes.size(), alignment_);
  }
  // The header, then each tensor padded to the alignment, the last one too:
  // ggml reads the data section as the sum of the padded sizes and fails on
  // a short file. In pieces: the tensors are not copied into one buffer.
  AtomicFile file(path);
  file.write(out);
  file.pad_to(alignment_);
  for (const Entry& e : tensors_) {
    file.write(e.bytes);
    file.pad_to(alignment_);
  }
  file.commit();
}

// ---- reader

const GgufValue* GgufFile::find_value(const std::string& key) const {
  for (const auto& [k, v] : metadata) {
    if (k == key) return &v;
  }
  return nullptr;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  const GgufValue* v = find_value(key);
  if (!v) throw IoError("gguf: no metadata key '" + key + "'");
  return *v;
}

Tensor GgufTensor::values() const {
  if (tensor.dtype() != DType::u8) return tensor;
  Tensor dense = Tensor::empty(DType::f32, shape);
  io::dequantize(type, static_cast<const uint8_t*>(tensor.data()), dense.numel(), dense.data_as<float>());
  return dense;
}

const GgufTensor* GgufFile::find(const std::string& name) const {
  for (const GgufTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const GgufTensor& GgufFile::at(const std::string& name) const {
  const GgufTensor* t = find(name);
  if (!t) throw IoError("gguf: no tensor named '" + name + "'");
  return *t;
}

namespace {
GgufFile read_gguf_file(const std::string& path, bool with_tensors, bool keep_stored = false);
}  // namespace

GgufFile read_gguf(const std::string& path, bool keep_stored) { return read_gguf_file(path, true, keep_stored); }

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in && in.read(magic, 4) && std::memcmp(magic, kMagic, 4) == 0;
}

GgufFile read_gguf_metadata(const std::string& path) { return read_gguf_file(path, false); }

namespace {

GgufFile read_gguf_file(const std::string& path, bool with_tensors, bool keep_stored) {
  Reader r(path);
  GgufFile file;

  // ---- header
  char magic[4];
  r.read(magic, 4, "magic");
  if (std::memcmp(magic, kMagic, 4) != 0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%02x %02x %02x %02x", uint8_t(magic[0]), uint8_t(magic[1]),
                  uint8_t(magic[2]), uint8_t(magic[3]));
    throw r.error(std::string("not a GGUF file: magic is ") + hex +
                  ", expected 47 47 55 46 (\"GGUF\")");
  }
  uint32_t version = r.scalar<uint32_t>("version");
  if (version == 0x02000000u || version == 0x03000000u) {
    throw r.error("big-endian GGUF is not supported");
  }
  if (version != 2 && version != 3) {
    throw r.error("unsupported GGUF version " + std::to_string(version) + " (nabla reads 2 and 3)");
  }
  file.version = version;
  uint64_t tensor_count = r.scalar<uint64_t>("tensor_count");
  uint64_t kv_count = r.scalar<uint64_t>("metadata_kv_count");
  if (kv_count > r.left() / kMinKvBytes) {
    throw r.error("metadata_kv_count " + std::to_string(kv_count) + " is too large for a file of " +
                  std::to_string(r.size()) + " bytes");
  }
  if (tensor_count > (r.left() - kv_count * kMinKvBytes) / kMinTensorInfoBytes) {
    throw r.error("tensor_count " + std::to_string(tensor_count) + " is too large for a file of " +
                  std::to_string(r.size()) + " bytes");
  }

  // ---- metadata
  file.metadata.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = r.string("metadata key " + std::to_string(i), kMaxKeyBytes);
    if (file.find_value(key)) throw r.error("metadata key '" + key + "' appears twice");
    uint32_t raw = r.scalar<uint32_t>("type of '" + key + "'");
    if (raw > uint32_t(GgufType::f64)) {
      throw r.error("metadata '" + key + "': unknown value type " + std::to_string(raw));
    }
    GgufValue v = read_value(r, static_cast<GgufType>(raw), "metadata '" + key + "'", 0);
    file.metadata.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = file.find_value("general.alignment")) {
    const uint32_t* p = std::get_if<uint32_t>(&a->value);
    if (!p) {
      throw r.error(std::string("general.alignment is ") + gguf_type_name(a->type()) +
                    ", must be u32");
    }
    if (*p == 0 || *p % 8 != 0) {
      throw r.error("general.alignment is " + std::to_string(*p) +
                    ", must be a non-zero multiple of 8");
    }
    file.alignment = *p;
  } else {
    file.alignment = kDefaultAlignment;
  }

  if (!with_tensors) return file;

  // ---- tensor infos
  file.tensors.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor t;
    t.name = r.string("tensor name " + std::to_string(i), kMaxNameBytes);
    if (file.find(t.name)) throw r.error("tensor name '" + t.name + "' appears twice");
    std::string what = "tensor '" + t.name + "'";
    uint32_t n_dims = r.scalar<uint32_t>(what + " n_dims");
    if (n_dims > kMaxDims) {
      throw r.error(what + " has " + std::to_string(n_dims) + " dimensions, at most 4 allowed");
    }
    // `extent` counts zero dimensions as 1: at most 2^59 elements of at most 8
    // bytes keeps the byte count, and the strides of an empty tensor, within
    // nabla's limit for any shape (check_shape: below 2^62 bytes).
    uint64_t extent = 1;
    Shape ggml_dims;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t x = r.scalar<uint64_t>(what + " dims");
      if (x > (uint64_t(1) << 59) || (x != 0 && extent > (uint64_t(1) << 59) / x)) {
        throw r.error(what + " is too large: dimension " + std::to_string(d) + " is " +
                      std::to_string(x));
      }
      extent *= std::max<uint64_t>(x, 1);
      ggml_dims.push_back(static_cast<int64_t>(x));
    }
    t.shape.assign(ggml_dims.rbegin(), ggml_dims.rend());  // ggml order -> NumPy order
    uint32_t type = r.scalar<uint32_t>(what + " type");
    const char* type_name = type_name_of(type);
    if (!type_name) throw r.error(what + " has unknown ggml type " + std::to_string(type));
    if (!nabla_reads(type)) {
      throw r.error(what + " has ggml type " + type_name + " (" + std::to_string(type) +
                    "), nabla reads F32, F16, BF16, F64, I32, Q8_0, Q4_0, Q4_K and Q6_K");
    }
    t.type = static_cast<GgmlType>(type);
    const io::GgmlBlock block = io::ggml_block(t.type);
    if (!ggml_dims.empty() && ggml_dims[0] % block.elements != 0) {
      throw r.error(what + " is " + type_name + " with rows of " + std::to_string(ggml_dims[0]) +
                    " elements, not a whole number of its " + std::to_string(block.elements) + "-element blocks");
    }
    t.offset = r.scalar<uint64_t>(what + " offset");
    if (t.offset % file.alignment != 0) {
      throw r.error(what + " offset " + std::to_string(t.offset) +
                    " is not a multiple of the alignment " + std::to_string(file.alignment));
    }
    file.tensors.push_back(std::move(t));
  }

  // ---- data section
  file.data_offset = align_up(r.pos(), file.alignment);
  if (file.tensors.empty()) return file;
  if (file.data_offset > r.size()) {
    throw r.error("truncated: the data section starts at " + std::to_string(file.data_offset) +
                  ", the file has " + std::to_string(r.size()) + " bytes");
  }
  uint64_t data_size = r.size() - file.data_offset;
  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (const GgufTensor& t : file.tensors) {
    const io::GgmlBlock block = io::ggml_block(t.type);
    uint64_t bytes = uint64_t(numel(t.shape)) / uint64_t(block.elements) * block.bytes;
    if (t.offset > data_size || bytes > data_size - t.offset) {
      throw r.error("tensor '" + t.name + "' at offset " + std::to_string(t.offset) + " with " +
                    std::to_string(bytes) + " bytes lies outside the data section of " +
                    std::to_string(data_size) + " bytes");
    }
    spans.push_back({t.offset, t.offset + bytes, &t.name});
  }
  // The furthest end so far catches an overlap with any earlier tensor, not
  // only the previous one; empty tensors occupy nothing.
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  const Span* furthest = nullptr;
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;
    if (furthest && s.begin < furthest->end) {
      throw r.error("tensors '" + *furthest->name + "' and '" + *s.name + "' overlap");
    }
    if (!furthest || s.end > furthest->end) furthest = &s;
  }
  std::vector<uint8_t> stored;
  for (GgufTensor& t : file.tensors) {
    r.seek(file.data_offset + t.offset);
    std::string what = "tensor '" + t.name + "' data";
    const bool storage_type = t.type != GgmlType::f32 && t.type != GgmlType::f64 && t.type != GgmlType::i32;
    if (storage_type && keep_stored) {
      const io::GgmlBlock block = io::ggml_block(t.type);
      const int64_t cols = t.shape.empty() ? 1 : t.shape.back(), rows = numel(t.shape) / std::max<int64_t>(cols, 1);
      t.tensor = Tensor::empty(DType::u8, {rows, cols / block.elements * int64_t(block.bytes)});
      r.read(t.tensor.data(), uint64_t(t.tensor.numel()), what);
    } else if (storage_type) {
      const io::GgmlBlock block = io::ggml_block(t.type);
      const int64_t n = numel(t.shape);
      stored.resize(size_t(n / block.elements) * block.bytes);
      r.read(stored.data(), stored.size(), what);
      t.tensor = Tensor::zeros(DType::f32, t.shape);
      io::dequantize(t.type, stored.data(), n, t.tensor.data_as<float>());
    } else {
      DType dt = t.type == GgmlType::f32   ? DType::f32
                 : t.type == GgmlType::f64 ? DType::f64
                                           : DType::i32;
      t.tensor = Tensor::zeros(dt, t.shape);
      r.read(t.tensor.data(), uint64_t(t.tensor.numel()) * dtype_size(dt), what);
    }
  }
  return file;
}

}  // namespace

}  // namespace nabla
