#!/usr/bin/env bash
# Whole training steps, nabla against PyTorch on the same machine in the same
# run: ViT-Tiny 224/16 batch 8, the Fashion-MNIST ViT preset at batch 128, the
# small GPT-2 preset at 8 x 256, GPT-2 124M at 4 x 64 and SmolLM2-135M's
# shape at 4 x 256, and that shape fine-tuned with LoRA (r 16 on all seven
# projections of a frozen base; PyTorch with PEFT's LoraLayer). Runs are interleaved
# (every configuration and framework once per round, REPS rounds) and each is
# its own process, so peak resident memory is its own. PyTorch runs under both
# of its good thread settings here and keeps the faster; nabla also runs on one
# thread for the scaling column, with --bf16-matmul (bf16 operands, f32
# accumulation) on two, and on two in the other memory mode: --low-memory
# (weight gradients kept as their factors where smaller), or --no-low-memory
# where that is the default (large models). Where nabla's default on two threads is two
# data-parallel replicas (small models), it also runs with one replica (every
# kernel split across the threads) for comparison. For a ViT with class-token
# pooling PyTorch also runs with its last block on the class token alone, as
# nabla's runs (--class-token-last-block), for the ratio at equal work.
# The LoRA configuration also runs in nabla's memory modes: gradient
# checkpointing, a Q8_0 GGUF base kept quantized (QLoRA; the file written
# from the same weights by `nabla export gguf --type q8_0`), and both.
# Prints markdown tables.
#
# Usage: bench/train_step.sh [REPS]     (default 3 rounds; about 15 minutes)
# Environment: CONFIGS="fmnist gpt2-small-byte" to run a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
scripts/install-deps >/dev/null
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DNABLA_BENCH=ON >/dev/null
ninja -C build nabla_bench_train nabla_cli >/dev/null
bench=build/bench/nabla_bench_train
py=/usr/bin/python3
out=$(mktemp -d)
results=$out/results.jsonl

declare -A batch=([vit-tiny]=8 [fmnist]=128 [gpt2-small-byte]=8 [gpt2]=4 [smollm2-135m]=4 [smollm2-135m-lora16]=4)
declare -A context=([vit-tiny]=0 [fmnist]=0 [gpt2-small-byte]=256 [gpt2]=64 [smollm2-135m]=256
                    [smollm2-135m-lora16]=256)
declare -A steps=([vit-tiny]=10 [fmnist]=10 [gpt2-small-byte]=10 [gpt2]=6 [smollm2-135m]=3 [smollm2-135m-lora16]=3)
configs=${CONFIGS:-vit-tiny fmnist gpt2-small-byte gpt2 smollm2-135m smollm2-135m-lora16}

# Three times each, the best kept: in some processes here OpenBLAS called from
# two threads at once ran at one thread's rate throughout.
for t in 1 2 1 2 1 2; do "$bench" --machine --threads $t >>"$results"; done
for ((r = 1; r <= reps; r++)); do
  for m in $configs; do
    echo "round $r/$reps: $m" >&2
    args=(--batch "${batch[$m]}" --steps "${steps[$m]}")
    ctx=${context[$m]}
    [[ $ctx != 0 ]] && args+=(--context "$ctx")
    model=$m
    if [[ $m == *-lora* ]]; then  # the base preset, with LoRA of the rank the name ends in
      model=${m%-lora*}
      args+=(--lora "${m##*-lora}")
    fi
    cfg=$("$bench" --model "$model" --config)
    "$bench" --model "$model" "${args[@]}" --threads 2 >>"$results"
    other_memory=--low-memory
    tail -n 1 "$results" | grep -q '"low_memory": true,' && other_memory=--no-low-memory
    if tail -n 1 "$results" | grep -q '"replicas": 1,'; then :; else
      "$bench" --model "$model" "${args[@]}" --threads 2 --replicas 1 >>"$results"
    fi
    "$bench" --model "$model" "${args[@]}" --threads 1 >>"$results"
    "$bench" --model "$model" "${args[@]}" --threads 2 --bf16-matmul >>"$results"
    # LoRA trains no base weight: no weight gradient to keep factored; its
    # memory modes instead.
    [[ $m == *-lora* ]] || "$bench" --model "$model" "${args[@]}" --threads 2 $other_memory >>"$results"
    if [[ $m == *-lora* ]]; then
      q8=$out/$model.q8_0.gguf
      if [[ ! -s $q8 ]]; then
        "$bench" --model "$model" --save "$out/$model.safetensors"
        build/nabla export gguf "$out/$model.safetensors" --type q8_0 --tokenizer byte --out "$q8" >/dev/null
        rm "$out/$model.safetensors"
      fi
      "$bench" --model "$model" "${args[@]}" --threads 2 --gradient-checkpointing >>"$results"
      "$bench" --model "$model" "${args[@]}" --threads 2 --base "$q8" >>"$results"
      "$bench" --model "$model" "${args[@]}" --threads 2 --base "$q8" --gradient-checkpointing >>"$results"
    fi
    OPENBLAS_NUM_THREADS=2 "$py" bench/peers/train_step.py --config "$cfg" "${args[@]}" --torch-threads 1 >>"$results"
    OMP_WAIT_POLICY=PASSIVE "$py" bench/peers/train_step.py --config "$cfg" "${args[@]}" --torch-threads 2 >>"$results"
    # Equal work: nabla's ViT computes a class-token model's last block on
    # the class token alone; the peer as timm writes it does not.
    if [[ $cfg == *'"global_pool":"token"'* ]]; then
      for mode in "OPENBLAS_NUM_THREADS=2 1" "OMP_WAIT_POLICY=PASSIVE 2"; do
        read -r setting threads <<<"$mode"
        env "$setting" "$py" bench/peers/train_step.py --config "$cfg" "${args[@]}" --torch-threads "$threads" \
          --class-token-last-block >>"$results"
      done
    fi
  done
done

"$py" bench/train_step_table.py "$results" "$reps"
echo "raw results: $results" >&2
