#!/bin/sh
# `nabla finetune` end to end on a small Llama: LoRA on an HF folder and on a
# GGUF base, DoRA, packed and padded batches, gradient accumulation, a PEFT folder
# that `sample --adapter` and `grad --adapter` read, resume bit-identical to
# an uninterrupted run, --full, and bad data lines named by file and line.
# Usage: finetune.sh PATH_TO_NABLA WORK_DIR
set -u
nabla=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

"$nabla" train llama --layers 2 --width 64 --heads 4 --kv-heads 2 --positions 160 --steps 0 \
  --save "$dir/base.safetensors" >/dev/null 2>&1 || fail "making the base"
"$nabla" export hf "$dir/base.safetensors" --out "$dir/base" >/dev/null || fail "export hf"
"$nabla" export gguf "$dir/base.safetensors" --out "$dir/base.gguf" >/dev/null || fail "export gguf"

data=$dir/data.jsonl
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
  echo "{\"prompt\": \"What is $i plus $i? \", \"completion\": \"$((i + i)).\"}"
  echo "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Say $i\"}, {\"role\": \"assistant\", \"content\": \"$i\"}]}"
  echo "{\"text\": \"Fortune $i favours the prepared mind.\"}"
done > "$data"

common="--data $data --context 160 --batch 3 --epochs 2 --lora-r 4 --log-every 100 --threads 2"
"$nabla" finetune --base "$dir/base" $common --save "$dir/straight" > "$dir/straight.log" 2>&1 ||
  { cat "$dir/straight.log"; fail "finetune"; }
grep -q "LoRA r 4, alpha 16" "$dir/straight.log" || fail "no LoRA banner"
grep -q "34 training and 2 validation examples" "$dir/straight.log" || { cat "$dir/straight.log"; fail "split"; }
for f in adapter_config.json adapter_model.safetensors training_state.safetensors; do
  [ -s "$dir/straight/$f" ] || fail "no $f"
done
grep -q '"peft_type": "LORA"' "$dir/straight/adapter_config.json" || fail "adapter_config.json"

# Stopped early, then resumed: the same adapter, byte for byte.
"$nabla" finetune --base "$dir/base" $common --save "$dir/part" --max-steps 5 >/dev/null 2>&1 || fail "first part"
"$nabla" finetune --base "$dir/base" $common --save "$dir/part" --resume "$dir/part" > "$dir/resumed.log" 2>&1 ||
  { cat "$dir/resumed.log"; fail "resume"; }
grep -q "resumed from" "$dir/resumed.log" || fail "the resume did not say so"
cmp "$dir/straight/adapter_model.safetensors" "$dir/part/adapter_model.safetensors" ||
  fail "the resumed adapter differs from the uninterrupted run's"
echo "resumed adapter is byte-identical to the uninterrupted run's"

# SmolLM3's template dates its system block: the run records the date, and a
# resumed run renders with it (here the same day: the same adapter).
"$nabla" finetune --base "$dir/base" $common --chat-template smollm3 --save "$dir/smol" --max-steps 5 \
  > "$dir/smol.log" 2>&1 || { cat "$dir/smol.log"; fail "smollm3 template"; }
grep -q "smollm3 template" "$dir/smol.log" || { cat "$dir/smol.log"; fail "smollm3 template not used"; }
grep -aqF "chat_date\\\":\\\"$(date +%Y-%m-%d)" "$dir/smol/training_state.safetensors" ||
  fail "the training state records no chat date"
"$nabla" finetune --base "$dir/base" $common --chat-template smollm3 --save "$dir/smol" --resume "$dir/smol" \
  > "$dir/smol_resumed.log" 2>&1 || { cat "$dir/smol_resumed.log"; fail "smollm3 resume"; }

# The base's own template: transformers' chat_template.jinja is read; one
# nabla does not render refuses "messages" lines (other forms still train).
cp -r "$dir/base" "$dir/base_qwen3"
printf '%s' "{%- set ns = namespace(last_query_index=messages|length - 1) %}<|im_start|>{{ '</think>' }}" \
  > "$dir/base_qwen3/chat_template.jinja"
"$nabla" finetune --base "$dir/base_qwen3" $common --max-steps 1 > "$dir/qwen3.log" 2>&1 &&
  grep -q "qwen3 template" "$dir/qwen3.log" || { cat "$dir/qwen3.log"; fail "chat_template.jinja not recognised"; }
# The template travels: into a GGUF (tokenizer.chat_template, llama.cpp's)
# and back out as a folder's chat_template.jinja.
"$nabla" export gguf "$dir/base_qwen3" -o "$dir/qwen3.gguf" >/dev/null || fail "export gguf with a chat template"
"$nabla" export hf "$dir/qwen3.gguf" -o "$dir/qwen3_back" >/dev/null || fail "export hf with a chat template"
cmp -s "$dir/base_qwen3/chat_template.jinja" "$dir/qwen3_back/chat_template.jinja" ||
  fail "the chat template did not travel through GGUF"
