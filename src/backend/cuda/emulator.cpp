// The CUDA emulator's scheduler (see emulator.h). Fibers are ucontext
// contexts on stacks kept per host thread and reused from block to block.
#include "backend/cuda/emulator.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <exception>
#include <string>
#include <vector>

#include "nabla/error.h"

namespace nabla::cuda_emulator {

namespace {

constexpr size_t kStackBytes = size_t(256) << 10;
constexpr unsigned kMaxThreads = 1024;

enum class Wait : uint8_t { none, block, warp, done };

struct Fiber {
  ucontext_t context;
  char* stack = nullptr;
  ThreadState state;
  Wait wait = Wait::none;
  int block_syncs = 0, warp_syncs = 0;
  uint64_t published = 0;  // this lane's value in the current exchange
};

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  unsigned threads = 0;
  Fiber* running = nullptr;
  std::exception_ptr failure;
  // Each warp's published values, double-buffered by exchange parity.
  std::vector<uint64_t> slots;  // [warp][parity][lane]
};

struct HostThread {
  LaunchState launch;
  ThreadState plain;  // the running thread of a launch without barriers
  const ThreadState* current = nullptr;
  Block* block = nullptr;  // set while a launch with barriers runs
  const std::function<void()>* body = nullptr;
  std::vector<char*> stacks;
  std::vector<unsigned char> dynamic_shared;
  ~HostThread() {
    for (char* s : stacks) munmap(s, kStackBytes);
  }
};

thread_local HostThread host;

Error emulator_error(const std::string& what) { return Error("cuda emulator: " + what); }

void fiber_entry() {
  Block& b = *host.block;
  Fiber& f = *b.running;
  try {
    (*host.body)();
  } catch (...) {
    if (!b.failure) b.failure = std::current_exception();
  }
  f.wait = Wait::done;
  // Back to the scheduler; a finished fiber is never resumed.
  swapcontext(&f.context, &b.scheduler);
}

unsigned linear(const dim3& i, const dim3& d) { return i.x + d.x * (i.y + d.y * i.z); }

// Whether fiber f may go on: the barrier it waits at is complete.
bool may_run(const Block& b, const Fiber& f, size_t index) {
  switch (f.wait) {
    case Wait::none: return true;
    case Wait::done: return false;
    case Wait::block:
      for (const Fiber& o : b.fibers) {
        if (o.wait != Wait::done && o.block_syncs < f.block_syncs) return false;
      }
      return true;
    case Wait::warp: {
      const size_t first = index / 32 * 32, last = std::min(first + 32, b.fibers.size());
      for (size_t k = first; k < last; ++k) {
        const Fiber& o = b.fibers[k];
        if (o.wait != Wait::done && o.warp_syncs < f.warp_syncs) return false;
      }
      return true;
    }
  }
  return false;
}

// Out of line: getcontext returns twice, like setjmp, which a loop's
// variables around it would not survive.
__attribute__((noinline)) void start_fiber(Fiber& f, const ThreadState& state) {
  f.state = state;
  f.wait = Wait::none;
  f.block_syncs = f.warp_syncs = 0;
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack;
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = nullptr;
  makecontext(&f.context, fiber_entry, 0);
}

void run_block_with_barriers(Block& b, const dim3& block_idx) {
  const dim3 d = host.launch.block;
  b.failure = nullptr;
  for (unsigned z = 0, t = 0; z < d.z; ++z) {
    for (unsigned y = 0; y < d.y; ++y) {
      for (unsigned x = 0; x < d.x; ++x, ++t) start_fiber(b.fibers[t], {dim3(x, y, z), block_idx});
    }
  }
  for (;;) {
    bool progress = false, all_done = true;
    for (size_t i = 0; i < b.fibers.size(); ++i) {
      Fiber& f = b.fibers[i];
      if (f.wait == Wait::done) continue;
      all_done = false;
      if (!may_run(b, f, i)) continue;
      f.wait = Wait::none;
      b.running = &f;
      host.current = &f.state;
      swapcontext(&b.scheduler, &f.context);
      host.current = nullptr;
      progress = true;
      if (b.failure) std::rethrow_exception(b.failure);
    }
    if (all_done) return;
    if (!progress) {
      throw emulator_error("deadlock in block (" + std::to_string(block_idx.x) + ", " + std::to_string(block_idx.y) +
                           ", " + std::to_string(block_idx.z) +
                           "): its threads wait at different barriers (a __syncthreads or warp shuffle that "
                           "not every thread reaches)");
    }
  }
}

}  // namespace

