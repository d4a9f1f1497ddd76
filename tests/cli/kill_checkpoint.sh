#!/usr/bin/env bash
# Crash safety of checkpoints: a ViT training run that saves every 2 steps is
# killed with SIGKILL at a random moment, ITERATIONS times, each run resuming
# from the checkpoint the previous one left. After every kill the checkpoint
# must load completely (config, weights, optimizer moments, position: a
# resume that takes no step), its step must never go back, and at most one
# temporary of the killed writer may be left beside it (the next save removes
# it). Finally `nabla eval` reads the last checkpoint.
# Usage: kill_checkpoint.sh PATH_TO_NABLA WORK_DIR [ITERATIONS]   (default 100)
set -u
nabla=$1 dir=$2 iterations=${3:-100}
rm -rf "$dir" && mkdir -p "$dir" || exit 1
ck="$dir/ck.safetensors"
common=(train vit --preset fmnist --depth 1 --embed-dim 32 --heads 2 --train-subset 512 --test-subset 32
        --batch 16 --epochs 100000 --warmup 5 --threads 1 --log-every 100000 --save-every 2)

# A first checkpoint (step 2) to resume from.
"$nabla" "${common[@]}" --max-steps 2 --save "$ck" >"$dir/first.log" 2>&1 ||
  { cat "$dir/first.log"; echo "the first run failed"; exit 1; }

last_step=0 saved=0 left=0
for ((i = 1; i <= iterations; i++)); do
  "$nabla" "${common[@]}" --resume "$ck" --save "$ck" >"$dir/run.log" 2>&1 &
  pid=$!
  # 0.2 to 2.2 s: from start-up (loading the data) to several saves.
  delay_ms=$((200 + $(od -An -N2 -tu2 /dev/urandom) % 2000))
  sleep "$((delay_ms / 1000)).$(printf '%03d' $((delay_ms % 1000)))"
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  status=$?
  if [ "$status" -ne 137 ]; then
    cat "$dir/run.log"; echo "iteration $i: the training run ended with status $status before it was killed"; exit 1
  fi

  # The checkpoint loads completely: a resume that stops before taking a step.
  if ! "$nabla" "${common[@]}" --resume "$ck" --max-steps 1 >"$dir/check.log" 2>&1; then
    cat "$dir/check.log"; echo "iteration $i (killed after ${delay_ms} ms): the checkpoint does not load"; exit 1
  fi
  step=$(sed -n 's/^resumed from .* at step \([0-9]*\) .*/\1/p' "$dir/check.log")
  if [ -z "$step" ] || [ "$step" -lt "$last_step" ]; then
    cat "$dir/check.log"; echo "iteration $i: checkpoint step '$step' after step $last_step"; exit 1
  fi
  [ "$step" -gt "$last_step" ] && saved=$((saved + 1))
  last_step=$step
  temporaries=$(find "$dir" -name 'ck.safetensors.tmp-*' | wc -l)
  if [ "$temporaries" -gt 1 ]; then
    ls -l "$dir"; echo "iteration $i: $temporaries temporaries beside the checkpoint"; exit 1
  fi
  left=$((left + temporaries))
done
"$nabla" eval "$ck" >"$dir/eval.log" 2>&1 || { cat "$dir/eval.log"; echo "nabla eval of the last checkpoint failed"; exit 1; }
echo "$iterations kills: the checkpoint always loaded; it advanced in $saved of them, to step $last_step;" \
     "$left kills left a temporary, each removed by the next save"
