#include "backend/backend.h"

#include <cstdlib>

#include "nabla/error.h"
#include "nabla/executor.h"

namespace nabla {

const Backend& reference_backend();
const Backend& cuda_emulated_backend();
#if defined(NABLA_HAVE_CUDA)
const Backend& cuda_backend();
#endif

namespace {
std::vector<const Backend*> all_backends() {
  return {&cpu_backend(), &reference_backend(), &cuda_emulated_backend(),
#if defined(NABLA_HAVE_CUDA)
          &cuda_backend(),
#endif
  };
}
}  // namespace

void* Backend::allocate_host(size_t bytes) const {
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p) throw Error(std::string(name()) + ": out of memory allocating " + std::to_string(bytes) + " host bytes");
  return p;
}
void Backend::release_host(void* host) const { std::free(host); }
std::unique_ptr<Fence> Backend::copy_out_queued(void* host_dst, const void* src, size_t bytes) const {
  copy_out(host_dst, src, bytes);
  return std::make_unique<Fence>();
}

const Backend& find_backend(const std::string& name, bool usable) {
  std::string known;
  for (const Backend* b : all_backends()) {
    if (name == b->name()) {
      const std::string why = usable ? b->unavailable() : "";
      if (!why.empty()) throw UsageError("backend: " + name + ": " + why);
      return *b;
    }
    known += (known.empty() ? "" : ", ") + std::string(b->name());
  }
#if !defined(NABLA_HAVE_CUDA)
  if (name == "cuda") {
    throw UsageError("backend: this build has no 'cuda' backend (nvcc was not found when it was configured, or "
                     "NABLA_CUDA=OFF); it has " + known);
  }
#endif
  throw UsageError("backend: no backend named '" + name + "'; this build has " + known);
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Backend* b : all_backends()) names.push_back(b->name());
  return names;
}

}  // namespace nabla

namespace nabla {

std::string backend_unavailable(const std::string& name) {
  try {
    find_backend(name);
    return "";
  } catch (const UsageError& e) {
    return e.what();
  }
}

}  // namespace nabla