cp -r "$dir/base" "$dir/base_inst"
echo '{"chat_template": "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"}' \
  > "$dir/base_inst/tokenizer_config.json"
out=$("$nabla" finetune --base "$dir/base_inst" $common --max-steps 1 2>&1); status=$?
[ $status -eq 2 ] && echo "$out" | grep -q "data.jsonl:2: \"messages\": the chat template of" &&
  echo "$out" | grep -q "give --chat-template" || fail "an unknown template: $status $out"
grep -v messages "$data" > "$dir/no_messages.jsonl"
"$nabla" finetune --base "$dir/base_inst" --data "$dir/no_messages.jsonl" --context 160 --batch 3 --max-steps 1 \
  --threads 2 > /dev/null 2>&1 || fail "an unknown template with no messages lines"

# A GGUF base, padded batches, accumulation, rsLoRA on two targets.
"$nabla" finetune --base "$dir/base.gguf" --data "$data" --context 160 --batch 2 --grad-accum 3 --pad --epochs 1 \
  --lora-targets q,v --rslora --save "$dir/gguf_adapter" > "$dir/gguf.log" 2>&1 || { cat "$dir/gguf.log"; fail "gguf base"; }
grep -q "padded" "$dir/gguf.log" && grep -q "x 3 accumulated" "$dir/gguf.log" || { cat "$dir/gguf.log"; fail "pad/accum"; }
grep -q '"use_rslora": true' "$dir/gguf_adapter/adapter_config.json" || fail "rslora not recorded"

# QLoRA: a Q8_0 base stays Q8_0 (with gradient checkpointing), and the adapter trained on it samples.
"$nabla" export gguf "$dir/base.safetensors" --type q8_0 --out "$dir/base.q8_0.gguf" >/dev/null || fail "export q8_0"
"$nabla" finetune --base "$dir/base.q8_0.gguf" --data "$data" --context 160 --batch 3 --epochs 1 --lora-r 4 \
  --threads 2 --gradient-checkpointing --save "$dir/q8_adapter" > "$dir/q8.log" 2>&1 ||
  { cat "$dir/q8.log"; fail "q8_0 base"; }
grep -q "matrices kept as Q8_0" "$dir/q8.log" && grep -q "gradient checkpointing" "$dir/q8.log" ||
  { cat "$dir/q8.log"; fail "the Q8_0 base was not kept, or not checkpointed"; }
"$nabla" sample --checkpoint "$dir/base.q8_0.gguf" --adapter "$dir/q8_adapter" --prompt "Say 3" --tokens 3 \
  --temperature 0 >/dev/null || fail "sample --adapter on the Q8_0 base"

# DoRA on the Q8_0 base: saved as PEFT writes it; sampled with the adapter,
# it gives the text of the model it merges into; llama.cpp's adapter GGUF
# cannot hold it.
"$nabla" finetune --base "$dir/base.q8_0.gguf" --data "$data" --context 160 --batch 3 --epochs 1 --lora-r 4 --dora \
  --threads 2 --save "$dir/dora" > "$dir/dora.log" 2>&1 || { cat "$dir/dora.log"; fail "--dora"; }
grep -q "DoRA r 4" "$dir/dora.log" || { cat "$dir/dora.log"; fail "no DoRA banner"; }
grep -q '"use_dora": true' "$dir/dora/adapter_config.json" || fail "use_dora not recorded"
"$nabla" sample --checkpoint "$dir/base.q8_0.gguf" --adapter "$dir/dora" --prompt "Say 3" --tokens 8 \
  --temperature 0 --ignore-eos >"$dir/dora.txt" || fail "sample --adapter with DoRA"
"$nabla" export gguf "$dir/base.q8_0.gguf" --adapter "$dir/dora" -o "$dir/dora_merged.gguf" >/dev/null ||
  fail "export gguf --adapter with DoRA"
"$nabla" sample --checkpoint "$dir/dora_merged.gguf" --prompt "Say 3" --tokens 8 --temperature 0 --ignore-eos \
  >"$dir/dora_merged.txt" || fail "sample the merged DoRA model"
cmp -s "$dir/dora.txt" "$dir/dora_merged.txt" || fail "DoRA: the adapter and the merged model sample differently"
out=$("$nabla" export lora-gguf "$dir/dora" --base "$dir/base.q8_0.gguf" -o "$dir/dora.gguf" 2>&1); status=$?
[ $status -eq 2 ] && echo "$out" | grep -q "merge it into the model instead" && [ ! -e "$dir/dora.gguf" ] ||
  fail "a DoRA adapter as llama.cpp's: $status $out"

# The adapter in use.
"$nabla" sample --checkpoint "$dir/base" --adapter "$dir/straight" --prompt "What is 2 plus 2? " --tokens 5 \
  --temperature 0 >/dev/null || fail "sample --adapter"
# A folder's generation_config.json, as transformers reads it: greedy without
# do_sample, its eos_token_id ends generation, the command line wins.
cp -r "$dir/base" "$dir/base_gen"
"$nabla" sample --checkpoint "$dir/base" --prompt "Say" --tokens 12 --temperature 0 >"$dir/greedy.txt" ||
  fail "greedy sample"
