#!/usr/bin/env bash
# nabla against PyTorch training the same GPT-2 on the same text for the same
# wall-clock budget of training (validation excluded on both sides): the
# small byte-level preset on Debian's fortunes, identical initial weights
# (nabla's step-0 checkpoint, loaded by PyTorch), identical token streams and
# batches, identical AdamW, clipping, schedule and validation windows. Prints
# both runs' final validation losses, then a sample from nabla's model.
#
# Usage: bench/train_gpt2_vs_torch.sh [MINUTES] [STEPS]
#   MINUTES: training budget for each framework (default 15)
#   STEPS:   schedule length (default 2000; each run stops at the budget
#            or at STEPS, whichever comes first)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-15}
steps=${2:-2000}
scripts/install-deps >/dev/null
scripts/build >/dev/null
nabla=build/nabla
py=/usr/bin/python3
out=$(mktemp -d)
common=(--preset gpt2-small-byte --batch 8 --context 256 --lr 1e-3 --warmup 100 --weight-decay 0.1 --clip 1
        --seed 1 --eval-every 250 --eval-batches 16)

"$nabla" tokenize --tokenizer byte --dataset-out "$out/tokens.safetensors"
"$nabla" train gpt2 "${common[@]}" --steps 0 --save "$out/init.safetensors" >/dev/null

echo "== nabla (${minutes} min)"
"$nabla" train gpt2 "${common[@]}" --steps "$steps" --max-minutes "$minutes" --threads 2 \
  --save "$out/nabla.safetensors" | tee "$out/nabla.log" | grep -E "validation|done|GPT-2"
echo "== PyTorch (${minutes} min; best thread setting: 1 torch thread, OPENBLAS_NUM_THREADS=2)"
OPENBLAS_NUM_THREADS=2 "$py" bench/peers/train_gpt2.py --init "$out/init.safetensors" --data "$out/tokens.safetensors" \
  --steps "$steps" --max-minutes "$minutes" --batch 8 --context 256 --lr 1e-3 --warmup 100 --weight-decay 0.1 \
  --clip 1 --seed 1 --eval-every 250 --eval-batches 16 --csv "$out/torch.csv" | tee "$out/torch.log" |
  grep -E "validation|done"

nabla_final=$(grep -o 'final validation loss [0-9.]*' "$out/nabla.log" | tail -1 | awk '{print $4}')
torch_final=$(grep -o 'final validation loss [0-9.]*' "$out/torch.log" | tail -1 | awk '{print $4}')
nabla_steps=$(grep -o '^done: [0-9]* steps' "$out/nabla.log" | awk '{print $2}')
torch_steps=$(grep -o '^torch done: [0-9]* steps' "$out/torch.log" | awk '{print $3}')
echo
echo "after ${minutes} min of training on $(nproc) cores, $(date -u +%F):"
echo "  nabla:   validation loss $nabla_final after $nabla_steps steps"
echo "  PyTorch: validation loss $torch_final after $torch_steps steps"
echo
echo "== nabla sample"
"$nabla" sample --checkpoint "$out/nabla.safetensors" --prompt "The " --tokens 300 --seed 1
echo
echo "logs and curves: $out (nabla.csv, nabla.svg, torch.csv)"
