#!/usr/bin/env bash
# Trains the Fashion-MNIST ViT preset from scratch for at most 15 minutes of
# training on this machine and prints the test accuracy and the time. The
# recipe is `nabla train vit`'s defaults (36 epochs, label smoothing 0.1,
# random erasing 0.25, horizontal flips), with bf16 matmuls where the CPU has
# avx512_bf16 (f32 otherwise, or with PRECISION=f32).
# Usage: [PRECISION=f32] bench/train_vit_fmnist.sh [extra nabla train vit options]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps >/dev/null
scripts/build >/dev/null
out=$(mktemp -d)
precision=() label=f32
if [[ ${PRECISION:-auto} != f32 ]] && grep -qw avx512_bf16 /proc/cpuinfo; then
  precision=(--bf16-matmul) label=bf16
fi
start=$(date +%s)
build/nabla train vit --preset fmnist --max-minutes 15 "${precision[@]}" --save "$out/vit.safetensors" "$@" |
  tee "$out/train.log"
end=$(date +%s)
acc=$(grep -o 'final test accuracy [0-9.]*%' "$out/train.log" | tail -1)
trained=$(grep -o '^done: .*)' "$out/train.log" | tail -1)
echo
echo "fmnist preset: $acc; $trained; $((end - start)) s wall (training capped at 15 min)," \
  "matmul $label, $(nproc) cores, $(date -u +%F)"
echo "curves: $out/vit.csv, $out/vit.svg"
