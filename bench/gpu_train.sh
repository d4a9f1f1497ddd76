#!/usr/bin/env bash
# Whole training steps on an NVIDIA GPU, nabla's cuda backend against
# PyTorch eager (f32, its defaults: no TF32 in matmuls; attention through
# F.scaled_dot_product_attention, as timm and Hugging Face run it) in the same run:
# ViT-Tiny 224/16 at batch 256 and GPT-2 124M at 16 x 1024 tokens. Runs are
# interleaved (each framework once per round, REPS rounds), each its own
# process, so peak GPU memory is its own: nabla's is what its backend held
# (arena, leaves, scratch), PyTorch's torch.cuda.max_memory_allocated.
# Each in f32 and then in bf16: nabla's --bf16-matmul (products and
# attention on tensor cores, f32 activations) against PyTorch under
# torch.autocast(bfloat16) (bf16 activations too), mixed precision as its
# users train.
# Prints one markdown table: the median step rate of each, their ratio, and
# peak GPU memory.
#
# Usage: bench/gpu_train.sh [REPS]      (default 3; about 10 minutes on an H100)
# Environment: NABLA_BENCH_BIN (default build/bench/nabla_bench_train),
# PYTHON (default python3), CONFIGS="vit-tiny gpt2" and PRECISIONS="f32 bf16"
# for subsets. Raw results go to $OUT/gpu_train.jsonl as they come, where
# OUT is set (the device tool's folder).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
bench=${NABLA_BENCH_BIN:-build/bench/nabla_bench_train}
py=${PYTHON:-python3}
out=$(mktemp -d)
results=${OUT:+$OUT/gpu_train.jsonl}
results=${results:-$out/results.jsonl}
declare -A batch=([vit-tiny]=256 [gpt2]=16)
declare -A context=([vit-tiny]=0 [gpt2]=1024)
configs=${CONFIGS:-vit-tiny gpt2}
precisions=${PRECISIONS:-f32 bf16}
declare -A nabla_flag=([f32]="" [bf16]="--bf16-matmul") torch_flag=([f32]="" [bf16]="--bf16")
tag() { sed "s/^{/{\"precision\": \"$1\", /"; }  # labels a result line
for p in $precisions; do
  for r in $(seq "$reps"); do
    for c in $configs; do
      { "$bench" --model "$c" --batch "${batch[$c]}" --context "${context[$c]}" --steps 10 --warmup 3 \
          --backend cuda ${nabla_flag[$p]} || echo "{\"framework\": \"nabla\", \"model\": \"$c\", \"failed\": true}"
      } | tag "$p" >>"$results"
      config=$("$bench" --model "$c" --config)
      { "$py" bench/peers/train_step.py --config "$config" --batch "${batch[$c]}" \
          --context "${context[$c]}" --steps 10 --warmup 3 --device cuda ${torch_flag[$p]} ||
          echo "{\"framework\": \"torch\", \"model\": \"$c\", \"failed\": true}"
      } | tag "$p" >>"$results"
    done
  done
done
"$py" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| model | precision | unit | nabla /s | PyTorch /s | ratio (rounds) | nabla GPU MiB | PyTorch GPU MiB |")
print("|---|---|---|---|---|---|---|---|")
for prec, model in dict.fromkeys((r["precision"], r["model"].split("-lora")[0]) for r in rows):
    mine = [r for r in rows if r["model"] == model and r["precision"] == prec and not r.get("failed")]
    n = [r for r in mine if r["framework"] == "nabla"]
    t = [r for r in mine if r["framework"] == "torch"]
    if not n or not t:
        print(f"| {model} | {prec} | failed: nabla {len(n)} runs, torch {len(t)} runs |")
        continue
    ratios = sorted(a["per_s"] / b["per_s"] for a, b in zip(n, t))
    print(f"| {model} | {prec} | {n[0]['unit']} | {statistics.median(r['per_s'] for r in n):,.0f} | "
          f"{statistics.median(r['per_s'] for r in t):,.0f} | {statistics.median(ratios):.2f}x "
          f"({ratios[0]:.2f}-{ratios[-1]:.2f}) | {max(r['peak_device_mib'] for r in n):,.0f} | "
          f"{max(r['peak_device_mib'] for r in t):,.0f} |")
PY