const ThreadState& thread() {
  if (!host.current) throw emulator_error("threadIdx/blockIdx read outside a kernel");
  return *host.current;
}

const LaunchState& launch_state() { return host.launch; }

void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, bool barriers, const std::function<void()>& body) {
  const unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > kMaxThreads) {
    throw emulator_error("a block of " + std::to_string(threads) + " threads (1 to 1024 allowed)");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) throw emulator_error("an empty grid");
  if (host.body) throw emulator_error("a launch inside a kernel");
  host.launch = {grid, block, nullptr};
  host.dynamic_shared.assign(dynamic_shared_bytes + 16, 0xA5);  // garbage, as on the device
  host.launch.dynamic_shared = host.dynamic_shared.data();
  struct Reset {
    ~Reset() {
      host.body = nullptr;
      host.block = nullptr;
      host.current = nullptr;
    }
  } reset;
  host.body = &body;
  if (!barriers) {
    for (unsigned bz = 0; bz < grid.z; ++bz) {
      for (unsigned by = 0; by < grid.y; ++by) {
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          for (unsigned z = 0; z < block.z; ++z) {
            for (unsigned y = 0; y < block.y; ++y) {
              for (unsigned x = 0; x < block.x; ++x) {
                host.plain = {dim3(x, y, z), dim3(bx, by, bz)};
                host.current = &host.plain;
                body();
              }
            }
          }
        }
      }
    }
    return;
  }
  while (host.stacks.size() < threads) {
    void* s = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) throw emulator_error("out of memory for fiber stacks");
    host.stacks.push_back(static_cast<char*>(s));
  }
  Block b;
  b.threads = threads;
  b.fibers.resize(threads);
  for (unsigned t = 0; t < threads; ++t) b.fibers[t].stack = host.stacks[t];
  b.slots.assign(size_t((threads + 31) / 32) * 2 * 32, 0);
  host.block = &b;
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) run_block_with_barriers(b, dim3(bx, by, bz));
    }
  }
}

namespace {

Fiber& running_fiber(const char* what) {
  if (!host.block || !host.block->running) {
    throw emulator_error(std::string(what) + " in a kernel launched without barriers");
  }
  return *host.block->running;
}

void yield(Fiber& f, Wait wait) {
  f.wait = wait;
  swapcontext(&f.context, &host.block->scheduler);
  host.current = &f.state;
}

}  // namespace

void sync_block() {
  Fiber& f = running_fiber("__syncthreads");
  ++f.block_syncs;
  yield(f, Wait::block);
}

int lane() {
  const ThreadState& t = thread();
  return int(linear(t.thread_idx, host.launch.block) % 32);
}

uint64_t exchange(uint64_t bits, int source) {
  Fiber& f = running_fiber("a warp shuffle");
  Block& b = *host.block;
  const size_t index = size_t(&f - b.fibers.data());
  const size_t warp = index / 32, me = index % 32;
  const size_t parity = size_t(f.warp_syncs % 2);
  uint64_t* slots = &b.slots[(warp * 2 + parity) * 32];
  slots[me] = bits;
  ++f.warp_syncs;
  yield(f, Wait::warp);
  const size_t lanes = std::min<size_t>(32, b.fibers.size() - warp * 32);
  // A lane that never published this exchange (it finished first) leaves
  // the reader its own value; one that did may have finished since.
  if (source < 0 || size_t(source) >= lanes || b.fibers[warp * 32 + size_t(source)].warp_syncs < f.warp_syncs) {
    return bits;
  }
  return slots[size_t(source)];
}

}  // namespace nabla::cuda_emulator
