#!/bin/sh
# `nabla train --backend B` for a backend with memory of its own (reference,
# cuda-emulated, cuda): the whole training step (forward, backward, clip,
# AdamW) there through the CLI. The MLP learns the spirals (test accuracy of
# at least 85%, as on the CPU) and a run stopped and resumed there ends with
# a checkpoint byte-identical to a straight one; a small GPT-2 and ViT take
# a few steps with finite losses, the GPT-2 greedily samples there the text
# it samples on the CPU, and QLoRA fine-tuning with gradient accumulation
# logs the CPU's losses. MODE short (the sanitized suite, where 300 MLP
# steps take a minute and the reference backend's fine-tuning 20 s an
# epoch): 60 steps, resumed at 24, no accuracy bar; two fine-tuning epochs.
# Usage: train_backend.sh PATH_TO_NABLA WORK_DIR BACKEND [full|short]
# Exits 77 (skipped) when BACKEND cannot run here (cuda without a GPU).
set -u
nabla=$1 dir=$2 backend=$3 mode=${4:-full}
steps=300 stop=120 bar=85 epochs=3
[ "$mode" = short ] && steps=60 stop=24 bar=0 epochs=2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
if ! why=$("$nabla" train mlp --backend "$backend" --steps 1 2>&1); then
  case $why in
    *"no CUDA device"*|*"this build has no 'cuda' backend"*) echo "skipped: $why"; exit 77 ;;
  esac
fi
out=$("$nabla" train mlp --backend "$backend" --steps $steps --save "$dir/straight.safetensors" 2>&1) ||
  { echo "$out"; echo "nabla train mlp --backend $backend failed"; exit 1; }
echo "$out" | tail -n 3
echo "$out" | awk -v backend="$backend" -v bar=$bar '
  $1 == "done:" { acc = $NF; sub("%", "", acc) }
  END {
    if (acc == "" || acc + 0 < bar) { printf "final test accuracy %s%% is below %s%%\n", acc, bar; exit 1 }
    printf "%s backend: test accuracy %s%%\n", backend, acc
  }' || exit 1
"$nabla" train mlp --backend "$backend" --steps $steps --max-steps $stop --save "$dir/part.safetensors" >/dev/null 2>&1 ||
  { echo "first half failed"; exit 1; }
"$nabla" train mlp --backend "$backend" --steps $steps --resume "$dir/part.safetensors" \
  --save "$dir/resumed.safetensors" >/dev/null 2>&1 || { echo "resumed run failed"; exit 1; }
cmp "$dir/straight.safetensors" "$dir/resumed.safetensors" ||
  { echo "resumed checkpoint differs from the uninterrupted run"; exit 1; }
echo "resumed run is bit-identical to the uninterrupted one"
out=$("$nabla" train gpt2 --backend "$backend" --layers 1 --heads 2 --width 32 --positions 32 --context 32 \
      --batch 2 --steps 4 --warmup 1 --eval-batches 1 --log-every 1 --save "$dir/gpt2.safetensors" 2>&1) ||
  { echo "$out"; echo "nabla train gpt2 --backend $backend failed"; exit 1; }
echo "$out" | grep -q "step 4/4 loss [0-9]" || { echo "$out"; echo "no finite loss at step 4"; exit 1; }
out=$("$nabla" train vit --backend "$backend" --depth 1 --embed-dim 32 --heads 2 --batch 8 --max-steps 3 \
      --train-subset 64 --test-subset 32 --eval-batch 32 --log-every 1 2>&1) ||
  { echo "$out"; echo "nabla train vit --backend $backend failed"; exit 1; }
echo "$out" | grep -q "step 3/[0-9]* loss [0-9]" || { echo "$out"; echo "no finite loss at step 3"; exit 1; }
echo "gpt2 and vit train on the $backend backend"
cpu=$("$nabla" sample --checkpoint "$dir/gpt2.safetensors" --prompt "The " --tokens 12 --temperature 0 2>&1) ||
  { echo "$cpu"; echo "sampling on the cpu failed"; exit 1; }
other=$("$nabla" sample --checkpoint "$dir/gpt2.safetensors" --prompt "The " --tokens 12 --temperature 0 \
        --backend "$backend" 2>&1) || { echo "$other"; echo "sampling on $backend failed"; exit 1; }
[ "$cpu" = "$other" ] || { printf 'greedy samples differ:\ncpu: %s\n%s: %s\n' "$cpu" "$backend" "$other"; exit 1; }
echo "greedy sample on $backend: the cpu's"

# QLoRA fine-tuning there with gradient accumulation (micro-batches summed on
# the backend): a Q8_0 GGUF base, LoRA adapters; every step's loss and the
# final validation loss are the CPU's within 2e-4 (the log's 4 decimals).
"$nabla" train llama --layers 1 --width 32 --heads 4 --kv-heads 2 --positions 64 --steps 0 \
  --save "$dir/llama.safetensors" >/dev/null 2>&1 || { echo "making the llama base failed"; exit 1; }
"$nabla" export gguf "$dir/llama.safetensors" --type q8_0 --out "$dir/llama.q8_0.gguf" >/dev/null ||
  { echo "export gguf q8_0 failed"; exit 1; }
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18; do
  echo "{\"prompt\": \"What is $i plus $i? \", \"completion\": \"$((i + i)).\"}"
done > "$dir/data.jsonl"
for b in cpu "$backend"; do
  "$nabla" finetune --base "$dir/llama.q8_0.gguf" --data "$dir/data.jsonl" --context 64 --batch 2 --grad-accum 2 \
    --epochs $epochs --lora-r 4 --lr 1e-2 --log-every 1 --backend "$b" --save "$dir/finetune_$b" > "$dir/finetune_$b.log" 2>&1 ||
    { cat "$dir/finetune_$b.log"; echo "nabla finetune --backend $b failed"; exit 1; }
done
agree=$(awk -f "$(dirname "$0")/close_losses.awk" "$dir/finetune_cpu.log" "$dir/finetune_$backend.log") ||
  { echo "$agree"; echo "fine-tuning on $backend: not the cpu's losses"; exit 1; }
grep -q "x 2 accumulated" "$dir/finetune_$backend.log" || { echo "no accumulation"; exit 1; }
echo "QLoRA fine-tuning with accumulation on $backend: the cpu's losses ($agree)"
