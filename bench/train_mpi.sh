#!/usr/bin/env bash
# Data parallelism over processes on this machine: the training throughput of
# 2 processes x 1 thread (mpirun) against 1 process x 1 thread at the same
# global batch, for the Fashion-MNIST ViT and gpt2-small-byte, measured in the
# same run, alternating, ROUNDS times; the medians and their ratio. Then the
# gradient reduction: how long each 2-process step waited for it after its
# backward pass with the buckets sent during the backward (the default) and
# without (NABLA_OVERLAP=0: all of it after), and so the share the overlap
# hid. (The 2-process runs sum the batch's gradient in two halves,
# so their parameters equal a 1-process run's with --replicas 2, as ctest's
# cli_train_mpi_equal checks, not those of the 1 x 1 runs.)
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

printf '%-16s %12s %12s %7s %9s %13s %13s %7s\n' model "1 x 1" "2 x 1" ratio "MiB/step" "after, no ovl" "after, ovl" hidden
for model in vit gpt2; do
  if [ $model = vit ]; then
    cmd=(train vit --preset fmnist --max-steps 100 --test-subset 100 --replicas 1 --threads 1) name="fmnist ViT" unit=img/s
  else
    cmd=(train gpt2 --preset gpt2-small-byte --max-steps 12 --eval-batches 1 --threads 1) name=gpt2-small-byte unit=tok/s
  fi
  for ((r = 1; r <= rounds; r++)); do
    build/nabla "${cmd[@]}" >"$out/$model-one-$r.log" 2>&1
    "${mpi[@]}" build/nabla "${cmd[@]}" >"$out/$model-two-$r.log" 2>&1
    NABLA_OVERLAP=0 "${mpi[@]}" -x NABLA_OVERLAP build/nabla "${cmd[@]}" >"$out/$model-after-$r.log" 2>&1
  done
  one=$(for f in "$out/$model"-one-*.log; do rate "$f"; done | median)
  two=$(for f in "$out/$model"-two-*.log; do rate "$f"; done | median)
  waited() { for f in "$out/$model-$1"-*.log; do sed -n 's/.*, \([0-9.]*\) ms of it after the backward.*/\1/p' "$f"; done | median; }
  with=$(waited two) without=$(waited after)
  mib=$(sed -n 's/^gradient reduction: \([0-9.]*\) MiB.*/\1/p' "$out/$model-two-1.log")
  printf '%-16s %6.0f %s %6.0f %s %6.2fx %9s %10.1f ms %10.1f ms %6.0f%%\n' "$name" "$one" $unit "$two" $unit \
    "$(awk -v a="$two" -v b="$one" 'BEGIN {print a / b}')" "$mib" "$without" "$with" \
    "$(awk -v a="$with" -v b="$without" 'BEGIN {print 100 * (1 - a / b)}')"
  echo "  rounds (1 x 1 / 2 x 1 $unit):" $(for ((r = 1; r <= rounds; r++)); do
    echo "$(rate "$out/$model-one-$r.log")/$(rate "$out/$model-two-$r.log")"; done)
done
echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(date -u +%F)," \
  "commit $(git rev-parse --short HEAD); logs in $out"
