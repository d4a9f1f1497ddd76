#!/bin/sh
# Resume equivalence for GPT-2: a 40-step run stopped at step 17 (--max-steps;
# the schedule still spans 40 steps) and resumed to step 40 ends with a
# checkpoint byte-identical to an uninterrupted 40-step run (weights,
# optimizer moments, position), with warmup, the cosine schedule and dropout.
# Usage: train_gpt2_resume.sh PATH_TO_NABLA WORK_DIR
set -u
nabla=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
common="--layers 2 --heads 4 --width 32 --positions 32 --context 32 --batch 4 --steps 40 --warmup 5 --dropout 0.1
        --eval-every 10 --eval-batches 2 --threads 2"
"$nabla" train gpt2 $common --save "$dir/straight.safetensors" >/dev/null 2>&1 ||
  { echo "uninterrupted run failed"; exit 1; }
"$nabla" train gpt2 $common --max-steps 17 --save "$dir/part.safetensors" >/dev/null 2>&1 ||
  { echo "first part failed"; exit 1; }
"$nabla" train gpt2 $common --resume "$dir/part.safetensors" --save "$dir/resumed.safetensors" ||
  { echo "resumed run failed"; exit 1; }
if cmp "$dir/straight.safetensors" "$dir/resumed.safetensors"; then
  echo "resumed run is bit-identical to the uninterrupted one"
else
  echo "resumed checkpoint differs from the uninterrupted run"; exit 1
fi
