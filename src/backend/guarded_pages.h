// Host memory that stands for a device's: whole pages kept inaccessible
// (PROT_NONE) except while a backend's own kernels or copies open them, so
// code that reads a tensor's device memory as if it were the host's faults
// in tests, as it would on a GPU. The reference backend's memory and the
// CUDA emulator's.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace nabla::guarded_pages {

// `what` names the backend in errors ("reference: out of memory ...").
void* allocate(size_t bytes, const char* what);
void release(void* p);
// Whether p lies in a live allocation.
bool contains(const void* p);

// While alive, the allocations holding the given pointers (null ones are
// skipped) are readable and writable; then inaccessible again.
class Open {
 public:
  explicit Open(const std::vector<const void*>& pointers);
  ~Open();
  Open(const Open&) = delete;
  Open& operator=(const Open&) = delete;

 private:
  std::vector<std::pair<char*, size_t>> open_;
};

}  // namespace nabla::guarded_pages
