#!/usr/bin/env bash
# Training over processes (mpirun), one case per call:
#   equal     N processes of R replicas write checkpoints byte-identical to one
#             process of N x R replicas (ViT with 2, 3 and 2x2; GPT-2 with
#             dropout; Llama with gradient checkpointing; LoRA fine-tuning,
#             whose losses also match one replica's, each row's tokens
#             weighted alike)
#   resume    a run saved by 2 processes resumes in 1 (and the reverse), ending
#             where an uninterrupted run does
#   shard     --shard-optimizer (ZeRO-1) writes the same checkpoints as without
#             (moments gathered), and its runs resume over 4, 2 and 1 processes
#             (4 replicas in all), ending where one uninterrupted run does
#   mismatch  ranks started with other seeds, options or data fail before the
#             first step, naming what differs; a command without distributed
#             training refuses to run under mpirun
#   kill      a rank killed with SIGKILL mid-run ends the job within 60 s,
#             with a message naming the lost rank; the last checkpoint resumes
#   backend   processes on a backend with memory of its own (the CUDA
#             kernels under the emulator): LoRA fine-tuning over 2 logs the
#             losses it logs over 2 on the CPU; --shard-optimizer is refused
#             there, saying why
# Usage: train_mpi.sh PATH_TO_NABLA WORK_DIR CASE
set -u
nabla=$1 dir=$2 case=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1
# Root in containers and CI; more ranks than cores; shared memory between them.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe --bind-to none --mca btl self,vader)
vit=(train vit --preset fmnist --test-subset 100 --batch 24 --warmup 3 --dropout 0.1 --log-every 100
     --train-subset 960)

fail() { echo "$case: $*"; exit 1; }
# A tiny Llama base and prompt/completion, chat and text lines to fine-tune it on.
make_finetune_data() {
  "$nabla" train llama --layers 2 --width 64 --heads 4 --kv-heads 2 --positions 64 --steps 0 \
    --save "$dir/base.safetensors" >/dev/null 2>&1 || fail "making the base"
  for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
    echo "{\"prompt\": \"What is $i plus $i? \", \"completion\": \"$((i + i)).\"}"
    echo "{\"messages\": [{\"role\": \"user\", \"content\": \"Say $i\"}, {\"role\": \"assistant\", \"content\": \"$i\"}]}"
    echo "{\"text\": \"Fortune $i favours the prepared mind.\"}"
  done >"$dir/data.jsonl"
  ft=(--base "$dir/base.safetensors" --data "$dir/data.jsonl" --context 64 --batch 4 --epochs 2 --lora-r 4)
}
same() {  # same A B WHAT
  cmp "$1" "$2" >/dev/null || fail "$3: the checkpoints differ"
  echo "$3: byte-identical"
}

