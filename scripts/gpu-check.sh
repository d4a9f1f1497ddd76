#!/usr/bin/env bash
# The GPU checks, in one run on a device machine with an NVIDIA GPU, from the
# bundle scripts/gpu-bundle builds (.gpu/, carried beside the repository):
#   1. every op's gradient cases on the GPU against the CPU (the Cuda_
#      tests: forward and gradients, f64 and f32, five layouts) and the
#      backend, update and whole-model tests;
#   2. compute-sanitizer memcheck over a sample of those cases;
#   3. training and greedy sampling through the CLI (tests/cli/train_backend.sh);
#   4. bench/gpu_train.sh, one round: ViT-Tiny and GPT-2 124M against PyTorch,
#      f32 then bf16 (raw results land in $OUT as they come);
#   5. the gradient checks (finite differences) of every op on the GPU;
#   6. compute-sanitizer racecheck over the kernels that share memory in a block.
# About 9 minutes: run(command="bash .gpu/gpu-check.sh", carry=[".gpu"], timeout_s=570).
# Each step has its own time limit, so a hang costs one step, not the run.
# Logs go to $OUT (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/.."
b=$PWD/.gpu
export LD_LIBRARY_PATH=$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$PATH:/usr/local/cuda/bin  # compute-sanitizer
o=${OUT:-/tmp/gpu-check}
mkdir -p "$o"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$o/gpu.txt"
step() {  # step NAME SECONDS COMMAND...: runs it, its output to $o/NAME.log, and its end here
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$o/$name.log" 2>&1
  local status=$?
  echo "== $name: exit $status in $((SECONDS - t0)) s"
  tail -n 25 "$o/$name.log"
}
step tests 150 "$b/nabla_tests" --gtest_brief=1 \
  --gtest_filter='Cuda_*:Backends.*:Backends/*:UpdateOps.*:FactoredUpdate.*:CudaAttention.*:CudaRowSums.*:CudaColumnFolds.*:Executor.HostCopyHasEachRunsValue:TrainStep.MicroBatchesSumOnEveryBackend'
step memcheck 80 compute-sanitizer --tool memcheck --error-exitcode 99 "$b/nabla_tests" --gtest_brief=1 \
  --gtest_filter='Cuda_add.*:Cuda_sum.*:Cuda_softmax.*:Cuda_layer_norm_affine_back.*:Cuda_attention.*:Cuda_attention_back.*:Cuda_matmul.*:Cuda_scatter_add_rows.*:Cuda_cross_entropy.*:Cuda_rope.*:CudaAttention.*/cuda:CudaRowSums.*:CudaColumnFolds.*'
step cli 60 sh tests/cli/train_backend.sh "$b/nabla" /tmp/gpu-check-cli cuda
NABLA_BENCH_BIN=$b/nabla_bench_train step bench 170 bench/gpu_train.sh 1
step gradcheck 50 "$b/nabla" gradcheck --backend cuda
# Shared-memory races inside a block (the tiles', the row kernels'): what the
# emulator, which runs a block's threads one at a time, cannot see.
step racecheck 50 compute-sanitizer --tool racecheck --error-exitcode 99 \
  "$b/nabla_tests" --gtest_brief=1 \
  --gtest_filter='Cuda_attention*.*_contiguous:Cuda_softmax.*_contiguous:Cuda_layer_norm_affine_back.*_contiguous:Cuda_scatter_add_rows.*_contiguous:CudaRowSums.*:CudaColumnFolds.*:CudaAttention.*/cuda'
