#!/bin/sh
# Runs `nabla train mlp --steps 300` and checks that the loss falls: the last
# reported loss must be below half the first.
# Usage: train_mlp_check.sh PATH_TO_NABLA
set -u
out=$("$1" train mlp --steps 300) || { echo "nabla train mlp failed"; exit 1; }
echo "$out"
echo "$out" | awk '
  $1 == "step" && $3 == "loss" { if (first == "") first = $4; last = $4 }
  END {
    if (first == "") { print "no loss was reported"; exit 1 }
    if (last + 0 >= first / 2) { printf "loss did not halve: first %s, last %s\n", first, last; exit 1 }
    printf "loss fell from %s to %s\n", first, last
  }'
