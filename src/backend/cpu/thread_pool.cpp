// One process-wide pool of persistent workers behind parallel_for.
//
// A call publishes a job (the range, the grain, fn) under a new epoch and hands
// the epoch to the helpers it wants. The chunks are split into one contiguous
// segment per participant (the caller first, then helper i): each claims its
// own segment's chunks in order from that segment's atomic counter, then
// the other segments' leftovers. So the caller always runs the first part of
// a range and helper i the same later part, op after op, and a row kernel
// finds the rows the previous op wrote on its own core still in its cache
// (one shared counter would interleave the chunks across the cores at random).
// When the caller finds no chunk left it closes the job and waits only for
// the workers that joined it: a helper the OS has not scheduled yet finds the
// job closed and never touches it (its segment is claimed by the others), so
// an oversubscribed machine slows a call down but cannot stall it.
#include "backend/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64)
#include <immintrin.h>
#define NABLA_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define NABLA_CPU_RELAX() asm volatile("yield")
#else
#define NABLA_CPU_RELAX() std::this_thread::yield()
#endif

namespace nabla::cpu {
namespace {

// How long an idle worker, or a caller waiting for workers, spins before it
// sleeps: on a VM a sleeping worker joins the next job about 100 us late (the
// host reschedules a halted vCPU), and a vCPU that never idles is descheduled
// (docs/performance.md).
constexpr auto kSpinTime = std::chrono::microseconds(500);

// Spins until done() holds or kSpinTime has passed; returns done().
template <class Pred>
bool spin_until(Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (done()) return true;
      NABLA_CPU_RELAX();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

// True on pool workers, and on a caller while it runs chunks: a parallel_for
// issued from inside a chunk runs inline, since the pool is busy with the
// outer call and waiting for it would deadlock.
thread_local bool t_inside_chunk = false;

// Set when the pool is destroyed at exit; later calls (from other static
// destructors) run inline.
constinit std::atomic<bool> g_pool_gone{false};

struct alignas(64) Worker {
  std::atomic<uint32_t> ticket{0};  // epoch of the last job handed to this worker
  std::atomic<bool> sleeping{false};
  std::mutex mutex;
  std::condition_variable cv;
  std::thread thread;
};

class Pool {
 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool();

  // Runs the chunks of [0, n) on the caller and threads - 1 helpers.
  void run(int threads, int64_t n, int64_t grain, int64_t chunks, const RangeFn& fn);

 private:
  // state_: epoch of the current job (high 32 bits), a closed flag, and the
  // number of workers inside the job (low 31 bits).
  static constexpr uint64_t kClosed = uint64_t{1} << 31;
  static constexpr uint64_t kCountMask = kClosed - 1;

  int grow(int helpers);
  void worker_main(Worker* w, int participant);
  bool join(uint32_t epoch);
  void leave();
  void run_chunks(int participant);
  void wait_for_workers();
  static void notify_if_sleeping(Worker& w);

  std::mutex call_mutex_;  // one job at a time; concurrent callers queue here
  std::vector<std::unique_ptr<Worker>> workers_;
  uint32_t epoch_ = 0;
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<uint64_t> state_{0};

  // The current job; written by the caller only while no worker is inside it.
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1, chunks_ = 0;
  // Participant p's chunks [p * chunks_ / parts_, (p + 1) * chunks_ / parts_):
  // next is the next one to claim (it may overshoot end), one line each.
  struct alignas(64) Segment {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::unique_ptr<Segment[]> segments_;
  int parts_ = 0, capacity_ = 0;
  std::mutex error_mutex_;
  std::exception_ptr error_;

  // The caller sleeps here when workers are slow to leave.
  std::mutex done_mutex_;
  std::condition_variable done_cv_;
  std::atomic<bool> caller_sleeping_{false};
};

Pool::~Pool() {
  g_pool_gone.store(true);
  stop_.store(true);
  for (auto& w : workers_) w->ticket.fetch_add(1);
  for (auto& w : workers_) notify_if_sleeping(*w);
  for (auto& w : workers_) {
    // exit() called from inside a chunk runs this on a worker; it cannot join itself.
    if (w->thread.get_id() == std::this_thread::get_id()) {
      w->thread.detach();
    } else {
      w->thread.join();
    }
  }
}

int Pool::grow(int helpers) {
  if (static_cast<int>(workers_.size()) < helpers) {
    workers_.reserve(helpers);  // so push_back below cannot throw with a thread running
    while (static_cast<int>(workers_.size()) < helpers) {
      auto w = std::make_unique<Worker>();
      try {
        w->thread = std::thread(&Pool::worker_main, this, w.get(), static_cast<int>(workers_.size()) + 1);
      } catch (const std::system_error&) {
        break;  // the system refuses more threads: run with the ones we have
      }
      workers_.push_back(std::move(w));
    }
  }
  return std::min(helpers, static_cast<int>(workers_.size()));
}

// Call after storing w.ticket. NOTE: the sleeping flag and the ticket form a
// Dekker pair (both seq_cst): either the worker sees the new ticket before it
// sleeps, or the waker sees sleeping == true and notifies through the mutex.
void Pool::notify_if_sleeping(Worker& w) {
  if (w.sleeping.load()) {
    { std::lock_guard<std::mutex> lock(w.mutex); }
    w.cv.notify_one();
  }
}

void Pool::worker_main(Worker* w, int participant) {
  t_inside_chunk = true;
  uint32_t seen = 0;
  for (;;) {
    const auto fresh = [&] { return w->ticket.load(std::memory_order_acquire) != seen; };
    if (!spin_until(fresh)) {
      std::unique_lock<std::mutex> lock(w->mutex);
      w->sleeping.store(true);
      while (w->ticket.load() == seen) w->cv.wait(lock);
      w->sleeping.store(false, std::memory_order_relaxed);
    }
    seen = w->ticket.load(std::memory_order_acquire);
    if (stop_.load()) return;
    if (join(seen)) {
      run_chunks(participant);
      leave();
    }
  }
}

// Enters job `epoch` unless it is stale or already closed.
bool Pool::join(uint32_t epoch) {
  uint64_t s = state_.load(std::memory_order_relaxed);
  do {
    if ((s >> 32) != epoch || (s & kClosed)) return false;
  } while (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                         std::memory_order_relaxed));
  return true;
}

void Pool::leave() {
  // After this decrement the job may be gone; only pool members are touched.
  const uint64_t s = state_.fetch_sub(1) - 1;
  if ((s & kClosed) && (s & kCountMask) == 0 && caller_sleeping_.load()) {
    { std::lock_guard<std::mutex> lock(done_mutex_); }
    done_cv_.notify_one();
  }
}

void Pool::run_chunks(int participant) {
  // Its own segment first, then the others' in turn.
  for (int i = 0; i < parts_; ++i) {
    Segment& seg = segments_[(participant + i) % parts_];
    for (;;) {
      const int64_t c = seg.next.fetch_add(1, std::memory_order_relaxed);
      if (c >= seg.end) break;
      const int64_t begin = c * grain_;
      try {
        (*fn_)(begin, begin + std::min(grain_, n_ - begin));
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
        // Skip the chunks nobody has started, as the inline path would.
        for (int p = 0; p < parts_; ++p) segments_[p].next.store(segments_[p].end, std::memory_order_relaxed);
      }
    }
  }
}

void Pool::wait_for_workers() {
  const auto drained = [&] { return (state_.load(std::memory_order_acquire) & kCountMask) == 0; };
  if (spin_until(drained)) return;
  // Same Dekker pairing as notify_if_sleeping(): caller_sleeping_ against the
  // count in leave().
  std::unique_lock<std::mutex> lock(done_mutex_);
  caller_sleeping_.store(true);
  while ((state_.load() & kCountMask) != 0) done_cv_.wait(lock);
  caller_sleeping_.store(false, std::memory_order_relaxed);
}

void Pool::run(int threads, int64_t n, int64_t grain, int64_t chunks, const RangeFn& fn) {
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  const int helpers = grow(threads - 1);

  fn_ = &fn;
  n_ = n;
  grain_ = grain;
  chunks_ = chunks;
  parts_ = helpers + 1;
  if (parts_ > capacity_) {
    segments_ = std::make_unique<Segment[]>(parts_);
    capacity_ = parts_;
  }
  for (int p = 0; p < parts_; ++p) {
    segments_[p].next.store(p * chunks / parts_, std::memory_order_relaxed);
    segments_[p].end = (p + 1) * chunks / parts_;
  }
  error_ = nullptr;
  ++epoch_;
  state_.store(uint64_t{epoch_} << 32, std::memory_order_release);
  // All tickets first: spinning helpers start at once, before the slow notifies
  // (a futex wake costs microseconds, tens of them on a VM).
  for (int i = 0; i < helpers; ++i) workers_[i]->ticket.store(epoch_);
  for (int i = 0; i < helpers; ++i) notify_if_sleeping(*workers_[i]);

  t_inside_chunk = true;
  run_chunks(0);
  t_inside_chunk = false;

  // Every chunk is claimed: let no one else in, then wait for those inside.
  if ((state_.fetch_or(kClosed, std::memory_order_acq_rel) & kCountMask) != 0) {
    wait_for_workers();
  }
  fn_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void parallel_for(int threads, int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = n / grain + (n % grain != 0);
  if (threads <= 1 || chunks == 1 || t_inside_chunk ||
      g_pool_gone.load(std::memory_order_relaxed)) {
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * grain;
      fn(begin, begin + std::min(grain, n - begin));
    }
    return;
  }
  pool().run(static_cast<int>(std::min<int64_t>(threads, chunks)), n, grain, chunks, fn);
}

int default_threads() {
  // Read once: the environment is not expected to change under a running program.
  static const int threads = [] {
    if (const char* env = std::getenv("NABLA_THREADS")) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (end != env && *end == '\0') return static_cast<int>(std::clamp(v, 1L, 1L << 16));
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return threads;
}

}  // namespace nabla::cpu
