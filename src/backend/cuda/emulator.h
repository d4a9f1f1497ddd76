// The CUDA emulator: the CUDA kernels of src/backend/cuda compiled as host
// C++ and run on the CPU, one block at a time, so that every kernel is
// checked against the CPU backend on machines without a GPU. Each thread
// of a block that uses barriers runs on a fiber of its own; the block's
// scheduler resumes a fiber only when the barrier it waits at is complete
// (__syncthreads: every live thread of the block; a warp shuffle: every
// live lane of its warp), so a kernel whose threads wait at different
// barriers ends in an error naming the deadlock instead of passing by luck.
// Kernels without barriers run as plain loops over their threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

namespace nabla::cuda_emulator {

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct ThreadState {
  dim3 thread_idx, block_idx;
};

struct LaunchState {
  dim3 grid, block;
  unsigned char* dynamic_shared = nullptr;
  size_t dynamic_shared_bytes = 0;
};

// A block's dynamic shared memory at most: the smallest opt-in limit of
// the GPUs the backend is built for (sm_120/sm_121: 99 KiB; sm_90: 227
// KiB), so the emulator runs the tiles the smallest target can hold.
inline constexpr size_t kMaxSharedBytes = size_t(99) << 10;

// The running thread and launch (valid inside a kernel only).
const ThreadState& thread();
const LaunchState& launch_state();

// Runs body() once per thread of grid x block, blocks in order. With
// `barriers`, each thread is a fiber and may call sync_block and the warp
// exchanges; without, calling them is an error.
void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, bool barriers, const std::function<void()>& body);

// __syncthreads.
void sync_block();
// A warp-wide exchange: every live lane of the warp publishes `bits` and
// gets lane `source`'s (its own where `source` is outside the warp).
uint64_t exchange(uint64_t bits, int source);

// The calling thread's lane (0-31) in its warp.
int lane();

template <class T>
T shuffle(T v, int source) {
  static_assert(sizeof(T) <= 8);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = exchange(bits, source);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace nabla::cuda_emulator
