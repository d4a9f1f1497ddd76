// Persistent worker threads and the one parallel primitive kernels use.
//
// Determinism: kernels split their work into chunks whose size never depends on
// the thread count; a chunk computes the same bits whichever thread runs it.
// That keeps every result bit-identical at 1, 2 or N threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace nabla::cpu {

// A non-owning reference to a callable `void(int64_t begin, int64_t end)`;
// avoids std::function's allocation on the per-node hot path.
class RangeFn {
 public:
  template <class F,
            class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, RangeFn>>>
  RangeFn(F&& f)  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(o))(b, e); }) {}
  void operator()(int64_t begin, int64_t end) const { call_(obj_, begin, end); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t, int64_t);
};

// Splits [0, n) into chunks of `grain` items (the last may be shorter) and runs
// fn(begin, end) for each chunk on up to `threads` threads, the caller included.
// Each thread starts on its own contiguous share of the chunks, the caller on
// the first, so consecutive calls over the same rows keep them on one core;
// a thread that finishes early takes the others' leftovers.
// Returns when every chunk has run. Exceptions thrown by fn are rethrown here.
void parallel_for(int threads, int64_t n, int64_t grain, RangeFn fn);

// Work per chunk below which splitting does not pay: waking a worker and
// waiting for it costs microseconds (tens of them when it slept or its core
// is busy), about what 16K elements of simple work take.
inline constexpr int64_t kMinChunkWork = int64_t{1} << 14;

// Items per chunk when each item costs about item_work elements of work:
// chunks of ~kMinChunkWork, so an op with less work than that in all is one
// chunk and runs inline on the caller without waking a worker.
inline int64_t grain_for(int64_t item_work) {
  return std::max<int64_t>(1, kMinChunkWork / std::max<int64_t>(1, item_work));
}

// The thread count used when none is given: the machine's hardware threads.
int default_threads();

}  // namespace nabla::cpu
