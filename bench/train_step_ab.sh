#!/usr/bin/env bash
# Interleaved A/B of two nabla_bench_train binaries (say, the commit before a
# change and after it) on bench/train_step.sh's four configurations at two
# threads: PAIRS pairs each, the order alternating within a pair. Prints the
# median step of each side, the median and range of the pairs' differences,
# and whether both sides computed the same losses (a change that should not
# alter the arithmetic must say true).
#
# Usage: bench/train_step_ab.sh BASELINE_BENCH NEW_BENCH [PAIRS]   (default 5; about 5 minutes on 2 cores)
# Build the baseline with: git worktree add /tmp/base REV && cmake -S /tmp/base -B /tmp/base/build -G Ninja
#   -DCMAKE_BUILD_TYPE=Release && ninja -C /tmp/base/build nabla_bench_train
# Environment: CONFIGS="fmnist gpt2-small-byte" to run a subset.
set -euo pipefail
a=$1 b=$2 pairs=${3:-5}
out=$(mktemp)
declare -A args=([vit-tiny]="--batch 8 --steps 10" [fmnist]="--batch 128 --steps 10"
                 [gpt2-small-byte]="--batch 8 --context 256 --steps 10" [gpt2]="--batch 4 --context 64 --steps 6")
for ((p = 1; p <= pairs; p++)); do
  for m in ${CONFIGS:-vit-tiny fmnist gpt2-small-byte gpt2}; do
    order="A B"
    ((p % 2)) || order="B A"
    for side in $order; do
      bin=$a
      [[ $side == B ]] && bin=$b
      echo "round $p/$pairs: $m $side" >&2
      # shellcheck disable=SC2086
      echo "{\"pair\": $p, \"side\": \"$side\", \"run\": $("$bin" --model "$m" ${args[$m]} --threads 2)}" >>"$out"
    done
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics as st, sys
by = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    by.setdefault(r["run"]["model"], {}).setdefault(r["pair"], {})[r["side"]] = r["run"]
print("| config | A step ms (median, range) | B step ms | B - A, median of pairs | pairs' range | same losses |")
print("|---|---|---|---|---|---|")
for model, pairs in by.items():
    full = [p for p in pairs.values() if "A" in p and "B" in p]
    a = [p["A"]["step_ms"] for p in full]
    b = [p["B"]["step_ms"] for p in full]
    d = [y - x for x, y in zip(a, b)]
    same = all(p["A"]["first_loss"] == p["B"]["first_loss"] and p["A"]["last_loss"] == p["B"]["last_loss"] for p in full)
    print(f"| {model} | {st.median(a):.1f} ({min(a):.1f}-{max(a):.1f}) | {st.median(b):.1f} ({min(b):.1f}-{max(b):.1f}) "
          f"| {st.median(d):+.1f} ({100 * st.median(d) / st.median(a):+.1f}%) | {min(d):+.1f} to {max(d):+.1f} | {same} |")
PY
rm -f "$out"
