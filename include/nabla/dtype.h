// Element types. Compute kernels are written for f32 and f64, i32 is for
// indices; u8 is raw storage (a quantized weight's blocks: bytes that only
// the ops taking a storage type read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace nabla {

enum class DType : uint8_t { f32 = 0, f64 = 1, i32 = 2, u8 = 3 };

inline constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::u8: return 1;
  }
  return 0;
}

inline constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

inline constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::f64; }

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<double>() { return DType::f64; }
template <>
constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <>
constexpr DType dtype_of<uint8_t>() { return DType::u8; }

}  // namespace nabla
