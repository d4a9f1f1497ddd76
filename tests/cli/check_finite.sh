#!/bin/sh
# --check-finite on the training commands: an absurd learning rate makes the
# weights overflow, and the run must stop at the first op that produced NaN
# or Inf, naming the op, its graph position and its inputs' shapes, with
# exit status 2 and that one line on stderr.
# Usage: check_finite.sh PATH_TO_NABLA WORK_DIR
set -u
nabla=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1

check() {  # NAME COMMAND...
  name=$1; shift
  "$@" >"$dir/$name.out" 2>"$dir/$name.err"
  status=$?
  err=$(grep -v '^epoch\|^step' "$dir/$name.err")
  echo "$name: exit status $status; $err"
  [ "$status" -eq 2 ] || { cat "$dir/$name.out" "$dir/$name.err"; echo "FAIL: $name: expected exit status 2"; exit 1; }
  [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || { echo "FAIL: $name: expected one error line"; exit 1; }
  # nabla: error: check_finite: 'OP' at graph position N produced NaN|Inf at element E of [SHAPE]; inputs: f32[...] (OP), ...
  printf '%s\n' "$err" | grep -Eq "^nabla: error: check_finite: '[a-z_0-9]+' at graph position [0-9]+ produced (NaN|Inf) at element [0-9]+ of \[[0-9, ]*\]; inputs: [a-z0-9]+\[[0-9, ]*\] \([a-z_0-9]+\)" ||
    { echo "FAIL: $name: the message does not name the op, its position and its inputs"; exit 1; }
}

check mlp "$nabla" train mlp --steps 300 --lr 1e38 --check-finite
# NABLA_CHECK_FINITE=1 does the same as the flag.
check mlp_env env NABLA_CHECK_FINITE=1 "$nabla" train mlp --steps 300 --lr 1e38
check vit "$nabla" train vit --train-subset 256 --test-subset 16 --batch 16 --depth 1 --embed-dim 16 --heads 2 \
    --threads 1 --lr 1e38 --warmup 0 --max-steps 50 --check-finite
# No false alarm on a healthy run whose graph holds masked (-inf) attention
# scores: GPT-2's causal attention.
i=0
while [ $i -lt 200 ]; do echo "line $i of a short text for a tiny model"; i=$((i + 1)); done >"$dir/text.txt"
"$nabla" train gpt2 --text "$dir/text.txt" --steps 2 --batch 1 --context 8 --eval-batches 1 --threads 1 \
    --check-finite >"$dir/gpt2.out" 2>&1 || { cat "$dir/gpt2.out"; echo "FAIL: a healthy GPT-2 run stopped"; exit 1; }
echo "every run stopped at the first non-finite op; the healthy run did not"
