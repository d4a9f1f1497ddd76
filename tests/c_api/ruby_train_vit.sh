#!/usr/bin/env bash
# ctest ruby_ffi_train_vit: a Ruby program trains a ViT on Fashion-MNIST
# through the C API (examples/ruby/train_vit.rb: 300 steps of 64 images as
# two data-parallel replicas of 32, each block recomputed in the backward,
# at least 70% of 1,984 test images),
# saves it with timm's names, and PyTorch loads it by
# name into a timm-layout model that must compute the same logits
# (tests/c_api/ruby_vit_torch.py). MODE short (the sanitized suite, ten
# times slower): 60 steps, no accuracy bar.
# Usage: ruby_train_vit.sh RUBY path/to/libnabla.so [full|short]
set -euo pipefail
ruby=$1 lib=$2 mode=${3:-full}
steps=300 bar=0.70
[ "$mode" = short ] && steps=60 bar=0
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$ruby" "$here/../../examples/ruby/train_vit.rb" --lib "$lib" --steps $steps --threads 2 --replicas 2 --min-accuracy $bar \
  --gradient-checkpointing --save "$dir/vit.safetensors" --logits "$dir/logits.f32"
/usr/bin/python3 "$here/ruby_vit_torch.py" "$dir/vit.safetensors" "$dir/logits.f32"