case $case in
equal)
  "${mpi[@]}" -np 2 "$nabla" "${vit[@]}" --max-steps 12 --replicas 1 --threads 1 --save "$dir/p2.safetensors" \
    >"$dir/p2.log" 2>&1 || { cat "$dir/p2.log"; fail "2 processes failed"; }
  "$nabla" "${vit[@]}" --max-steps 12 --replicas 2 --threads 2 --save "$dir/r2.safetensors" >"$dir/r2.log" 2>&1 ||
    { cat "$dir/r2.log"; fail "2 replicas failed"; }
  same "$dir/p2.safetensors" "$dir/r2.safetensors" "ViT, 2 processes x 1 replica vs 1 process x 2 replicas"
  grep -q "MPI (.*), 2 processes on 1 host" "$dir/p2.log" || { cat "$dir/p2.log"; fail "the banner does not name the job"; }
  # Three terms per element: the fold's order shows in the bits.
  "${mpi[@]}" -np 3 "$nabla" "${vit[@]}" --max-steps 6 --replicas 1 --threads 1 --save "$dir/p3.safetensors" \
    >"$dir/p3.log" 2>&1 || { cat "$dir/p3.log"; fail "3 processes failed"; }
  "$nabla" "${vit[@]}" --max-steps 6 --replicas 3 --threads 1 --save "$dir/r3.safetensors" >/dev/null 2>&1 ||
    fail "3 replicas failed"
  same "$dir/p3.safetensors" "$dir/r3.safetensors" "ViT, 3 processes vs 3 replicas"
  "${mpi[@]}" -np 2 "$nabla" "${vit[@]}" --max-steps 6 --replicas 2 --threads 1 --save "$dir/p2r2.safetensors" \
    >/dev/null 2>&1 || fail "2 processes x 2 replicas failed"
  "$nabla" "${vit[@]}" --max-steps 6 --replicas 4 --threads 2 --save "$dir/r4.safetensors" >/dev/null 2>&1 ||
    fail "4 replicas failed"
  same "$dir/p2r2.safetensors" "$dir/r4.safetensors" "ViT, 2 processes x 2 replicas vs 4 replicas"
  lm=(--max-steps 6 --context 32 --batch 4 --eval-batches 2 --log-every 100)
  "${mpi[@]}" -np 2 "$nabla" train gpt2 "${lm[@]}" --dropout 0.1 --threads 1 --save "$dir/g2.safetensors" \
    >"$dir/g2.log" 2>&1 || { cat "$dir/g2.log"; fail "GPT-2 over 2 processes failed"; }
  "$nabla" train gpt2 "${lm[@]}" --dropout 0.1 --replicas 2 --threads 2 --save "$dir/g1.safetensors" >/dev/null 2>&1 ||
    fail "GPT-2 with 2 replicas failed"
  same "$dir/g2.safetensors" "$dir/g1.safetensors" "GPT-2 with dropout, 2 processes vs 2 replicas"
  "${mpi[@]}" -np 2 "$nabla" train llama "${lm[@]}" --gradient-checkpointing --threads 1 --save "$dir/l2.safetensors" \
    >"$dir/l2.log" 2>&1 || { cat "$dir/l2.log"; fail "Llama over 2 processes failed"; }
  "$nabla" train llama "${lm[@]}" --gradient-checkpointing --replicas 2 --threads 2 --save "$dir/l1.safetensors" \
    >/dev/null 2>&1 || fail "Llama with 2 replicas failed"
  same "$dir/l2.safetensors" "$dir/l1.safetensors" "Llama with gradient checkpointing, 2 processes vs 2 replicas"
  make_finetune_data
  "${mpi[@]}" -np 2 "$nabla" finetune "${ft[@]}" --threads 1 --save "$dir/f2" >"$dir/f2.log" 2>&1 ||
    { cat "$dir/f2.log"; fail "fine-tuning over 2 processes failed"; }
  "$nabla" finetune "${ft[@]}" --replicas 2 --threads 2 --save "$dir/f1" >/dev/null 2>&1 || fail "fine-tuning, 2 replicas"
  for f in adapter_model.safetensors training_state.safetensors; do same "$dir/f2/$f" "$dir/f1/$f" "LoRA $f"; done
  # Without dropout, one replica's losses are the same to rounding: each
  # replica's rows weighted by their own counted tokens.
  "$nabla" finetune "${ft[@]}" --lora-dropout 0 --lr 1e-2 --threads 1 --save "$dir/g1" --log-every 1 >/dev/null 2>&1 ||
    fail "fine-tuning, 1 replica"
  "${mpi[@]}" -np 2 "$nabla" finetune "${ft[@]}" --lora-dropout 0 --lr 1e-2 --threads 1 --save "$dir/g2" \
    --log-every 1 >/dev/null 2>&1 || fail "fine-tuning over 2 processes without dropout"
  paste -d, "$dir/g1.csv" "$dir/g2.csv" | awk -F, 'NR > 1 && NR <= 6 {
      d = $3 - $(NF / 2 + 3); if (d < 0) d = -d
      if (d > 1e-5 * $3) { print "step " $1 ": loss " $3 " (1 replica) vs " $(NF / 2 + 3); bad = 1 } }
      END { exit bad }' || fail "fine-tuning losses differ from one replica's"
  echo "LoRA over 2 processes: the first 5 steps' losses match one replica's to 1e-5"
  ;;
resume)
  "$nabla" "${vit[@]}" --max-steps 14 --replicas 2 --threads 2 --save "$dir/straight.safetensors" >/dev/null 2>&1 ||
    fail "the uninterrupted run failed"
  "${mpi[@]}" -np 2 "$nabla" "${vit[@]}" --max-steps 5 --threads 1 --save "$dir/a.safetensors" >/dev/null 2>&1 ||
    fail "the first part (2 processes) failed"
  "$nabla" "${vit[@]}" --max-steps 10 --replicas 2 --threads 2 --resume "$dir/a.safetensors" \
    --save "$dir/b.safetensors" >"$dir/b.log" 2>&1 || { cat "$dir/b.log"; fail "resuming in 1 process failed"; }
  "${mpi[@]}" -np 2 "$nabla" "${vit[@]}" --max-steps 14 --threads 1 --resume "$dir/b.safetensors" \
    --save "$dir/c.safetensors" >"$dir/c.log" 2>&1 || { cat "$dir/c.log"; fail "resuming in 2 processes failed"; }
  grep -q "resumed from .* at step 10" "$dir/c.log" || { cat "$dir/c.log"; fail "no resume message"; }
  same "$dir/c.safetensors" "$dir/straight.safetensors" "2 processes, then 1, then 2 again, vs one run"
  ;;