echo '{"bos_token_id": 1}' >"$dir/base_gen/generation_config.json"
"$nabla" sample --checkpoint "$dir/base_gen" --prompt "Say" --tokens 12 >"$dir/gen.txt" || fail "sample, generation_config"
cmp -s "$dir/greedy.txt" "$dir/gen.txt" || fail "generation_config.json without do_sample: not greedy"
echo '{"do_sample": true, "temperature": 5.0}' >"$dir/base_gen/generation_config.json"
"$nabla" sample --checkpoint "$dir/base_gen" --prompt "Say" --tokens 12 --temperature 0 >"$dir/gen.txt" &&
  cmp -s "$dir/greedy.txt" "$dir/gen.txt" || fail "--temperature 0 over generation_config.json"
# eos_token_id: the byte greedy decoding writes third; the reply ends before its first.
eos=$(/usr/bin/python3 -c 'import sys; print(open(sys.argv[1], "rb").read()[5])' "$dir/greedy.txt")
echo "{\"eos_token_id\": [999, $eos]}" >"$dir/base_gen/generation_config.json"
"$nabla" sample --checkpoint "$dir/base_gen" --prompt "Say" --tokens 12 >"$dir/gen.txt" || fail "sample, eos_token_id"
/usr/bin/python3 -c '
import sys
greedy, got, eos = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read(), int(sys.argv[3])
reply = greedy[3:-1]
want = b"Say" + reply[:reply.index(eos)] + b"\n"
sys.exit(0 if got == want else f"eos_token_id {eos}: got {got!r}, want {want!r}")' \
  "$dir/greedy.txt" "$dir/gen.txt" "$eos" || fail "generation_config.json's eos_token_id"

# A reply in the base's chat template (ChatML: the base has none), to the
# template's end of turn; a template nabla does not render is refused.
"$nabla" sample --checkpoint "$dir/base" --adapter "$dir/straight" --system "Be brief." --chat "Say 3" --tokens 4 \
  --temperature 0 >/dev/null || fail "sample --chat"
out=$("$nabla" sample --checkpoint "$dir/base_inst" --chat "Say 3" --tokens 2 2>&1); status=$?
[ $status -eq 2 ] && echo "$out" | grep -q "give --chat-template" || fail "sample --chat, an unknown template: $status $out"
"$nabla" sample --checkpoint "$dir/base_inst" --chat "Say 3" --chat-template chatml --tokens 2 >/dev/null ||
  fail "sample --chat --chat-template"
"$nabla" sample --checkpoint "$dir/base" --chat "Say 3" --prompt "Say" --tokens 2 >/dev/null 2>&1 &&
  fail "sample with both --chat and --prompt"
"$nabla" finetune --base "$dir/base" --data "$data" --context 160 --full --epochs 1 --save "$dir/full" \
  --log-every 100 >/dev/null 2>&1 || fail "--full"
[ -s "$dir/full/model.safetensors" ] && [ -s "$dir/full/config.json" ] || fail "--full wrote no HF folder"
"$nabla" sample --checkpoint "$dir/full" --prompt "Say 3" --tokens 3 --temperature 0 >/dev/null || fail "sample --full"

# Bad lines: status 2 and an error naming the file and line.
printf '{"text": "ok"}\n{"prompt": 3, "completion": "x"}\n' > "$dir/bad.jsonl"
out=$("$nabla" finetune --base "$dir/base" --data "$dir/bad.jsonl" 2>&1); status=$?
[ $status -eq 2 ] || fail "bad line: status $status"
echo "$out" | grep -q "bad.jsonl:2" || fail "bad line not named: $out"
printf '{"text": "ok"}\nnot json\n' > "$dir/bad.jsonl"
out=$("$nabla" finetune --base "$dir/base" --data "$dir/bad.jsonl" 2>&1); status=$?
[ $status -eq 2 ] && echo "$out" | grep -q "bad.jsonl:2" || fail "not JSON: $status $out"
printf '{"text": "only one example"}\n' > "$dir/one.jsonl"
out=$("$nabla" finetune --base "$dir/base" --data "$dir/one.jsonl" 2>&1); status=$?
[ $status -eq 2 ] && echo "$out" | grep -q "no validation examples" || fail "one example: $status $out"
grep prompt "$data" > "$dir/prompts.jsonl"
out=$("$nabla" finetune --base "$dir/base" --data "$dir/prompts.jsonl" --context 8 2>&1); status=$?
[ $status -eq 2 ] && echo "$out" | grep -q "no training example keeps a token to learn within a context of 8 tokens" ||
  fail "a context shorter than every prompt: $status $out"
out=$("$nabla" finetune --base "$dir/base" --data "$data" --full --lora-r 4 2>&1); status=$?
[ $status -eq 2 ] || fail "--full with --lora-r: status $status"
echo "finetune checks passed"
