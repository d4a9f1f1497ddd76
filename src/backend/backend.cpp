#include "backend/backend.h"

#include "nabla/error.h"
#include "nabla/executor.h"

namespace nabla {

const Backend& reference_backend();

namespace {
std::vector<const Backend*> all_backends() { return {&cpu_backend(), &reference_backend()}; }
}  // namespace

const Backend& find_backend(const std::string& name) {
  std::string known;
  for (const Backend* b : all_backends()) {
    if (name == b->name()) return *b;
    known += (known.empty() ? "" : ", ") + std::string(b->name());
  }
  throw UsageError("backend: no backend named '" + name + "'; this build has " + known);
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Backend* b : all_backends()) names.push_back(b->name());
  return names;
}

}  // namespace nabla
