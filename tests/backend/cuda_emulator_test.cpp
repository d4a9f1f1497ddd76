// The CUDA emulator (src/backend/cuda/emulator.h) that the CUDA kernels'
// tests run on: threads, blocks, shared memory, barriers and warp shuffles
// behave as on a GPU, and a kernel whose threads wait at different barriers
// is an error, not a hang or a silent pass.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#define NABLA_CUDA_EMULATED 1
#include "backend/cuda/kernel.h"
#include "backend/cuda/tiles.h"

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

// block_product (tiles.h) of A [M, K] and B [K, N] stored as asked (each
// transposed or not) in shared memory with row padding `pad`, onto C (its
// rows scaled first with `accumulate`); small integers, so every sum is
// exact in f32 and in bf16's products alike.
struct TileCase {
  int M, N, K, pad;
  bool a_t, b_t, accumulate;
};

template <class E>
__global__ void tile_product_kernel(TileCase c, const float* a, const float* b, const float* scale, float* out) {
  const int lda = (c.a_t ? c.M : c.K) + c.pad, ldb = (c.b_t ? c.K : c.N) + c.pad, ldc = c.N + 4;
  E* as = dynamic_shared<E>();
  E* bs = as + (c.a_t ? c.K : c.M) * lda;
  float* cs = reinterpret_cast<float*>(bs + (c.b_t ? c.N : c.K) * ldb);
  for (int e = int(threadIdx.x); e < c.M * c.K; e += int(blockDim.x)) {
    const int i = e / c.K, k = e % c.K;
    as[c.a_t ? k * lda + i : i * lda + k] = to_element<E>(a[e]);
  }
  for (int e = int(threadIdx.x); e < c.K * c.N; e += int(blockDim.x)) {
    const int k = e / c.N, j = e % c.N;
    bs[c.b_t ? j * ldb + k : k * ldb + j] = to_element<E>(b[e]);
  }
  for (int e = int(threadIdx.x); e < c.M * c.N; e += int(blockDim.x)) cs[e / c.N * ldc + e % c.N] = out[e];
  __syncthreads();
  block_product<float, E>({as, lda, c.a_t}, {bs, ldb, c.b_t}, cs, ldc, c.M, c.N, c.K, c.accumulate, scale);
  __syncthreads();
  for (int e = int(threadIdx.x); e < c.M * c.N; e += int(blockDim.x)) out[e] = cs[e / c.N * ldc + e % c.N];
}

template <class E>
std::vector<float> tile_product(const TileCase& c, const std::vector<float>& a, const std::vector<float>& b,
                                const std::vector<float>& scale, std::vector<float> out) {
  const size_t bytes = size_t((c.a_t ? c.K : c.M) * ((c.a_t ? c.M : c.K) + c.pad) +
                              (c.b_t ? c.N : c.K) * ((c.b_t ? c.K : c.N) + c.pad)) * sizeof(E) +
                       size_t(c.M * (c.N + 4)) * sizeof(float);
  launch(context(), Launch{dim3(1), dim3(128), bytes, true}, tile_product_kernel<E>, c, a.data(), b.data(),
         scale.data(), out.data());
  return out;
}

TEST(CudaEmulator, TileProductsOnCudaAndTensorCoresAreExactOnSmallIntegers) {
  for (const bool a_t : {false, true}) {
    for (const bool b_t : {false, true}) {
      for (const bool accumulate : {false, true}) {
        const TileCase c{32, 48, 64, 8, a_t, b_t, accumulate};
        std::vector<float> a(size_t(c.M * c.K)), b(size_t(c.K * c.N)), scale(size_t(c.M)), start(size_t(c.M * c.N));
        for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i * 7 % 9) - 4);
        for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i * 5 % 7) - 3);
        for (size_t i = 0; i < scale.size(); ++i) scale[i] = i % 2 ? 0.5f : 2.0f;
        for (size_t i = 0; i < start.size(); ++i) start[i] = float(int(i % 11) - 5);
        std::vector<float> want(start.size());
        for (int i = 0; i < c.M; ++i) {
          for (int j = 0; j < c.N; ++j) {
            float s = accumulate ? start[size_t(i * c.N + j)] * scale[size_t(i)] : 0.0f;
            for (int k = 0; k < c.K; ++k) s += a[size_t(i * c.K + k)] * b[size_t(k * c.N + j)];
            want[size_t(i * c.N + j)] = s;
          }
        }
        SCOPED_TRACE(std::string("A") + (a_t ? "^T" : "") + " B" + (b_t ? "^T" : "") + (accumulate ? " + C" : ""));
        EXPECT_EQ(tile_product<float>(c, a, b, scale, start), want) << "CUDA cores";
        EXPECT_EQ(tile_product<bf16>(c, a, b, scale, start), want) << "tensor cores";
      }
    }
  }
}

// wmma reads 32-byte aligned tiles whose rows are 16-byte multiples: a
// layout the GPU would misread fails under the emulator.
TEST(CudaEmulator, TensorCoreTilesRefuseMisalignedRows) {
  const TileCase c{16, 16, 16, 4, false, false, false};  // bf16 rows of 20: 40 bytes
  const std::vector<float> a(256, 1.0f), b(256, 1.0f), scale(16, 1.0f), out(256, 0.0f);
  try {
    tile_product<bf16>(c, a, b, scale, out);
    FAIL() << "the misaligned product ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("tensor-core operand must be 32-byte aligned"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(tile_product<float>(c, a, b, scale, out)) << "CUDA cores read any layout";
}

TEST(CudaEmulator, SharedMemoryPastTheLimitIsRefused) {
  try {
    launch(context(), Launch{dim3(1), dim3(32), cuda_emulator::kMaxSharedBytes + 1, true}, barrier_kernel, nullptr);
    FAIL() << "the block ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of shared memory (at most"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nabla::cuda_emulated
