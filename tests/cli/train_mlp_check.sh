#!/bin/sh
# Runs `nabla train mlp --steps 300` and checks that the loss falls (the last
# reported loss below half the first) and that the model classifies fresh
# spiral points (test accuracy of at least 85%); then that a run stopped at
# step 120 and resumed ends with a checkpoint byte-identical to a straight one.
# Usage: train_mlp_check.sh PATH_TO_NABLA [WORK_DIR]
set -u
nabla=$1 dir=${2:-$(mktemp -d)}
rm -rf "$dir" && mkdir -p "$dir" || exit 1
out=$("$nabla" train mlp --steps 300 --save "$dir/straight.safetensors" 2>&1) ||
  { echo "$out"; echo "nabla train mlp failed"; exit 1; }
echo "$out"
echo "$out" | awk '
  $1 == "step" && $3 == "loss" { if (first == "") first = $4; last = $4 }
  $1 == "done:" { acc = $NF; sub("%", "", acc) }
  END {
    if (first == "") { print "no loss was reported"; exit 1 }
    if (last + 0 >= first / 2) { printf "loss did not halve: first %s, last %s\n", first, last; exit 1 }
    if (acc == "" || acc + 0 < 85) { printf "final test accuracy %s%% is below 85%%\n", acc; exit 1 }
    printf "loss fell from %s to %s; test accuracy %s%%\n", first, last, acc
  }' || exit 1
"$nabla" train mlp --steps 300 --max-steps 120 --save "$dir/part.safetensors" >/dev/null 2>&1 ||
  { echo "first half failed"; exit 1; }
"$nabla" train mlp --steps 300 --resume "$dir/part.safetensors" --save "$dir/resumed.safetensors" >/dev/null 2>&1 ||
  { echo "resumed run failed"; exit 1; }
cmp "$dir/straight.safetensors" "$dir/resumed.safetensors" ||
  { echo "resumed checkpoint differs from the uninterrupted run"; exit 1; }
echo "resumed run is bit-identical to the uninterrupted one"
