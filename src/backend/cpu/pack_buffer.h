// A per-thread scratch buffer for GEMM packing that only grows, so packing
// allocates once per thread rather than once per call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace nabla::cpu {

class PackBuffer {
 public:
  PackBuffer() = default;
  PackBuffer(const PackBuffer&) = delete;
  PackBuffer& operator=(const PackBuffer&) = delete;
  ~PackBuffer() { std::free(data_); }

  // At least `count` elements of T, 64-byte aligned; earlier contents are lost.
  template <class T>
  T* get(int64_t count) {
    const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + 63) / 64 * 64;
    if (bytes > bytes_) {
      std::free(data_);
      data_ = std::aligned_alloc(64, bytes);
      bytes_ = data_ ? bytes : 0;
      if (!data_) throw std::bad_alloc();
    }
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace nabla::cpu
