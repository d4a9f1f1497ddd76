#include "backend/guarded_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "nabla/error.h"

namespace nabla::guarded_pages {

namespace {

// Live allocations: start -> length in bytes (whole pages).
class Pages {
 public:
  void* allocate(size_t bytes, const char* what) {
    const size_t length = round(bytes);
    void* p = mmap(nullptr, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error(std::string(what) + ": out of memory allocating " + std::to_string(bytes) + " bytes");
    std::lock_guard<std::mutex> lock(mutex_);
    live_[static_cast<char*>(p)] = length;
    return p;
  }
  void release(void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(static_cast<char*>(p));
    if (it == live_.end()) return;
    munmap(p, it->second);
    live_.erase(it);
  }
  bool contains(const void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.upper_bound(static_cast<char*>(const_cast<void*>(p)));
    return it != live_.begin() && static_cast<const char*>(p) < std::prev(it)->first + std::prev(it)->second;
  }
  // The allocation holding p: its start and length.
  std::pair<char*, size_t> region(const void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.upper_bound(static_cast<char*>(const_cast<void*>(p)));
    if (it == live_.begin()) throw Error("internal: device memory access outside its allocations");
    --it;
    if (static_cast<const char*>(p) >= it->first + it->second) {
      throw Error("internal: device memory access outside its allocations");
    }
    return {it->first, it->second};
  }

 private:
  static size_t round(size_t bytes) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    return bytes == 0 ? page : (bytes + page - 1) / page * page;
  }
  std::mutex mutex_;
  std::map<char*, size_t> live_;
};

Pages& pages() {
  static Pages p;
  return p;
}

}  // namespace

void* allocate(size_t bytes, const char* what) { return pages().allocate(bytes, what); }
void release(void* p) { pages().release(p); }
bool contains(const void* p) { return pages().contains(p); }

Open::Open(const std::vector<const void*>& pointers) {
  for (const void* p : pointers) {
    if (!p) continue;
    auto r = pages().region(p);
    bool seen = false;
    for (const auto& o : open_) seen = seen || o.first == r.first;
    if (seen) continue;
    mprotect(r.first, r.second, PROT_READ | PROT_WRITE);
    open_.push_back(r);
  }
}

Open::~Open() {
  for (const auto& [p, n] : open_) mprotect(p, n, PROT_NONE);
}

}  // namespace nabla::guarded_pages
