#!/bin/sh
# nabla against PyTorch on the full gpt2 preset (Hugging Face's gpt2, 124M:
# 12 blocks, width 768, 50257 tokens) at batch 4 x context 64: loss and all
# 148 parameter gradients against torch in f32 (the gate) and f64, and the
# losses of the first 3 AdamW steps on that batch. Then 20 training steps of
# `nabla train gpt2 --preset gpt2` at 4 x 64 on the fortunes (GPT-2's
# tokenizer when scripts/fetch-gpt2-vocab has installed its vocabulary, else
# bytes) must make the loss fall. Not in CI: it repeats what oracle_gpt2_torch
# checks, at 124M's size (about 6 minutes on two busy cores).
# Usage: tests/oracle/gpt2_124m_oracle.sh [NABLA_BIN [WORK_DIR]]
set -eu
here=$(dirname "$0")
nabla=${1:-$here/../../build/nabla}
dir=${2:-${TMPDIR:-/tmp}/nabla_gpt2_124m}
rm -rf "$dir" && mkdir -p "$dir"

/usr/bin/python3 "$here/gpt2_oracle.py" "$nabla" --preset gpt2 --batch 4 --context 64 --adamw-steps 3 --lr 1e-4 \
  --threads 2 --no-loader

if printf 'hello\n' | "$nabla" tokenize --tokenizer gpt2 >/dev/null 2>&1; then tok=gpt2; else tok=byte; fi
steps=20
out=$("$nabla" train gpt2 --preset gpt2 --tokenizer "$tok" --batch 4 --context 64 --steps $steps --warmup 5 \
      --lr 3e-4 --log-every 1 --eval-every $steps --eval-batches 4 --save "$dir/gpt2.safetensors" 2>&1) ||
  { echo "$out"; echo "nabla train gpt2 failed"; exit 1; }
echo "$out"
# Progress lines: "step 7/20 loss 9.1234 1234 tok/s lr ...", one per step.
echo "$out" | awk -v steps=$steps -v tokens=256 '
  $1 == "step" && $3 == "loss" { if (first == "") first = $4; last = $4; rate = $5 }
  END {
    if (first == "") { print "no loss was reported"; exit 1 }
    printf "training loss: step 1 %s, step %d %s; %.2f s per step (%s tokens/s over the run)\n", first, steps, last,
           tokens / rate, rate
    if (last + 0 >= first - 1.0) { print "the loss did not fall by 1 nat"; exit 1 }
  }'
