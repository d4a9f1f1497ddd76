#!/usr/bin/env bash
# ctest ruby_ffi_finetune: a Ruby program fine-tunes a small Llama with LoRA
# through the C API (examples/ruby/finetune.rb: prompt / completion pairs and
# a chat, each labelled by nabla_finetune_encode_example as nabla finetune
# labels it) on a Q8_0 base kept quantized with gradient
# checkpointing, its loss falls by at least half, and what it
# saved is what nabla's own tools read and write: `nabla sample --adapter`
# runs the PEFT folder, and `nabla export lora-gguf` of that folder gives the
# GGUF adapter Ruby wrote, byte for byte.
# Usage: ruby_finetune.sh RUBY path/to/libnabla.so path/to/nabla
set -euo pipefail
ruby=$1 lib=$2 nabla=$3
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$nabla" train llama --layers 2 --width 64 --heads 4 --kv-heads 2 --positions 64 --context 64 --steps 150 --lr 3e-3 --eval-every 150 --eval-batches 1 \
  --save "$dir/base.safetensors" >/dev/null
# QLoRA from Ruby: the base as Q8_0, kept so, with gradient checkpointing.
"$nabla" export gguf "$dir/base.safetensors" --type q8_0 --out "$dir/base.gguf" >/dev/null
for i in $(seq 1 8); do echo "{\"prompt\": \"Q$i: \", \"completion\": \"answer $((i * 7))\"}"; done >"$dir/pairs.jsonl"
echo '{"messages": [{"role": "user", "content": "Q9"}, {"role": "assistant", "content": "answer 63"}]}' >>"$dir/pairs.jsonl"
"$ruby" "$here/../../examples/ruby/finetune.rb" --lib "$lib" --base "$dir/base.gguf" --data "$dir/pairs.jsonl" \
  --steps 100 --batch 4 --context 32 --lr 1e-2 --threads 2 --min-drop 0.5 --gradient-checkpointing \
  --save "$dir/adapter" --gguf "$dir/ruby.gguf" --ask '{"prompt": "Q3: "}' --ask-tokens 10 | tee "$dir/ruby.log"
# The reply Ruby generated in the process is the one `nabla sample` gives from the saved adapter.
"$nabla" sample --checkpoint "$dir/base.gguf" --adapter "$dir/adapter" --prompt "Q3: " --tokens 10 \
  --temperature 0 >"$dir/sample.txt"
echo "sample: $(cat "$dir/sample.txt")"
[ "reply: $(sed -n 's/^Q3: //p' "$dir/sample.txt")" = "$(grep '^reply: ' "$dir/ruby.log")" ] ||
  { echo "Ruby's reply differs from nabla sample's"; exit 1; }
"$nabla" export lora-gguf "$dir/adapter" --base "$dir/base.gguf" -o "$dir/nabla.gguf" >/dev/null
cmp "$dir/ruby.gguf" "$dir/nabla.gguf"
echo "the GGUF adapter Ruby wrote is the one nabla export lora-gguf writes from its PEFT folder"
# Bad input through the C API: an error naming the file, no abort.
"$ruby" -e '
require_relative ARGV[0]
Nabla.load(ARGV[1])
begin
  Nabla::Finetune.new(ARGV[2])
  abort "a missing base was accepted"
rescue Nabla::Error => e
  abort "unhelpful error: #{e.message}" unless e.message.include?(ARGV[2])
  puts "missing base: #{e.message}"
end
begin
  Nabla::Finetune.new(ARGV[3], lora_targets: "q_proj,qkv")
  abort "an unknown target was accepted"
rescue Nabla::Error => e
  puts "unknown target: #{e.message}"
end
begin
  out = FFI::MemoryPointer.new(:pointer)
  Nabla.check(Nabla.nabla_finetune_create(ARGV[3], nil, 4, 8.0, 0.0, 64, nil, 1, 0, 0.0, 1, 1, out))
  abort "an unknown flag was accepted"
rescue Nabla::Error => e
  abort "unhelpful error: #{e.message}" unless e.message.include?("flags 64")
  puts "unknown flag: #{e.message}"
end
ft = Nabla::Finetune.new(ARGV[3], lora_r: 2, batch: 1, context: 16)
ids, labels = ft.example("{\"prompt\": \"a\", \"completion\": \"b\"}")
abort "prompt / completion labelled #{labels}" unless ids.size == labels.size && labels.first == -100 && labels.last != -100
{ "{\"messages\": 3}" => "\"messages\" is 3",
  "not json" => "not JSON" }.each do |line, says|
  ft.example(line)
  abort "a bad example was accepted: #{line}"
rescue Nabla::Error => e
  abort "unhelpful error: #{e.message}" unless e.message.include?(says)
  puts "bad example: #{e.message}"
end
# Generation in the process: a chat prompt ends with the assistant header;
# sampling follows the seed; log-probabilities are of the ids generated.
prompt = ft.prompt("{\"messages\": [{\"role\": \"user\", \"content\": \"Q9\"}]}", chat_template: "chatml")
want = "<|im_start|>user\nQ9<|im_end|>\n<|im_start|>assistant\n"
abort "chat prompt #{ft.decode(prompt).inspect}" unless ft.decode(prompt) == want
drawn = ft.generate(prompt, max_tokens: 6, temperature: 1.0, seed: 7, ignore_eos: true)
abort "6 ids expected: #{drawn}" unless drawn.size == 6 && drawn == ft.generate(prompt, max_tokens: 6, temperature: 1.0, seed: 7)
ids, logprobs = ft.generate(prompt, max_tokens: 4, logprobs: true)
abort "logprobs #{logprobs}" unless logprobs.size == ids.size && logprobs.all? { |l| l <= 0 && l > -50 }
{ -> { ft.generate([]) } => "prompt_count is 0",
  -> { ft.generate([1], max_tokens: 0) } => "max_tokens is 0",
  -> { ft.generate([1, 1 << 20]) } => "token id 1048576 is outside the vocabulary",
  -> { ft.decode([-1]) } => "nabla_finetune_decode",
  -> { ft.prompt("{\"completion\": \"x\"}") } => "no \"prompt\"" }.each do |call, says|
  call.call
  abort "bad generation input was accepted: #{says}"
rescue Nabla::Error => e
  abort "unhelpful error: #{e.message}" unless e.message.include?(says)
  puts "bad generation input: #{e.message}"
end
begin
  ft.example("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", chat_template: "mistral")
  abort "an unknown template was accepted"
rescue Nabla::Error => e
  abort "unhelpful error: #{e.message}" unless e.message.include?("unknown chat template \"mistral\"")
  puts "unknown template: #{e.message}"
end' "$here/../../examples/ruby/nabla.rb" "$lib" "$dir/no-such-model" "$dir/base.safetensors"
