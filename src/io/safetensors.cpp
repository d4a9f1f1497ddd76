// safetensors reader and writer. Format: https://github.com/huggingface/safetensors
// (8-byte LE header size, JSON header, data buffer with offsets relative to it).
#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "nabla/error.h"
#include "nabla/io.h"

#include "io/half.h"

namespace nabla {

namespace {

using json = nlohmann::json;

// Headers are small; a larger claim means a corrupt or hostile file.
constexpr uint64_t kMaxHeader = 100u << 20;

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::i32:
      return "I32";
    case DType::u8:
      return "U8";
  }
  return "?";
}

}  // namespace

const Tensor* Safetensors::find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

const Tensor& Safetensors::at(const std::string& name) const {
  const Tensor* t = find(name);
  if (!t) throw IoError("safetensors: no tensor named '" + name + "'");
  return *t;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || name.empty())
      throw UsageError(path + ": invalid tensor name '" + name + "'");
    if (header.contains(name))
      throw UsageError(path + ": tensor name '" + name + "' appears twice");
    if (!t.defined() || !t.is_leaf()) {
      throw UsageError(path + ": tensor '" + name +
                       "' is not a leaf with data (fetch it from the executor first)");
    }
    uint64_t bytes = uint64_t(t.numel()) * dtype_size(t.dtype());
    header[name] = {{"dtype", st_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  // Pad the header with spaces so the data starts 8-byte aligned.
  while ((8 + h.size()) % 8) h.push_back(' ');
  // Written in pieces: a model's tensors are never copied into one buffer.
  AtomicFile out(path);
  char length[8];
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(length, 8);
  out.write(h);
  for (const auto& [name, t] : tensors) out.write(t.data(), size_t(t.numel()) * dtype_size(t.dtype()));
  out.commit();
}

Safetensors load_safetensors(const std::string& path, const std::function<bool(const std::string&)>& keep_half,
                             const TensorRename& rename) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path + ": cannot open for reading");
  in.seekg(0, std::ios::end);
  uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (size < 8)
    throw IoError(path + ": not a safetensors file: " + std::to_string(size) +
                  " bytes, need at least 8");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(len[i]) << (8 * i);
  if (hlen > kMaxHeader || hlen > size - 8) {
    throw IoError(path + ": header length " + std::to_string(hlen) + " does not fit the file of " +
                  std::to_string(size) + " bytes");
  }
  std::string text(hlen, '\0');
  in.read(text.data(), static_cast<std::streamsize>(hlen));
  json header;
  try {
    header = json::parse(text);
  } catch (const std::exception& e) {
    throw IoError(path + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw IoError(path + ": header is not a JSON object");
  const uint64_t data_start = 8 + hlen, data_size = size - data_start;

  // The whole header is checked before any tensor is allocated or read, so a
  // damaged file costs no memory; then each tensor is read straight into its
  // own storage (a shard of several GiB is not held twice).
  Safetensors st;
  struct Entry {
    std::string name, as, dtype;  // as: the name it loads as ("": not read)
    Shape shape;
    uint64_t count, begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw IoError(path + ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw IoError(path + ": metadata '" + m.key() + "' is not a string");
        st.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return IoError(path + ": tensor '" + name + "': " + what);
    };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets")) {
      throw bad("needs dtype, shape and data_offsets");
    }
    if (!v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      throw bad("malformed entry");
    }
    std::string dt = v["dtype"].get<std::string>();
    Shape shape;
    // `extent` counts zero dimensions as 1, so that an empty tensor's strides
    // stay bounded too.
    uint64_t count = 1, extent = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
      uint64_t x = d.get<uint64_t>();
      if (x > (uint64_t(1) << 40) || (x && extent > (uint64_t(1) << 40) / x))
        throw bad("shape too large");
      count *= x;
      extent *= std::max<uint64_t>(x, 1);
      shape.push_back(static_cast<int64_t>(x));
    }
    const json& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad("data_offsets must be integers");
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end) {
      throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") end before they begin");
    }
    if (end > data_size) {
      throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") outside the data of " + std::to_string(data_size) + " bytes");
    }
    size_t elem = dt == "F64" || dt == "I64"                   ? 8
                  : dt == "F32" || dt == "I32"                 ? 4
                  : dt == "F16" || dt == "BF16" || dt == "I16" ? 2
                  : dt == "I8" || dt == "U8" || dt == "BOOL"   ? 1
                                                               : 0;
    if (elem == 0) throw bad("unsupported dtype " + dt);
    if (end - begin != count * elem) {
      throw bad("holds " + std::to_string(end - begin) + " bytes, shape " + to_string(shape) +
                " of " + dt + " needs " + std::to_string(count * elem));
    }
    entries.push_back({name, rename ? rename(name) : name, dt, shape, count, begin, end});
  }
  if (rename) {
    std::map<std::string, const std::string*> loaded_as;
    for (const Entry& e : entries) {
      if (e.as.empty()) continue;
      if (auto [it, fresh] = loaded_as.emplace(e.as, &e.name); !fresh) {
        throw IoError(path + ": tensors '" + *it->second + "' and '" + e.name + "' both load as '" + e.as + "'");
      }
    }
  }
  // Tensors may not overlap: a corrupt file could otherwise alias them. Empty
  // tensors occupy nothing; the furthest end so far catches an overlap with
  // any earlier tensor, not only the previous one. File order is data order:
  // sorted by offset so that writers and readers agree.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  const Entry* furthest = nullptr;
  for (const Entry& e : entries) {
    if (e.begin == e.end) continue;
    if (furthest && e.begin < furthest->end) {
      throw IoError(path + ": tensors '" + furthest->name + "' and '" + e.name + "' overlap");
    }
    if (!furthest || e.end > furthest->end) furthest = &e;
  }

  std::vector<char> staging;  // bytes of a tensor stored in another dtype than it loads as
  st.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    if (e.as.empty()) continue;
    const std::string& dt = e.dtype;
    const uint64_t bytes = e.end - e.begin;
    const bool half = (dt == "F16" || dt == "BF16") && e.shape.size() == 2 && keep_half && keep_half(e.as);
    const bool native = dt == "F32" || dt == "F64" || dt == "I32" || half;
    Tensor t = half ? Tensor::empty(DType::u8, {e.shape[0], 2 * e.shape[1]})
                    : Tensor::zeros(dt == "F64"                                    ? DType::f64
                                    : dt == "F32" || dt == "F16" || dt == "BF16" ? DType::f32
                                                                                 : DType::i32,
                                    e.shape);
    if (half) st.half[e.as] = dt;
    char* dst = native ? static_cast<char*>(t.data()) : (staging.resize(bytes), staging.data());
    in.seekg(static_cast<std::streamoff>(data_start + e.begin));
    in.read(dst, static_cast<std::streamsize>(bytes));
    if (!in) throw IoError(path + ": tensor '" + e.name + "': the file ends inside its data");
    if (native) {
      st.tensors.emplace_back(e.as, t);
      continue;
    }
    const char* p = staging.data();
    if (dt == "F16" || dt == "BF16") {
      float* o = t.data_as<float>();
      for (uint64_t i = 0; i < e.count; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        o[i] = dt == "F16" ? io::f16_to_f32(h) : io::bf16_to_f32(h);
      }
    } else {
      int32_t* o = t.data_as<int32_t>();
      for (uint64_t i = 0; i < e.count; ++i) {
        int64_t x = 0;
        if (dt == "I64") {
          std::memcpy(&x, p + 8 * i, 8);
        } else if (dt == "I16") {
          int16_t s;
          std::memcpy(&s, p + 2 * i, 2);
          x = s;
        } else if (dt == "I8") {
          x = static_cast<int8_t>(p[i]);
        } else {
          x = static_cast<uint8_t>(p[i]);
        }
        if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max()) {
          throw IoError(path + ": tensor '" + e.name + "': value " + std::to_string(x) + " at " +
                        std::to_string(i) + " does not fit i32");
        }
        o[i] = static_cast<int32_t>(x);
      }
    }
    st.tensors.emplace_back(e.as, t);
  }
  return st;
}

}  // namespace nabla
