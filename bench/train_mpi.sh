#!/usr/bin/env bash
# Data parallelism over processes on this machine: the training throughput of
# 2 processes x 1 thread (mpirun) against 1 process x 1 thread at the same
# global batch, for the Fashion-MNIST ViT and gpt2-small-byte, measured in the
# same run, alternating, ROUNDS times; the medians and their ratio, and the
# communication each step of the 2-process runs did and hid behind its
# backward pass. Both runs of a round end with the same parameters (checked).
# Usage: bench/train_mpi.sh [ROUNDS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
scripts/install-deps >/dev/null
scripts/build >/dev/null
out=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe --bind-to none --mca btl self,vader -np 2)

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
rate() { sed -n 's/^done: .*(\([0-9.]*\) [a-z]*\/s).*/\1/p' "$1"; }

printf '%-16s %12s %12s %7s %11s %9s %8s\n' model "1 x 1" "2 x 1" ratio "comm/step" hidden "MiB"
for model in vit gpt2; do
  if [ $model = vit ]; then
    cmd=(train vit --preset fmnist --max-steps 100 --test-subset 100 --replicas 1 --threads 1) name="fmnist ViT" unit=img/s
  else
    cmd=(train gpt2 --preset gpt2-small-byte --max-steps 12 --eval-batches 1 --threads 1) name=gpt2-small-byte unit=tok/s
  fi
  for ((r = 1; r <= rounds; r++)); do
    build/nabla "${cmd[@]}" --save "$out/one.safetensors" >"$out/$model-one-$r.log" 2>&1
    "${mpi[@]}" build/nabla "${cmd[@]}" --save "$out/two.safetensors" >"$out/$model-two-$r.log" 2>&1
    cmp -s "$out/one.safetensors" "$out/two.safetensors" || { echo "$model round $r: the parameters differ"; exit 1; }
  done
  one=$(for f in "$out/$model"-one-*.log; do rate "$f"; done | median)
  two=$(for f in "$out/$model"-two-*.log; do rate "$f"; done | median)
  comm=$(for f in "$out/$model"-two-*.log; do sed -n 's/^communication: \([0-9.]*\) ms.*/\1/p' "$f"; done | median)
  hidden=$(for f in "$out/$model"-two-*.log; do sed -n 's/.*, \([0-9]*\)% of it hidden.*/\1/p' "$f"; done | median)
  mib=$(sed -n 's/.*to reduce \([0-9.]*\) MiB.*/\1/p' "$out/$model-two-1.log")
  printf '%-16s %6.0f %s %6.0f %s %6.2fx %8.1f ms %8s%% %8s\n' "$name" "$one" $unit "$two" $unit \
    "$(awk -v a="$two" -v b="$one" 'BEGIN {print a / b}')" "$comm" "$hidden" "$mib"
  echo "  rounds (1 x 1 / 2 x 1 $unit):" $(for ((r = 1; r <= rounds; r++)); do
    echo "$(rate "$out/$model-one-$r.log")/$(rate "$out/$model-two-$r.log")"; done)
done
echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%F)," \
  "commit $(git rev-parse --short HEAD); logs in $out"
