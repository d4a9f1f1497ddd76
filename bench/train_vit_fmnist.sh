#!/usr/bin/env bash
# Trains the Fashion-MNIST ViT preset from scratch for at most 15 minutes of
# training on this machine and prints the test accuracy and the time.
# Usage: bench/train_vit_fmnist.sh [extra nabla train vit options]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps >/dev/null
scripts/build >/dev/null
out=$(mktemp -d)
start=$(date +%s)
build/nabla train vit --preset fmnist --max-minutes 15 --save "$out/vit.safetensors" "$@" | tee "$out/train.log"
end=$(date +%s)
acc=$(grep -o 'final test accuracy [0-9.]*%' "$out/train.log" | tail -1)
echo
echo "fmnist preset: $acc after $((end - start)) s wall (training capped at 15 min), $(nproc) cores, $(date -u +%F)"
echo "curves: $out/vit.csv, $out/vit.svg"
