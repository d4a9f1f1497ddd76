// The CUDA emulator's scheduler (see emulator.h). Fibers run on stacks kept
// per host thread and reused from block to block; on x86-64 a switch saves
// the callee-saved registers and swaps stack pointers (no system call, and
// no swapcontext, which AddressSanitizer does not support), elsewhere it is
// swapcontext. Under AddressSanitizer every switch is announced to it.
#include "backend/cuda/emulator.h"

#include <sys/mman.h>
#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#define NABLA_EMULATOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NABLA_EMULATOR_ASAN 1
#endif
#endif
#if defined(NABLA_EMULATOR_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include <exception>
#include <numeric>
#include <string>
#include <vector>

#include "nabla/error.h"

#if defined(__x86_64__)
// nabla_emulator_switch(from, to): pushes the callee-saved registers, stores
// the stack pointer in *from, loads `to` and pops its registers: the return
// lands where `to` last switched away (or, for a new fiber, in its entry).
extern "C" void nabla_emulator_switch(void** from, void* to);
asm(R"(
  .text
  .p2align 4
  .globl nabla_emulator_switch
  .type nabla_emulator_switch, @function
nabla_emulator_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size nabla_emulator_switch, .-nabla_emulator_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

namespace nabla::cuda_emulator {

namespace {

// A suspended execution.
struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

// c starts entry() on the stack [stack, stack + bytes) when switched to.
void prepare(Context& c, char* stack, size_t bytes, void (*entry)()) {
#if defined(NABLA_EMULATOR_ASAN)
  // A finished fiber never unwound its frames: their redzones would still
  // be poisoned for the next fiber on this stack.
  __asan_unpoison_memory_region(stack, bytes);
#endif
#if defined(__x86_64__)
  // entry's frame as if called: its return address (never used) at a
  // 16-byte boundary + 8, below it the address `ret` jumps to, below that
  // the six registers the switch pops.
  auto* top = reinterpret_cast<uintptr_t*>((reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15)) - 8);
  top[0] = 0;
  top[-1] = reinterpret_cast<uintptr_t>(entry);
  for (int r = 2; r <= 7; ++r) top[-r] = 0;
  c.sp = top - 7;
#else
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
#endif
}

void switch_context(Context& from, Context& to) {
#if defined(__x86_64__)
  nabla_emulator_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

constexpr size_t kStackBytes = size_t(256) << 10;
constexpr unsigned kMaxThreads = 1024;

enum class Wait : uint8_t { none, block, warp, done };

struct Fiber {
  Context context;
  char* stack = nullptr;
  ThreadState state;
  Wait wait = Wait::none;
  int block_syncs = 0, warp_syncs = 0;
};

struct Block {
  std::vector<Fiber> fibers;
  Context scheduler;
  // The scheduler's stack, for AddressSanitizer's switch announcements.
  const void* scheduler_bottom = nullptr;
  size_t scheduler_size = 0;
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

// From the scheduler into fiber f, until it switches back.
void enter(Block& b, Fiber& f) {
#if defined(NABLA_EMULATOR_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, kStackBytes);
  switch_context(b.scheduler, f.context);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  switch_context(b.scheduler, f.context);
#endif
}

// From fiber f back to the scheduler; a finished fiber is never resumed.
void leave(Block& b, Fiber& f, bool finished) {
#if defined(NABLA_EMULATOR_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(finished ? nullptr : &fake, b.scheduler_bottom, b.scheduler_size);
  switch_context(f.context, b.scheduler);
  __sanitizer_finish_switch_fiber(fake, &b.scheduler_bottom, &b.scheduler_size);
#else
  (void)finished;
  switch_context(f.context, b.scheduler);
#endif
}

void fiber_entry() {
  Block& b = *host.block;
  Fiber& f = *b.running;
#if defined(NABLA_EMULATOR_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &b.scheduler_bottom, &b.scheduler_size);
#endif
  try {
    (*host.body)();
  } catch (...) {
    if (!b.failure) b.failure = std::current_exception();
  }
  f.wait = Wait::done;
  leave(b, f, true);
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

// Out of line: getcontext (where it is used) returns twice, like setjmp,
// which a loop's variables around it would not survive.
__attribute__((noinline)) void start_fiber(Fiber& f, const ThreadState& state) {
  f.state = state;
  f.wait = Wait::none;
  f.block_syncs = f.warp_syncs = 0;
  prepare(f.context, f.stack, kStackBytes, fiber_entry);
}

// The order blocks, and threads between barriers, run in: a fixed
// permutation of [0, n) instead of 0, 1, 2, ..., as a GPU promises no
// order (a kernel whose results hang on it, through integer atomics say,
// shows it here too). order[k]: the k-th to run.
struct Order {
  size_t n, step = 7919;  // a prime, moved to the next odd number coprime to n
  explicit Order(size_t count) : n(count) {
    while (std::gcd(step, n) != 1) step += 2;
  }
  size_t operator[](size_t k) const { return n <= 2 ? n - 1 - k : size_t((uint64_t(k) * step + n / 2) % n); }
};

// Linear index i of a grid or block as its (x, y, z).
dim3 position(size_t i, const dim3& extent) {
  return dim3(unsigned(i % extent.x), unsigned(i / extent.x % extent.y), unsigned(i / (size_t(extent.x) * extent.y)));
}

void run_block_with_barriers(Block& b, const dim3& block_idx) {
  const dim3 d = host.launch.block;
  b.failure = nullptr;
  for (unsigned z = 0, t = 0; z < d.z; ++z) {
    for (unsigned y = 0; y < d.y; ++y) {
      for (unsigned x = 0; x < d.x; ++x, ++t) start_fiber(b.fibers[t], {dim3(x, y, z), block_idx});
    }
  }
  const Order order(b.fibers.size());
  for (;;) {
    bool progress = false, all_done = true;
    for (size_t k = 0; k < b.fibers.size(); ++k) {
      const size_t i = order[k];
      Fiber& f = b.fibers[i];
      if (f.wait == Wait::done) continue;
      all_done = false;
      if (!may_run(b, f, i)) continue;
      f.wait = Wait::none;
      b.running = &f;
      host.current = &f.state;
      enter(b, f);
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
  if (dynamic_shared_bytes > kMaxSharedBytes) {
    throw emulator_error("a block of " + std::to_string(dynamic_shared_bytes) + " bytes of shared memory (at most " +
                         std::to_string(kMaxSharedBytes) + ")");
  }
  host.launch = {grid, block, nullptr, dynamic_shared_bytes};
  host.dynamic_shared.assign(dynamic_shared_bytes + 128, 0xA5);  // garbage, as on the device
  // Aligned as the device's (device.h declares it 128-byte aligned).
  const uintptr_t base = reinterpret_cast<uintptr_t>(host.dynamic_shared.data());
  host.launch.dynamic_shared = host.dynamic_shared.data() + ((128 - base % 128) % 128);
  struct Reset {
    ~Reset() {
      host.body = nullptr;
      host.block = nullptr;
      host.current = nullptr;
    }
  } reset;
  host.body = &body;
  const Order blocks(size_t(grid.x) * grid.y * grid.z);
  if (!barriers) {
    const Order in_block(threads);
    for (size_t k = 0; k < blocks.n; ++k) {
      const dim3 block_idx = position(blocks[k], grid);
      for (size_t j = 0; j < threads; ++j) {
        host.plain = {position(in_block[j], block), block_idx};
        host.current = &host.plain;
        body();
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
  for (size_t k = 0; k < blocks.n; ++k) run_block_with_barriers(b, position(blocks[k], grid));
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
  leave(*host.block, f, false);
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
