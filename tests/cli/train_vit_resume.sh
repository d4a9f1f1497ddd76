#!/bin/sh
# Resume equivalence: a run stopped at step 17 and resumed to step 40 ends
# with a checkpoint byte-identical to an uninterrupted 40-step run (weights,
# optimizer moments, position), across an epoch boundary and with dropout.
# Usage: train_vit_resume.sh PATH_TO_NABLA WORK_DIR
set -u
nabla=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
common="--train-subset 1024 --test-subset 200 --epochs 2 --batch 32 --warmup 5 --dropout 0.1 --threads 2"
"$nabla" train vit $common --max-steps 40 --save "$dir/straight.safetensors" >/dev/null 2>&1 ||
  { echo "uninterrupted run failed"; exit 1; }
"$nabla" train vit $common --max-steps 17 --save "$dir/part.safetensors" >/dev/null 2>&1 ||
  { echo "first half failed"; exit 1; }
"$nabla" train vit $common --max-steps 40 --resume "$dir/part.safetensors" --save "$dir/resumed.safetensors" ||
  { echo "resumed run failed"; exit 1; }
if cmp "$dir/straight.safetensors" "$dir/resumed.safetensors"; then
  echo "resumed run is bit-identical to the uninterrupted one"
else
  echo "resumed checkpoint differs from the uninterrupted run"; exit 1
fi
