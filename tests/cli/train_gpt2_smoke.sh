#!/bin/sh
# Smoke training of a small byte-level GPT-2 (2 blocks, width 64, context 64)
# on the fortunes: 300 steps must make the training loss fall and bring the
# validation loss below 3.0 nats, under the text's byte unigram entropy (3.32):
# the model uses context. The run leaves a checkpoint, a CSV log and an SVG
# plot, and `nabla sample` generates from the checkpoint.
# Usage: train_gpt2_smoke.sh PATH_TO_NABLA WORK_DIR
set -u
nabla=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
out=$("$nabla" train gpt2 --layers 2 --heads 4 --width 64 --positions 64 --context 64 --batch 8 --steps 300 \
      --warmup 20 --lr 3e-3 --log-every 25 --eval-every 100 --eval-batches 8 --threads 2 \
      --save "$dir/gpt2.safetensors" 2>&1) || { echo "$out"; echo "nabla train gpt2 failed"; exit 1; }
echo "$out"
echo "$out" | awk -f "$(dirname "$0")/lm_losses.awk" || exit 1
for f in gpt2.safetensors gpt2.csv gpt2.svg; do
  [ -s "$dir/$f" ] || { echo "missing $dir/$f"; exit 1; }
done
text=$("$nabla" sample --checkpoint "$dir/gpt2.safetensors" --prompt "The " --tokens 60 --seed 3) ||
  { echo "nabla sample failed"; exit 1; }
printf 'sample: %s\n' "$text"
[ ${#text} -gt 20 ] || { echo "nabla sample printed too little"; exit 1; }
