#!/bin/sh
# Smoke training on a Fashion-MNIST subset: a few hundred steps must make the
# loss fall and leave a checkpoint, a CSV log and an SVG plot that load back.
# MODE "short" (the sanitized build's: a few hundred steps there take minutes)
# runs 16 steps of the same path and leaves the learning check to the plain build.
# Usage: train_vit_smoke.sh PATH_TO_NABLA WORK_DIR [full|short]
set -u
nabla=$1 dir=$2 mode=${3:-full}
rm -rf "$dir" && mkdir -p "$dir" || exit 1
size="--train-subset 8192 --test-subset 1000 --epochs 3 --warmup 30"
[ "$mode" = short ] && size="--train-subset 512 --test-subset 200 --epochs 2 --warmup 2"
out=$("$nabla" train vit $size --batch 64 --log-every 16 --save "$dir/vit.safetensors" 2>&1) ||
  { echo "$out"; echo "nabla train vit failed"; exit 1; }
echo "$out"
echo "$out" | awk -v mode="$mode" '
  $1 == "epoch" && $5 == "loss" { if (first == "") first = $6; last = $6 }
  /test accuracy/ { acc = $0 }
  END {
    if (first == "") { print "no loss was reported"; exit 1 }
    if (mode == "full" && last + 0 >= 0.6 * first) { printf "loss did not fall enough: first %s, last %s\n", first, last; exit 1 }
    printf "loss fell from %s to %s\n", first, last
  }' || exit 1
for f in vit.safetensors vit.csv vit.svg; do
  [ -s "$dir/$f" ] || { echo "missing $dir/$f"; exit 1; }
done
# The checkpoint evaluates to the accuracy the run reported.
"$nabla" eval "$dir/vit.safetensors" || exit 1
# The checkpoint exports to GGUF (the writer itself is checked against an
# independent reader in io_gguf_js_reader).
"$nabla" export gguf "$dir/vit.safetensors" -o "$dir/vit.gguf" || exit 1
[ "$(head -c 4 "$dir/vit.gguf")" = "GGUF" ] || { echo "vit.gguf does not start with GGUF"; exit 1; }
