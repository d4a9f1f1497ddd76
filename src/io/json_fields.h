// Reads of JSON fields that come from files (checkpoint metadata, configs):
// strict about types and ranges. nlohmann's get<int64_t>() converts a float
// silently, and one outside int64's range is undefined behaviour.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "nabla/error.h"

namespace nabla::io {

// The value as JSON text for messages (invalid UTF-8 replaced, never throws).
inline std::string json_text(const nlohmann::json& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// j[key] as an integer in [lo, hi]; IoError naming the key otherwise.
inline int64_t json_int(const nlohmann::json& j, const char* key, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  auto it = j.find(key);
  if (it == j.end()) throw IoError(std::string("missing \"") + key + "\"");
  bool in_range = it->is_number_integer() &&
                  (it->is_number_unsigned() ? it->get<uint64_t>() <= uint64_t(hi) && hi >= 0
                                            : it->get<int64_t>() >= lo && it->get<int64_t>() <= hi);
  if (!in_range) {
    throw IoError(std::string("\"") + key + "\" must be an integer in [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "], got " + json_text(*it));
  }
  return it->is_number_unsigned() ? int64_t(it->get<uint64_t>()) : it->get<int64_t>();
}

// j[key] as an unsigned 64-bit integer; IoError naming the key otherwise.
inline uint64_t json_uint(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) throw IoError(std::string("missing \"") + key + "\"");
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
    throw IoError(std::string("\"") + key + "\" must be a non-negative integer, got " + json_text(*it));
  }
  return it->get<uint64_t>();
}

}  // namespace nabla::io
