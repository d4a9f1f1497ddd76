// The CUDA emulator (src/backend/cuda/emulator.h) that the CUDA kernels'
// tests run on: threads, blocks, shared memory, barriers and warp shuffles
// behave as on a GPU, and a kernel whose threads wait at different barriers
// is an error, not a hang or a silent pass.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#define NABLA_CUDA_EMULATED 1
#include "backend/cuda/kernel.h"

namespace nabla::cuda_emulated {
namespace {

Context context() { return {}; }

__global__ void block_sums_kernel(int* out) { out[blockIdx.x * blockDim.x + threadIdx.x] = block_sum(int(threadIdx.x + 1)); }

TEST(CudaEmulator, BlockSumReachesEveryThread) {
  for (unsigned threads : {32u, 64u, 256u, 1024u}) {
    std::vector<int> out(2 * threads, -1);
    launch(context(), Launch{dim3(2), dim3(threads), 0, true}, block_sums_kernel, out.data());
    const int want = int(threads * (threads + 1) / 2);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], want) << threads << " threads, thread " << i;
  }
}

__global__ void shuffles_kernel(int* out) {
  const int lane = lane_id();
  out[4 * threadIdx.x] = shuffle_xor(lane * 10, 1);
  out[4 * threadIdx.x + 1] = shuffle_down(lane * 10, 3);
  out[4 * threadIdx.x + 2] = shuffle_from(lane * 10, 5);
  out[4 * threadIdx.x + 3] = warp_max(lane == 7 ? 100 : lane);
}

TEST(CudaEmulator, WarpShufflesReadTheirSourceLane) {
  std::vector<int> out(4 * 64);
  launch(context(), Launch{dim3(1), dim3(64), 0, true}, shuffles_kernel, out.data());
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    EXPECT_EQ(out[4 * t], (lane ^ 1) * 10) << t;
    // Past the warp's end a lane keeps its own value, as __shfl_down_sync.
    EXPECT_EQ(out[4 * t + 1], (lane + 3 < 32 ? lane + 3 : lane) * 10) << t;
    EXPECT_EQ(out[4 * t + 2], 50) << t;
    EXPECT_EQ(out[4 * t + 3], 100) << t;
  }
}

// Thread t writes shared[t], then after the barrier reads its neighbour's.
__global__ void neighbour_kernel(int* out) {
  NABLA_SHARED int shared[128];
  shared[threadIdx.x] = int(blockIdx.x * 1000 + threadIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = shared[(threadIdx.x + 1) % blockDim.x];
}

TEST(CudaEmulator, SharedMemoryIsTheBlocksAfterABarrier) {
  std::vector<int> out(3 * 128);
  launch(context(), Launch{dim3(3), dim3(128), 0, true}, neighbour_kernel, out.data());
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t < 128; ++t) EXPECT_EQ(out[size_t(b * 128 + t)], b * 1000 + (t + 1) % 128);
  }
}

// The first half passes one barrier and finishes; the second half waits at
// a second barrier that only it reaches. A finished thread counts as
// arrived, as on the GPU, so the block completes.
__global__ void divergent_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
    out[threadIdx.x] = 1;
  } else {
    __syncthreads();
    __syncthreads();
  }
}

TEST(CudaEmulator, FinishedThreadsCountAsArrived) {
  std::vector<int> out(64, 0);
  launch(context(), Launch{dim3(1), dim3(64), 0, true}, divergent_kernel, out.data());
  EXPECT_EQ(std::accumulate(out.begin(), out.end(), 0), 16);
}

__global__ void warp_divergent_kernel(int* out) {
  if (threadIdx.x < 32) out[threadIdx.x] = shuffle_xor(int(threadIdx.x), 1);
  __syncthreads();
}

// Warp 0 shuffles, then waits at the barrier where warp 1 waits from the
// start: a shuffle is a warp's own.
TEST(CudaEmulator, AWholeWarpMayShuffleWhileOthersWait) {
  std::vector<int> out(64);
  launch(context(), Launch{dim3(1), dim3(64), 0, true}, warp_divergent_kernel, out.data());
  EXPECT_EQ(out[3], 2);
}

__global__ void split_warp_kernel(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = shuffle_xor(int(threadIdx.x), 1);
  __syncthreads();
}

TEST(CudaEmulator, AWarpSplitBetweenAShuffleAndABarrierIsAnError) {
  std::vector<int> out(32);
  try {
    launch(context(), Launch{dim3(1), dim3(32), 0, true}, split_warp_kernel, out.data());
    FAIL() << "the block ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
}

__global__ void barrier_kernel(int*) { __syncthreads(); }

TEST(CudaEmulator, ABarrierNeedsALaunchWithBarriers) {
  std::vector<int> out(1);
  try {
    launch(context(), Launch{dim3(1), dim3(32), 0, false}, barrier_kernel, out.data());
    FAIL() << "ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("__syncthreads in a kernel launched without barriers"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace nabla::cuda_emulated
