// Reading and writing the formats the ecosystem already uses: safetensors
// (checkpoints, with timm / Hugging Face tensor names) and IDX (MNIST-style
// datasets). Every reader validates what it reads and throws IoError naming
// the file and what is wrong; no writer leaves a damaged file behind.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nabla/tensor.h"

namespace nabla {

// ---- safetensors: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the
// raw little-endian data.
struct Safetensors {
  std::vector<std::pair<std::string, Tensor>> tensors;  // file order
  std::map<std::string, std::string> metadata;
  // Tensors kept as their F16 / BF16 bytes (load_safetensors' keep_half):
  // name -> "F16" or "BF16".
  std::map<std::string, std::string> half;
  const Tensor* find(const std::string& name) const;
  const Tensor& at(const std::string& name) const;  // IoError naming the tensor when absent
};

// Tensors are stored as their dtype (F32, F64, I32). The file is written to a
// temporary name, flushed to disk and renamed over `path`: a crash leaves
// either the old file or the new one.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The name a stored tensor loads as, or "" to leave it unread.
using TensorRename = std::function<std::string(const std::string&)>;

// Loads every tensor as a leaf. F16/BF16 are widened to f32 and I64/I16/I8/U8
// narrowed or widened to i32 (I64 values outside i32 are an error). A
// matrix in F16 or BF16 whose name keep_half accepts stays as its bytes
// instead, u8 [rows, 2 columns], listed in `half`. `rename` (when given)
// names each tensor as loaded (keep_half sees that name) or leaves it
// unread; two tensors loading as one name are an IoError.
Safetensors load_safetensors(const std::string& path, const std::function<bool(const std::string&)>& keep_half = {},
                             const TensorRename& rename = {});

// ---- IDX (MNIST, Fashion-MNIST): big-endian magic 0x000008TT with TT the
// element type (0x08 = u8) and the rank in the low byte, then the dimensions.
// Gzip-compressed files (.gz) are read transparently.
struct IdxArray {
  Shape shape;
  std::vector<uint8_t> data;
};
IdxArray read_idx(const std::string& path);

// A whole file's bytes (IoError naming the file when it cannot be read).
std::string read_file(const std::string& path);

// Writes a file atomically: to a temporary beside it, fsync, rename. Stale
// temporaries of `path` left by writers that were killed are removed first.
void write_file_atomic(const std::string& path, const std::string& bytes);

// The same in pieces, so a large file (a model's tensors) is never whole in
// memory: write() appends to the temporary, commit() makes it `path`.
// Destroyed without commit() (an error on the way), the temporary is removed
// and `path` is as it was.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t bytes);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // Zero bytes up to the next multiple of `alignment` of the bytes written.
  void pad_to(uint64_t alignment);
  uint64_t written() const { return written_; }
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

}  // namespace nabla
