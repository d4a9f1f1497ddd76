#!/bin/sh
# Smoke training of a small byte-level Llama (2 blocks, width 128, 4 query
# and 2 key/value heads, context 64) on the fortunes: 300 steps must make the
# training loss fall and bring the validation loss below 3.0 nats, under the
# text's byte unigram entropy (3.32). A run stopped at step 40 and resumed
# ends with a checkpoint byte-identical to a straight one (these three with
# gradient checkpointing). With "resume-only"
# (the sanitized build, where 300 steps take minutes) only the resume check
# runs, on 20 steps. Then greedy sampling from the checkpoint and from its
# GGUF export must print the same text.
# Usage: train_llama_smoke.sh PATH_TO_NABLA WORK_DIR [resume-only]
set -u
nabla=$1 dir=$2 mode=${3:-full}
rm -rf "$dir" && mkdir -p "$dir" || exit 1
shape="--layers 2 --heads 4 --kv-heads 2 --width 128 --positions 64 --context 64 --batch 8 --threads 2"
steps=80 half=40
if [ "$mode" = resume-only ]; then
  steps=20 half=10
else
  # shellcheck disable=SC2086
  out=$("$nabla" train llama $shape --steps 300 --warmup 20 --lr 3e-3 --log-every 25 --eval-every 100 \
        --eval-batches 8 --save "$dir/llama.safetensors" 2>&1) || { echo "$out"; echo "nabla train llama failed"; exit 1; }
  echo "$out"
  echo "$out" | awk -f "$(dirname "$0")/lm_losses.awk" || exit 1
fi
# shellcheck disable=SC2086
"$nabla" train llama $shape --gradient-checkpointing --steps $steps --eval-every $half --eval-batches 2 \
  --save "$dir/straight.safetensors" \
  >/dev/null 2>&1 || { echo "straight run failed"; exit 1; }
# shellcheck disable=SC2086
"$nabla" train llama $shape --gradient-checkpointing --steps $steps --eval-every $half --eval-batches 2 --max-steps $half \
  --save "$dir/part.safetensors" >/dev/null 2>&1 || { echo "first half failed"; exit 1; }
# shellcheck disable=SC2086
"$nabla" train llama $shape --gradient-checkpointing --steps $steps --eval-every $half --eval-batches 2 \
  --resume "$dir/part.safetensors" \
  --save "$dir/resumed.safetensors" >/dev/null 2>&1 || { echo "resumed run failed"; exit 1; }
cmp "$dir/straight.safetensors" "$dir/resumed.safetensors" ||
  { echo "resumed checkpoint differs from the uninterrupted run"; exit 1; }
echo "resumed run is bit-identical to the uninterrupted one"
# Sampling from the checkpoint, and from its GGUF export: the same greedy
# text (one decoding step, key/value caches).
"$nabla" export gguf "$dir/straight.safetensors" -o "$dir/straight.gguf" >/dev/null || { echo "export gguf failed"; exit 1; }
for ckpt in straight.safetensors straight.gguf; do
  "$nabla" sample --checkpoint "$dir/$ckpt" --prompt "The " --tokens 24 --temperature 0 >"$dir/$ckpt.txt" ||
    { echo "nabla sample failed on $ckpt"; exit 1; }
done
[ "$(wc -c <"$dir/straight.safetensors.txt")" -gt 24 ] || { echo "sample printed too little"; exit 1; }
cmp "$dir/straight.safetensors.txt" "$dir/straight.gguf.txt" ||
  { echo "greedy samples differ between the checkpoint and its GGUF export"; exit 1; }
echo "sampled: $(cat "$dir/straight.safetensors.txt")"
# A model trained with a BPE tokenizer of nabla's (tokenizer.json): the
# checkpoint keeps a copy beside it and names that, its GGUF export carries
# it, and sampling from either prints the same text; the Hugging Face export
# writes it beside the weights; the checkpoint moved with its tokenizer, the
# original deleted, samples the same.
fortunes=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort | head -n 3)
# shellcheck disable=SC2086
cat $fortunes | head -n 3000 >"$dir/text.txt"
"$nabla" tokenizer train --text "$dir/text.txt" --vocab-size 400 --pattern qwen2 -o "$dir/bpe.json" >/dev/null ||
  { echo "tokenizer train failed"; exit 1; }
