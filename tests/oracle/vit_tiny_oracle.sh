#!/bin/sh
# nabla against PyTorch on the full vit-tiny preset (timm's vit_tiny_patch16_224:
# 224/16, 12 blocks, width 192, 1000 classes) at batch 2: loss and all 152
# parameter gradients, against torch in f32 (the gate) and f64 (the figures
# that say which side is off). Not in CI: it repeats what oracle_vit_torch
# checks, at vit-tiny's size (10 s to a minute on two cores, and more while other
# jobs compete for them). Usage: tests/oracle/vit_tiny_oracle.sh [NABLA_BIN]
set -eu
here=$(dirname "$0")
nabla=${1:-$here/../../build/nabla}
exec /usr/bin/python3 "$here/vit_oracle.py" "$nabla" --preset vit-tiny --batch 2 --no-loader
