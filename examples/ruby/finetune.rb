#!/usr/bin/env ruby
# Fine-tunes a Llama-family model with LoRA from Ruby through nabla's C API:
# examples from a JSONL file in `nabla finetune`'s forms (text, prompt /
# completion, chat messages in the base's template), tokenized and labelled
# as nabla finetune does, one a row (padded), the loss where the labels
# count; the adapter saved as a PEFT folder and as llama.cpp's adapter GGUF.
#
#   ruby examples/ruby/finetune.rb --lib build/libnabla.so --base MODEL --data pairs.jsonl \
#     --steps 100 --save adapter [--gguf adapter.gguf] [--gradient-checkpointing] [--ask '{"prompt": "Q: "}']
#
# --ask LINE prints the trained model's greedy reply to a data line (a
# prompt, or messages ending with the user's), generated in the process.
# --replicas R splits each batch among R copies of the model, one per thread;
# under mpirun, --job splits it among the processes too (each takes its rows
# of every batch), with the result one process with as many replicas gives,
# bit for bit. Rank 0 prints and saves.
require "optparse"
require_relative "nabla"

opt = { lib: nil, steps: 100, batch: 4, context: 128, lr: 1e-3, r: 8, alpha: 16.0, threads: 0, min_drop: 0.0 }
OptionParser.new do |o|
  o.on("--lib PATH", "libnabla.so (default: the installed one)") { |v| opt[:lib] = v }
  o.on("--base MODEL", "Hugging Face folder, GGUF or nabla checkpoint") { |v| opt[:base] = v }
  o.on("--data FILE", "JSONL of {\"text\"}, {\"prompt\", \"completion\"} or {\"messages\"}") { |v| opt[:data] = v }
  o.on("--chat-template NAME", "for messages (default: the base's own)") { |v| opt[:chat_template] = v }
  o.on("--steps N", Integer) { |v| opt[:steps] = v }
  o.on("--batch N", Integer) { |v| opt[:batch] = v }
  o.on("--context N", Integer) { |v| opt[:context] = v }
  o.on("--lr X", Float) { |v| opt[:lr] = v }
  o.on("--lora-r N", Integer) { |v| opt[:r] = v }
  o.on("--lora-alpha X", Float) { |v| opt[:alpha] = v }
  o.on("--threads N", Integer) { |v| opt[:threads] = v }
  o.on("--lora-dropout P", Float) { |v| opt[:dropout] = v }
  o.on("--dora", "weight-decomposed adapters (PEFT's use_dora)") { opt[:dora] = true }
  o.on("--replicas N", Integer, "data-parallel copies in this process") { |v| opt[:replicas] = v }
  o.on("--job", "train over the processes mpirun started") { opt[:job] = true }
  o.on("--shard-optimizer", "with --job: each process holds its part of the AdamW moments") { opt[:shard] = true }
  o.on("--gradient-checkpointing", "recompute activations in the backward: less memory") { opt[:checkpointing] = true }
  o.on("--save DIR", "PEFT adapter folder to write") { |v| opt[:save] = v }
  o.on("--gguf PATH", "llama.cpp adapter GGUF to write") { |v| opt[:gguf] = v }
  o.on("--min-drop X", Float, "fail unless the loss falls by this fraction") { |v| opt[:min_drop] = v }
  o.on("--ask LINE", "after training, print the greedy reply to this data line") { |v| opt[:ask] = v }
  o.on("--ask-tokens N", Integer, "the reply's length at most (default 64)") { |v| opt[:ask_tokens] = v }
end.parse!
abort "finetune.rb: --base and --data are required" unless opt[:base] && opt[:data]

opt[:lib] ? Nabla.load(opt[:lib]) : Nabla.load
job = opt[:job] ? Nabla::Job.new : nil
rank = job ? job.rank : 0
say = ->(line) { puts line if rank.zero? }
ft = Nabla::Finetune.new(opt[:base], lora_r: opt[:r], lora_alpha: opt[:alpha], lora_dropout: opt[:dropout] || 0.0,
                                     batch: opt[:batch], context: opt[:context], threads: opt[:threads],
                                     gradient_checkpointing: opt[:checkpointing] || false,
                                     replicas: opt[:replicas] || 1, job: job, shard_optimizer: opt[:shard] || false,
                                     dora: opt[:dora] || false)
say.call "#{opt[:dora] ? 'DoRA' : 'LoRA'} r #{opt[:r]} on #{opt[:base]}: #{ft.trained} parameters train; #{opt[:batch]} x #{ft.context} " \
         "tokens a step#{job ? " (#{ft.batch} rows in each process; #{job.description})" : ''}"

# Each line's ids and labels (-100 where the loss does not count), cut to a row.
pairs = File.readlines(opt[:data], chomp: true).reject(&:empty?).each_with_index.map do |line, i|
  ids, labels = ft.example(line, chat_template: opt[:chat_template])
  [ids.first(ft.context), labels.first(ft.context)]
rescue Nabla::Error => e
  abort "#{opt[:data]}:#{i + 1}: #{e.message}"
end
say.call "#{pairs.size} examples from #{opt[:data]}"

rows = ft.batch * ft.context
first = last = nil
opt[:steps].times do |step|
  ids, labels = Array.new(rows, 0), Array.new(rows, -100)
  # This process's rows of the step's batch.
  ft.batch.times do |r|
    pid, plabels = pairs[(step * opt[:batch] + rank * ft.batch + r) % pairs.size]
    ids[r * ft.context, pid.size] = pid
    labels[r * ft.context, plabels.size] = plabels
  end
  loss = ft.step(ids, labels, lr: opt[:lr])
  first ||= loss
  last = loss
  say.call format("step %d loss %.4f", step + 1, loss) if ((step + 1) % 10).zero? || step.zero?
end
drop = 1 - last / first
say.call format("loss %.4f -> %.4f (%.0f%% lower)", first, last, 100 * drop)
if opt[:ask]
  reply = ft.reply(opt[:ask], chat_template: opt[:chat_template], max_tokens: opt[:ask_tokens] || 64)
  say.call "reply: #{reply}"
end
# Every process calls; rank 0 writes.
ft.save(opt[:save]) if opt[:save]
ft.save_gguf(opt[:gguf]) if opt[:gguf]
abort format("finetune.rb: the loss fell by %.1f%%, less than %.1f%%", 100 * drop, 100 * opt[:min_drop]) if drop < opt[:min_drop]
