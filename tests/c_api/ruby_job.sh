#!/usr/bin/env bash
# ctest ruby_ffi_job: Ruby programs train over two processes that mpirun
# starts, through the C API's jobs (nabla_job_*, NABLA_TRAIN_JOB,
# NABLA_FINETUNE_JOB), and get what one process gets with as many replicas,
# bit for bit:
#   - examples/ruby/train_vit.rb: 1 process x 4 replicas = 2 processes x 2
#     replicas = the same with the AdamW moments sharded; also stopped at step
#     20, checkpointed (nabla_trainer_save: rank 0 writes the gathered
#     moments) and resumed in a new job (each process loads its part);
#   - examples/ruby/finetune.rb (LoRA with dropout: each replica its own
#     masks): 1 process x 2 replicas = 2 processes, PEFT folder and GGUF;
#   - processes that build different steps stop with an error naming what
#     differs; a checkpoint one process cannot read fails the load on both,
#     a batch one process refuses fails the step on both, and so does a run
#     that fails on one.
# Usage: ruby_job.sh RUBY MPIRUN path/to/libnabla.so path/to/nabla
set -euo pipefail
ruby=$1 mpirun=$2 lib=$3 nabla=$4
here=$(cd "$(dirname "$0")" && pwd)
examples=$here/../../examples/ruby
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpi=("$mpirun" --oversubscribe --bind-to none --mca btl self,vader)

same() {
  cmp "$1" "$2" || { echo "$3: $1 and $2 differ"; exit 1; }
}

vit=("$ruby" "$examples/train_vit.rb" --lib "$lib" --steps 40 --batch 32)
"${vit[@]}" --threads 2 --replicas 4 --save "$dir/alone.safetensors" >"$dir/alone.log"
"${mpi[@]}" -np 2 "${vit[@]}" --threads 1 --replicas 2 --job --save "$dir/job.safetensors" >"$dir/job.log"
cat "$dir/job.log"
same "$dir/alone.safetensors" "$dir/job.safetensors" "ViT, 2 processes x 2 replicas vs 1 x 4"
# The losses, gradient norms and the accuracy (each process evaluates its
# share of the test images; nabla_job_sum adds the counts) are the same too.
diff <(grep -E '^step|^test accuracy' "$dir/alone.log" | sed 's/ after .*//') \
     <(grep -E '^step|^test accuracy' "$dir/job.log" | sed 's/ after .*//')
"${mpi[@]}" -np 2 "${vit[@]}" --threads 1 --replicas 2 --job --shard-optimizer --max-steps 20 \
  --checkpoint "$dir/half.safetensors" >/dev/null
"${mpi[@]}" -np 2 "${vit[@]}" --threads 1 --replicas 2 --job --shard-optimizer --resume "$dir/half.safetensors" \
  --save "$dir/resumed.safetensors" >/dev/null
same "$dir/alone.safetensors" "$dir/resumed.safetensors" "ViT, sharded moments, stopped at step 20 and resumed"
echo "ViT: 2 processes (moments whole or sharded, resumed or not) = 1 process, bit for bit"

# A small Llama to fine-tune, and prompt / completion pairs of uneven length.
"$nabla" train llama --layers 2 --width 64 --heads 4 --kv-heads 2 --positions 64 --context 64 --steps 30 \
  --lr 3e-3 --eval-every 30 --eval-batches 1 --save "$dir/base.safetensors" >/dev/null
for i in $(seq 1 8); do
  echo "{\"prompt\": \"Q$i: \", \"completion\": \"answer $((i * 7))$(printf '%*s' "$i" '' | tr ' ' '!')\"}"
done >"$dir/pairs.jsonl"
ft=("$ruby" "$examples/finetune.rb" --lib "$lib" --base "$dir/base.safetensors" --data "$dir/pairs.jsonl"
    --steps 20 --batch 4 --context 32 --lr 1e-2 --threads 1 --lora-dropout 0.1)
"${ft[@]}" --replicas 2 --save "$dir/alone_adapter" --gguf "$dir/alone.gguf" >/dev/null
"${mpi[@]}" -np 2 "${ft[@]}" --job --save "$dir/job_adapter" --gguf "$dir/job.gguf"
same "$dir/alone_adapter/adapter_model.safetensors" "$dir/job_adapter/adapter_model.safetensors" "LoRA, PEFT folder"
same "$dir/alone.gguf" "$dir/job.gguf" "LoRA, GGUF adapter"
echo "LoRA: 2 processes = 1 process x 2 replicas, bit for bit"
# A batch one process refuses: every process gets an error and none takes
# the step (none waits for the other); the job goes on.
"${mpi[@]}" -np 2 "$ruby" -e '
require_relative ARGV[0]
Nabla.load(ARGV[1])
job = Nabla::Job.new
ft = Nabla::Finetune.new(ARGV[2], lora_r: 4, batch: 2, context: 8, threads: 1, job: job)
ids = Array.new(ft.batch * ft.context, 1)
bad = ids.dup
bad[3] = ft.vocab if job.rank == 1
begin
  ft.step(bad, ids, lr: 1e-3)
  abort "rank #{job.rank}: the step was taken"