# shellcheck disable=SC2086
"$nabla" train llama $shape --steps 4 --eval-every 4 --eval-batches 1 --text "$dir/text.txt" \
  --tokenizer "$dir/bpe.json" --save "$dir/bpe.safetensors" >/dev/null 2>&1 || { echo "train with --tokenizer failed"; exit 1; }
"$nabla" export gguf "$dir/bpe.safetensors" -o "$dir/bpe.gguf" >/dev/null || { echo "export gguf (bpe) failed"; exit 1; }
"$nabla" export hf "$dir/bpe.safetensors" -o "$dir/bpe_hf" >/dev/null || { echo "export hf (bpe) failed"; exit 1; }
cmp -s "$dir/bpe.json" "$dir/bpe_hf/tokenizer.json" || { echo "the HF folder's tokenizer.json is not the trained one"; exit 1; }
for ckpt in bpe.safetensors bpe.gguf bpe_hf; do
  "$nabla" sample --checkpoint "$dir/$ckpt" --prompt "The cat" --tokens 12 --temperature 0 >"$dir/$ckpt.txt" ||
    { echo "nabla sample failed on $ckpt"; exit 1; }
done
cmp "$dir/bpe.safetensors.txt" "$dir/bpe.gguf.txt" && cmp "$dir/bpe.safetensors.txt" "$dir/bpe_hf.txt" ||
  { echo "greedy samples differ between the BPE checkpoint, its GGUF and its folder"; exit 1; }
cmp -s "$dir/bpe.json" "$dir/bpe.tokenizer.json" || { echo "no copy of the tokenizer beside the checkpoint"; exit 1; }
# Generation ends at the end-of-text token: a model fully fine-tuned to
# answer and end there stops after its answer; --ignore-eos runs on. (The
# samples run from another folder than the checkpoint's.)
for i in 1 2 3 4 5 6 7 8; do echo '{"prompt": "Say hi: ", "completion": "hi there"}'; done >"$dir/hi.jsonl"
"$nabla" train llama --layers 2 --width 64 --heads 4 --kv-heads 2 --positions 64 --steps 0 --tokenizer "$dir/bpe.json" \
  --save "$dir/hi_base.safetensors" >/dev/null 2>&1 || { echo "making the BPE base failed"; exit 1; }
"$nabla" finetune --base "$dir/hi_base.safetensors" --data "$dir/hi.jsonl" --full --context 32 --batch 4 --epochs 30 \
  --lr 1e-2 --save "$dir/hi" >/dev/null 2>&1 || { echo "finetune --full on the BPE base failed"; exit 1; }
# The fine-tuned folder stands alone: the base's tokenizer is in it.
cmp -s "$dir/bpe.json" "$dir/hi/tokenizer.json" || { echo "finetune --full wrote no tokenizer.json"; exit 1; }
hi=$("$nabla" sample --checkpoint "$dir/hi" --prompt "Say hi: " --tokens 20 --temperature 0 --timings 2>&1)
[ "$(echo "$hi" | head -n 1)" = "Say hi: hi there" ] &&
  echo "$hi" | grep -q "^generation: 4 tokens, .*stopped at the end of text$" ||
  { echo "sample did not stop at the end of text: $hi"; exit 1; }
"$nabla" sample --checkpoint "$dir/hi" --prompt "Say hi: " --tokens 20 --temperature 0 --timings --ignore-eos 2>&1 |
  grep -q "^generation: 20 tokens" || { echo "sample --ignore-eos stopped early"; exit 1; }
mkdir -p "$dir/moved"
mv "$dir/bpe.safetensors" "$dir/bpe.tokenizer.json" "$dir/moved/"
mv "$dir/bpe.json" "$dir/bpe.json.away"
"$nabla" sample --checkpoint "$dir/moved/bpe.safetensors" --prompt "The cat" --tokens 12 --temperature 0 \
  >"$dir/moved.txt" || { echo "nabla sample failed on the moved checkpoint"; exit 1; }
cmp "$dir/bpe.safetensors.txt" "$dir/moved.txt" || { echo "the moved checkpoint samples other text"; exit 1; }
echo "sampled with the trained BPE: $(cat "$dir/bpe.safetensors.txt")"