shard)
  "${mpi[@]}" -np 2 "$nabla" "${vit[@]}" --max-steps 12 --threads 1 --shard-optimizer --save "$dir/s2.safetensors" \
    >"$dir/s2.log" 2>&1 || { cat "$dir/s2.log"; fail "2 sharded processes failed"; }
  grep -q "optimizer state sharded" "$dir/s2.log" || { cat "$dir/s2.log"; fail "the banner does not say sharded"; }
  "${mpi[@]}" -np 2 "$nabla" "${vit[@]}" --max-steps 12 --threads 1 --save "$dir/u2.safetensors" >/dev/null 2>&1 ||
    fail "2 processes failed"
  same "$dir/s2.safetensors" "$dir/u2.safetensors" "ViT over 2 processes, sharded vs not"
  "${mpi[@]}" -np 3 "$nabla" "${vit[@]}" --max-steps 6 --threads 1 --shard-optimizer --save "$dir/s3.safetensors" \
    >/dev/null 2>&1 || fail "3 sharded processes failed"
  "$nabla" "${vit[@]}" --max-steps 6 --replicas 3 --threads 1 --save "$dir/r3.safetensors" >/dev/null 2>&1 ||
    fail "3 replicas failed"
  same "$dir/s3.safetensors" "$dir/r3.safetensors" "ViT over 3 sharded processes vs 3 replicas"
  "$nabla" "${vit[@]}" --max-steps 14 --replicas 4 --threads 2 --save "$dir/straight.safetensors" >/dev/null 2>&1 ||
    fail "the uninterrupted run failed"
  "${mpi[@]}" -np 4 "$nabla" "${vit[@]}" --max-steps 5 --threads 1 --shard-optimizer --save "$dir/a.safetensors" \
    >/dev/null 2>&1 || fail "the first part (4 sharded processes) failed"
  "${mpi[@]}" -np 2 "$nabla" "${vit[@]}" --max-steps 10 --replicas 2 --threads 1 --shard-optimizer \
    --resume "$dir/a.safetensors" --save "$dir/b.safetensors" >"$dir/b.log" 2>&1 ||
    { cat "$dir/b.log"; fail "resuming over 2 sharded processes failed"; }
  "$nabla" "${vit[@]}" --max-steps 14 --replicas 4 --threads 2 --resume "$dir/b.safetensors" \
    --save "$dir/c.safetensors" >/dev/null 2>&1 || fail "resuming in 1 process failed"
  same "$dir/c.safetensors" "$dir/straight.safetensors" "4 sharded processes, then 2, then 1, vs one run"
  make_finetune_data
  "${mpi[@]}" -np 2 "$nabla" finetune "${ft[@]}" --pad --grad-accum 2 --threads 1 --shard-optimizer --save "$dir/f2" \
    >"$dir/f2.log" 2>&1 || { cat "$dir/f2.log"; fail "sharded fine-tuning failed"; }
  "$nabla" finetune "${ft[@]}" --pad --grad-accum 2 --replicas 2 --threads 2 --save "$dir/f1" >/dev/null 2>&1 ||
    fail "fine-tuning, 2 replicas"
  for f in adapter_model.safetensors training_state.safetensors; do
    same "$dir/f2/$f" "$dir/f1/$f" "LoRA, padded, 2 micro-batches, sharded: $f"
  done
  ;;
mismatch)
  expect_refused() {  # WHAT PATTERN, after a run that wrote $dir/m.log with status $status
    [ "$status" -ne 0 ] || { cat "$dir/m.log"; fail "$1: the job succeeded"; }
    grep -q "$2" "$dir/m.log" || { cat "$dir/m.log"; fail "$1: no message matching '$2'"; }
    if grep -q "^epoch 1/.* step\|step [0-9]*/[0-9]* loss" "$dir/m.log"; then
      cat "$dir/m.log"; fail "$1: a step ran before the error"
    fi
    echo "$1: refused ($(grep -m1 "$2" "$dir/m.log"))"
  }
  one=("$nabla" "${vit[@]:0:$((${#vit[@]} - 2))}" --max-steps 4 --threads 1 --train-subset 960)
  "${mpi[@]}" -np 1 "${one[@]}" --seed 1 : -np 1 "${one[@]}" --seed 2 >"$dir/m.log" 2>&1; status=$?
  expect_refused "other seeds" "disagree on the parameters' values"
  "${mpi[@]}" -np 1 "${one[@]}" --lr 1e-3 : -np 1 "${one[@]}" --lr 2e-3 >"$dir/m.log" 2>&1; status=$?
  expect_refused "other learning rates" "disagree on the training options"
  "${mpi[@]}" -np 1 "${one[@]:0:$((${#one[@]} - 1))}" 960 : -np 1 "${one[@]:0:$((${#one[@]} - 1))}" 480 \
    >"$dir/m.log" 2>&1; status=$?
  expect_refused "other data" "disagree on the training data"
  "${mpi[@]}" -np 1 "${one[@]}" --replicas 1 : -np 1 "${one[@]}" --replicas 2 >"$dir/m.log" 2>&1; status=$?
  expect_refused "other replica counts" "disagree on"
  "${mpi[@]}" -np 2 "$nabla" train mlp --steps 5 >"$dir/m.log" 2>&1; status=$?
  expect_refused "train mlp" "runs train vit, gpt2, llama and finetune"
  ;;