rescue Nabla::Error => e
  puts "rank #{job.rank}: #{e.message}"
end
ft.step(ids, ids, lr: 1e-3)
puts "rank #{job.rank}: the next step was taken"' "$examples/nabla.rb" "$lib" "$dir/base.safetensors" >"$dir/refused.log"
grep -q "rank 0: nabla_finetune_step: rank 1 refused its batch or arguments; no process took the step" "$dir/refused.log" &&
  grep -q "rank 1: nabla_finetune_step: element 3 holds id" "$dir/refused.log" &&
  [ "$(grep -c "the next step was taken" "$dir/refused.log")" = 2 ] || { cat "$dir/refused.log"; exit 1; }
# A run that fails on one process (a label out of range, found by the loss
# in the middle of the step): every process gets an error, none counts the
# run (none waits for the other), and the job goes on.
"${mpi[@]}" -np 2 "$ruby" -e '
require_relative ARGV[0]
Nabla.load(ARGV[1])
job = Nabla::Job.new
ctx = Nabla::Context.new
x = ctx.tensor([4, 3], Array.new(12) { |i| i * 0.1 })
labels = ctx.tensor([4], [0, 1, 2, 0], dtype: Nabla::I32)
w = ctx.parameter([3, 3], Array.new(9) { |i| (i % 4) * 0.1 })
trainer = Nabla::Trainer.new(ctx, ctx.op(:cross_entropy, ctx.op(:matmul_add, x, w, ctx.parameter([3], [0.0] * 3)), labels, -100), threads: 1, job: job)
ctx.write(labels, [0, 1, 7, 0]) if job.rank == 1
begin
  trainer.run
  abort "rank #{job.rank}: the run went on"
rescue Nabla::Error => e
  puts "rank #{job.rank}: #{e.message}"
end
begin
  trainer.update(0.1)
  abort "rank #{job.rank}: the failed run was counted"
rescue Nabla::Error => e
  puts "rank #{job.rank}: #{e.message}"
end
ctx.write(labels, [0, 1, 2, 0])
loss = trainer.run
trainer.update(0.1)
puts "rank #{job.rank}: loss #{loss.round(6)}, the next step was taken"' \
  "$examples/nabla.rb" "$lib" >"$dir/failed_run.log"
grep -q "rank 0: train step: the run failed on rank 1 (its error says why); no rank counts it" \
  "$dir/failed_run.log" && grep -q "rank 1: cross_entropy: label 7 at row 2 is out of range" "$dir/failed_run.log" &&
  [ "$(grep -c "update() before any run()" "$dir/failed_run.log")" = 2 ] &&
  [ "$(grep "the next step was taken" "$dir/failed_run.log" | sed 's/rank .: //' | sort -u | wc -l)" = 1 ] &&
  [ "$(grep -c "the next step was taken" "$dir/failed_run.log")" = 2 ] || { cat "$dir/failed_run.log"; exit 1; }

# Processes that disagree stop, saying on what.
if "${mpi[@]}" -np 1 "${vit[@]}" --threads 1 --replicas 2 --job : -np 1 "${vit[@]}" --threads 1 --replicas 1 --job \
  >"$dir/mismatch.log" 2>&1; then
  echo "processes with different replica counts trained"; exit 1
fi
grep -q "the processes disagree on the training step's options" "$dir/mismatch.log" ||
  { cat "$dir/mismatch.log"; exit 1; }
# A checkpoint rank 1 cannot read: the load fails on both, naming the file.
if "${mpi[@]}" -np 1 "${vit[@]}" --threads 1 --job --resume "$dir/half.safetensors" : \
  -np 1 "${vit[@]}" --threads 1 --job --resume "$dir/missing.safetensors" >"$dir/missing.log" 2>&1; then
  echo "a checkpoint missing on rank 1 was loaded"; exit 1
fi
grep -q "missing.safetensors" "$dir/missing.log" && grep -q "rank 1 could not read the checkpoint it names; nothing was changed" "$dir/missing.log" ||
  { cat "$dir/missing.log"; exit 1; }
echo "mismatched processes, an unreadable checkpoint, a refused batch: errors naming what, on every process"
