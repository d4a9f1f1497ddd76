#include "nabla/config.h"

#include <nlohmann/json.hpp>

#include "nabla/error.h"

namespace nabla {

namespace {

// The value as JSON text for messages (invalid UTF-8 replaced, never throws).
std::string json_text(const nlohmann::json& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string quoted(const char* key) { return std::string("\"") + key + "\""; }

// nlohmann's get<int64_t>() converts a float silently, and one outside
// int64's range is undefined behaviour: integers are checked first.
int64_t read_int(const nlohmann::json& v, const char* key, int64_t min) {
  // nlohmann reads every non-negative integer as unsigned.
  bool in_range = v.is_number_integer() &&
                  (v.is_number_unsigned()
                       ? v.get<uint64_t>() <= uint64_t(INT64_MAX) && (min <= 0 || v.get<uint64_t>() >= uint64_t(min))
                       : v.get<int64_t>() >= min);
  if (!in_range) {
    throw IoError(quoted(key) + " must be an integer in [" + std::to_string(min) + ", " + std::to_string(INT64_MAX) +
                  "], got " + json_text(v));
  }
  return v.is_number_unsigned() ? int64_t(v.get<uint64_t>()) : v.get<int64_t>();
}

uint64_t read_uint(const nlohmann::json& v, const char* key) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    throw IoError(quoted(key) + " must be a non-negative integer, got " + json_text(v));
  }
  return v.get<uint64_t>();
}

template <class T>
T read_as(const nlohmann::json& v, const char* key, const char* kind, bool ok) {
  if (!ok) throw IoError(quoted(key) + " must be " + kind + ", got " + json_text(v));
  return v.get<T>();
}

}  // namespace

ConfigFields::ConfigFields(std::string what, std::string architecture)
    : what_(std::move(what)), architecture_(std::move(architecture)) {}

ConfigFields& ConfigFields::add(Field f) {
  fields_.push_back(f);
  return *this;
}

ConfigFields& ConfigFields::required(const char* key, int64_t& value, int64_t min) {
  return add({key, &value, true, min});
}
ConfigFields& ConfigFields::required(const char* key, uint64_t& value) { return add({key, &value, true}); }
ConfigFields& ConfigFields::required(const char* key, double& value) { return add({key, &value, true}); }
ConfigFields& ConfigFields::optional(const char* key, int64_t& value, int64_t min) {
  return add({key, &value, false, min});
}
ConfigFields& ConfigFields::optional(const char* key, double& value) { return add({key, &value, false}); }
ConfigFields& ConfigFields::optional(const char* key, bool& value) { return add({key, &value, false}); }
ConfigFields& ConfigFields::optional(const char* key, std::string& value) { return add({key, &value, false}); }

std::string ConfigFields::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  if (!architecture_.empty()) j["architecture"] = architecture_;
  for (const Field& f : fields_) {
    std::visit([&](auto* p) { j[f.key] = *p; }, f.value);
  }
  return j.dump();
}

void ConfigFields::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw IoError(what_ + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw IoError(what_ + ": not a JSON object");
  if (!architecture_.empty()) {
    auto arch = j.find("architecture");
    if (arch == j.end() || *arch != architecture_) {
      throw IoError(what_ + ": architecture is " + (arch == j.end() ? "missing" : json_text(*arch)) +
                    ", expected \"" + architecture_ + "\"");
    }
  }
  try {
    for (const Field& f : fields_) {
      auto it = j.find(f.key);
      const bool unset_int = it != j.end() && it->is_null() && !f.required && std::holds_alternative<int64_t*>(f.value);
      if (it == j.end() || unset_int) {
        if (f.required) throw IoError("missing " + quoted(f.key));
        continue;
      }
      const nlohmann::json& v = *it;
      std::visit(
          [&](auto* p) {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, int64_t>) *p = read_int(v, f.key, f.min);
            if constexpr (std::is_same_v<T, uint64_t>) *p = read_uint(v, f.key);
            if constexpr (std::is_same_v<T, double>) *p = read_as<double>(v, f.key, "a number", v.is_number());
            if constexpr (std::is_same_v<T, bool>) *p = read_as<bool>(v, f.key, "true or false", v.is_boolean());
            if constexpr (std::is_same_v<T, std::string>) *p = read_as<std::string>(v, f.key, "a string", v.is_string());
          },
          f.value);
    }
  } catch (const IoError& e) {
    throw IoError(what_ + ": " + e.what());
  }
}

}  // namespace nabla
