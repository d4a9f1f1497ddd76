// Configs stored as JSON objects (a model's config in its checkpoint, a
// training position): each config lists its fields once, and that one list
// both writes and reads them, strict about types and ranges.
//
//   ConfigFields f("vit config", "vit");
//   f.required("img_size", c.img_size).optional("qkv_bias", c.qkv_bias);
//   std::string json = f.to_json();   // {"architecture": "vit", "img_size": ...}
//   f.from_json(json);                // sets c's fields, or throws IoError
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace nabla {

class ConfigFields {
 public:
  // `what` names the config in errors ("vit config"); a non-empty
  // `architecture` is written as, and must be read back from, "architecture".
  explicit ConfigFields(std::string what, std::string architecture = "");

  // A field the JSON must hold; integers must lie in [min, 2^63).
  ConfigFields& required(const char* key, int64_t& value, int64_t min = INT64_MIN);
  ConfigFields& required(const char* key, uint64_t& value);
  ConfigFields& required(const char* key, double& value);
  // A field that keeps its current value when the JSON does not hold it (or,
  // for an integer, holds null, as Hugging Face writes an unset head_dim).
  ConfigFields& optional(const char* key, int64_t& value, int64_t min = INT64_MIN);
  ConfigFields& optional(const char* key, double& value);
  ConfigFields& optional(const char* key, bool& value);
  ConfigFields& optional(const char* key, std::string& value);

  std::string to_json() const;
  // Sets every listed field from `json`. IoError naming the config (and the
  // key) for text that is not a JSON object, another architecture, a missing
  // required field, a value of the wrong type or an integer out of range.
  void from_json(const std::string& json);

 private:
  struct Field {
    const char* key;
    std::variant<int64_t*, uint64_t*, double*, bool*, std::string*> value;
    bool required;
    int64_t min = INT64_MIN;
  };
  ConfigFields& add(Field f);
  std::string what_, architecture_;
  std::vector<Field> fields_;
};

}  // namespace nabla
