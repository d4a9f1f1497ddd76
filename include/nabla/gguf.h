// GGUF, the file format of ggml and llama.cpp
// (spec: ggml's docs/gguf.md). A file is, in order, all little-endian:
//
//   "GGUF"  u32 version (3)  u64 tensor_count  u64 metadata_kv_count
//   metadata_kv_count x { string key, u32 value_type, value }
//   tensor_count      x { string name, u32 n_dims, u64 dims[n_dims],
//                         u32 ggml_type, u64 offset }
//   zero padding to a multiple of the alignment
//   tensor data: each tensor at data_start + offset, offsets a multiple of
//                the alignment, zero padding between tensors
//
// where a string is { u64 length, bytes } (UTF-8, no terminator) and the
// alignment is the u32 metadata value "general.alignment", 32 when absent.
//
// DIMENSION ORDER. GGUF stores dims in ggml order: dims[0] is the innermost
// (fastest-varying) axis, the reverse of nabla's NumPy-order shapes. A nabla
// tensor of shape [3, 5] (3 rows of 5) is written with dims {5, 3}; the bytes
// are the same row-major buffer either way. This is also what llama.cpp's
// gguf-py writer does with a NumPy array, so a Linear weight [out, in] appears
// in ggml as ne = {in, out}. Everything in this header speaks NumPy order
// (`Shape`); only the bytes in the file, and what other GGUF readers print,
// are in ggml order.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "nabla/tensor.h"

namespace nabla {

// Metadata value types, numbered as in the file.
enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
const char* gguf_type_name(GgufType t);  // "u32", "string", ...

// Tensor element types (ggml_type), only those nabla reads or writes: the
// block formats Q8_0, Q4_0, Q4_K and Q6_K are src/io/ggml_quants.h's.
enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q8_0 = 8,
  q4_k = 12,
  q6_k = 14,
  i32 = 26,
  f64 = 28,
  bf16 = 30
};
// "F32", "Q4_K", ... as ggml names them.
const char* ggml_type_name(GgmlType t);
// Elements per block: 32 for Q8_0 and Q4_0, 256 for Q4_K and Q6_K, 1 for
// the others. A row of a tensor holds a whole number of blocks.
int64_t ggml_block_elements(GgmlType t);

struct GgufValue;

// An array value: all items have type `type` (arrays may nest).
struct GgufArray {
  GgufType type = GgufType::u8;
  std::vector<GgufValue> items;
  bool operator==(const GgufArray&) const;
};

// One metadata value. The alternatives are listed in GgufType order, so
// `type()` is the variant's index.
struct GgufValue {
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, GgufArray, uint64_t, int64_t, double>;
  Storage value;

  GgufValue() = default;
  // Arithmetic values take the GGUF type of the same width and signedness:
  // `GgufValue(uint32_t(1))` is u32, `GgufValue(1)` is i32, `GgufValue(1.0)`
  // is f64. Write the type out (uint64_t{n}, 0.5f) where the reader cares.
  template <class T>
  requires std::is_arithmetic_v<T> GgufValue(T v) : value(convert(v)) {}
  GgufValue(std::string s) : value(std::move(s)) {}
  GgufValue(const char* s) : value(std::string(s)) {}
  GgufValue(GgufArray a) : value(std::move(a)) {}
  // An array of scalars or strings; its item type follows from T even when empty.
  template <class T>
  requires(!std::is_same_v<T, GgufValue>) GgufValue(const std::vector<T>& items)
      : value(GgufArray{GgufValue(T{}).type(), {}}) {
    auto& a = std::get<GgufArray>(value);
    for (auto&& x : items) a.items.emplace_back(T(x));  // T(x): vector<bool> yields proxies
  }

  GgufType type() const { return static_cast<GgufType>(value.index()); }
  // The value as T (exact alternative); UsageError naming both types otherwise.
  template <class T>
  const T& get() const {
    if (const T* p = std::get_if<T>(&value)) return *p;
    throw_wrong_type(GgufValue(T{}).type());
  }
  bool operator==(const GgufValue&) const = default;

