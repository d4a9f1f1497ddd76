#!/bin/sh
# --low-memory keeps weight gradients as their factors and multiplies them
# out inside AdamW with the graph's own kernel: without clipping, a run's
# checkpoint (weights, optimizer moments, position) is byte-identical to the
# --no-low-memory run's. Few tokens (1 x 8) against a width of 128, so every
# block's weights and the tied embedding are factored. Without either flag a
# model this small holds its gradients whole (default_low_memory).
# Usage: train_gpt2_low_memory.sh PATH_TO_NABLA WORK_DIR
set -u
nabla=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
common="--layers 2 --heads 4 --width 128 --positions 32 --context 8 --batch 1 --steps 6 --warmup 2 --dropout 0.1
        --clip 0 --eval-every 6 --eval-batches 1 --threads 2"
"$nabla" train gpt2 $common --no-low-memory --save "$dir/whole.safetensors" >"$dir/whole.log" 2>&1 ||
  { cat "$dir/whole.log"; echo "--no-low-memory run failed"; exit 1; }
"$nabla" train gpt2 $common >"$dir/default.log" 2>&1 ||
  { cat "$dir/default.log"; echo "default run failed"; exit 1; }
if grep -q "low memory" "$dir/whole.log" "$dir/default.log"; then
  cat "$dir/default.log"; echo "a 0.4M-parameter model holds its gradients whole unless told"; exit 1
fi
if "$nabla" train gpt2 $common --low-memory --no-low-memory >"$dir/both.log" 2>&1 ||
  ! grep -q "excludes" "$dir/both.log"; then
  cat "$dir/both.log"; echo "--low-memory with --no-low-memory should be refused"; exit 1
fi
"$nabla" train gpt2 $common --low-memory --save "$dir/low.safetensors" >"$dir/low.log" 2>&1 ||
  { cat "$dir/low.log"; echo "low-memory run failed"; exit 1; }
grep -q "low memory: 9 weight gradients kept as their factors" "$dir/low.log" ||
  { cat "$dir/low.log"; echo "expected 9 factored gradients (2 blocks x 4 weights, and wte)"; exit 1; }
# Bit for bit where f32 products run on nabla's AVX-512 kernel (OpenBLAS's
# summation order may depend on the rows it is given).
if ! grep -q avx512_bf16 /proc/cpuinfo; then
  echo "no AVX-512 BF16: the runs agree to rounding only, not compared"; exit 0
fi
if cmp "$dir/whole.safetensors" "$dir/low.safetensors"; then
  echo "low-memory run is bit-identical to the whole-gradient one"
else
  echo "low-memory checkpoint differs from the whole-gradient run"; exit 1
fi