kill)
  ck="$dir/ck.safetensors"
  "${mpi[@]}" -np 2 "$nabla" "${vit[@]}" --epochs 100000 --threads 1 --shard-optimizer --save-every 4 --save "$ck" \
    >"$dir/run.log" 2>&1 &
  job=$!
  start=$SECONDS
  while [ ! -e "$ck" ] && [ $((SECONDS - start)) -lt 60 ]; do sleep 0.1; done
  [ -e "$ck" ] || { kill -KILL $job; cat "$dir/run.log"; fail "no checkpoint after 60 s"; }
  sleep 0.5
  # Rank 1: the process whose environment says so.
  victim=""
  for pid in $(pgrep -f -- "--save $ck"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$pid; fi
  done
  [ -n "$victim" ] || { kill -KILL $job; fail "rank 1's process not found"; }
  kill -KILL "$victim"
  start=$SECONDS
  while kill -0 $job 2>/dev/null && [ $((SECONDS - start)) -lt 70 ]; do sleep 0.1; done
  if kill -0 $job 2>/dev/null; then
    pkill -KILL -f -- "--save $ck"; kill -KILL $job; fail "the job still ran 70 s after rank 1 was killed"
  fi
  wait $job; status=$?
  took=$((SECONDS - start))
  [ "$status" -ne 0 ] || { cat "$dir/run.log"; fail "the job exited 0 after losing rank 1"; }
  [ "$took" -le 60 ] || fail "the job took $took s to end"
  grep -q "rank 1" "$dir/run.log" || { cat "$dir/run.log"; fail "no message names rank 1"; }
  pgrep -f -- "--save $ck" >/dev/null && { pkill -KILL -f -- "--save $ck"; fail "a rank outlived the job"; }
  echo "rank 1 killed: the job ended in ${took} s with status $status: $(grep -m1 'rank 1' "$dir/run.log")"
  step=$("$nabla" "${vit[@]}" --threads 1 --resume "$ck" --max-steps 1 2>&1 | sed -n 's/^resumed from .* at step \([0-9]*\) .*/\1/p')
  [ -n "$step" ] || fail "the last checkpoint does not load"
  "${mpi[@]}" -np 2 "$nabla" "${vit[@]}" --epochs 100000 --threads 1 --shard-optimizer --resume "$ck" \
    --max-steps $((step + 2)) \
    --save "$dir/resumed.safetensors" >"$dir/resumed.log" 2>&1 || { cat "$dir/resumed.log"; fail "the resume failed"; }
  grep -q "resumed from .* at step $step" "$dir/resumed.log" || { cat "$dir/resumed.log"; fail "no resume message"; }
  echo "the checkpoint of step $step resumed over 2 processes"
  ;;
backend)
  make_finetune_data
  for b in cpu cuda-emulated; do
    "${mpi[@]}" -np 2 "$nabla" finetune "${ft[@]}" --threads 1 --log-every 1 --backend "$b" --save "$dir/ft_$b" \
      >"$dir/ft_$b.log" 2>&1 || { cat "$dir/ft_$b.log"; fail "2 processes on $b failed"; }
  done
  agree=$(awk -f "$(dirname "$0")/close_losses.awk" "$dir/ft_cpu.log" "$dir/ft_cuda-emulated.log") ||
    { echo "$agree"; fail "LoRA over 2 processes on cuda-emulated: not the cpu's losses"; }
  echo "LoRA over 2 processes on cuda-emulated: the cpu's ($agree)"
  "${mpi[@]}" -np 2 "$nabla" finetune "${ft[@]}" --threads 1 --backend cuda-emulated --shard-optimizer \
    --save "$dir/sharded" >"$dir/sharded.log" 2>&1 && fail "--shard-optimizer ran on cuda-emulated"
  grep -q "a sharded optimizer updates its part on the host" "$dir/sharded.log" ||
    { cat "$dir/sharded.log"; fail "--shard-optimizer on cuda-emulated: no reason given"; }
  echo "--shard-optimizer on cuda-emulated is refused, saying why"
  ;;
*)
  fail "unknown case"
  ;;
esac