 private:
  template <class T>
  static Storage convert(T v) {
    if constexpr (std::is_same_v<T, bool>) {
      return v;
    } else if constexpr (std::is_floating_point_v<T>) {
      if constexpr (sizeof(T) == 4)
        return float(v);
      else
        return double(v);
    } else if constexpr (std::is_signed_v<T>) {
      if constexpr (sizeof(T) == 1)
        return int8_t(v);
      else if constexpr (sizeof(T) == 2)
        return int16_t(v);
      else if constexpr (sizeof(T) == 4)
        return int32_t(v);
      else
        return int64_t(v);
    } else {
      if constexpr (sizeof(T) == 1)
        return uint8_t(v);
      else if constexpr (sizeof(T) == 2)
        return uint16_t(v);
      else if constexpr (sizeof(T) == 4)
        return uint32_t(v);
      else
        return uint64_t(v);
    }
  }
  [[noreturn]] void throw_wrong_type(GgufType wanted) const;
};

// Collects metadata and tensors, then writes one GGUF v3 file.
//
//   GgufWriter w;
//   w.set("general.architecture", "gpt2");
//   w.set("gpt2.context_length", uint32_t{1024});
//   w.add_tensor("token_embd.weight", wte);   // nabla [50257, 768] -> ggml {768, 50257}
//   w.write("model.gguf");
class GgufWriter {
 public:
  // Sets a metadata key (later values replace earlier ones in place). Keys are
  // non-empty ASCII of at most 65535 bytes. "general.alignment" must be a u32
  // power of two and a multiple of 8; it sets the data alignment (default 32).
  void set(const std::string& key, GgufValue value);
  // Adds a leaf tensor (f32, f64 or i32, stored as F32, F64, I32), shape in
  // NumPy order, at most 4 dimensions (ggml's limit); a rank-0 tensor is
  // written as dims {1}. The data is copied now. Names are unique, at most 63
  // bytes (ggml keeps them in a 64-byte buffer with a terminator).
  void add_tensor(const std::string& name, const Tensor& leaf);
  // An f32 leaf stored as `type` (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K):
  // its last dimension must be a multiple of the type's block (ShapeError).
  void add_tensor(const std::string& name, const Tensor& leaf, GgmlType type);
  // Writes the file atomically, in pieces (AtomicFile).
  void write(const std::string& path) const;

  uint32_t alignment() const { return alignment_; }

 private:
  struct Entry {
    std::string name;
    Shape shape;  // NumPy order
    GgmlType type;
    std::string bytes;
  };
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Entry> tensors_;
  uint32_t alignment_ = 32;
};

struct GgufTensor {
  std::string name;
  Shape shape;      // NumPy order: the file's dims reversed
  GgmlType type;    // as stored in the file
  uint64_t offset;  // relative to the start of the data section
  Tensor tensor;    // leaf of `shape`: F32, F16, BF16 and the block formats as f32, F64 as f64, I32 as i32;
                    // read with keep_stored, F16, BF16 and the block formats as stored: u8 [rows, row bytes]
  // The values as read without keep_stored (f32 for the storage types).
  Tensor values() const;
};

struct GgufFile {
  uint32_t version = 0;
  uint32_t alignment = 32;
  uint64_t data_offset = 0;  // absolute file position of the data section
  std::vector<std::pair<std::string, GgufValue>> metadata;  // file order
  std::vector<GgufTensor> tensors;                          // file order

  const GgufValue* find_value(const std::string& key) const;
  const GgufValue& value(const std::string& key) const;  // IoError naming the key when absent
  const GgufTensor* find(const std::string& name) const;
  const GgufTensor& at(const std::string& name) const;  // IoError naming the tensor when absent
};

// Reads and validates a GGUF file (version 2 or 3, little-endian). Throws
// IoError naming the file for: a bad magic, an unsupported or big-endian
// version, truncation anywhere, counts or lengths larger than the file could
// hold, unknown value or tensor types, invalid bools, duplicate keys or
// tensor names, a bad general.alignment, more than 4 dimensions, offsets that
// are misaligned or outside the data section, and overlapping tensors.
// F16, BF16 and the block formats Q8_0, Q4_0, Q4_K and Q6_K (rows a whole
// number of blocks) are dequantized to f32; other tensor types are an
// IoError naming the tensor and its type. With keep_stored, those tensors
// keep their bytes instead (u8, a row per row of the last dimension).
GgufFile read_gguf(const std::string& path, bool keep_stored = false);
// Whether the file at `path` starts with GGUF's magic (false when it cannot
// be read).
bool is_gguf_file(const std::string& path);
// The header and metadata alone, checked as read_gguf checks them; `tensors`
// is empty and nothing past the metadata is read (a tokenizer from a model
// file, without its weights).
GgufFile read_gguf_metadata(const std::string& path);

}  // namespace nabla
