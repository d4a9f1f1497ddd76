#!/bin/sh
# Checks nabla's tokenizer.json reader against an independent implementation,
# the npm package @huggingface/tokenizers (Tokenizers.js, pinned in
# package-lock.json, installed here into node_modules on first use), on the
# texts of bpe_reference.js (hand-written lines, then a multi-line text) and
# the first BYTES of the fortunes (default 1 MB), for these tokenizer.json files:
#   gpt2            GPT-2's vocabulary as `nabla tokenizer convert` writes it
#   gpt2_trained    `nabla tokenizer train` on the fortunes, GPT-2's pattern
#   llama3_trained  the same with Llama 3's pattern; llama3_ignore_merges
#                   that file with ignore_merges on, as Llama 3's has it
#   qwen2_trained, digits_trained, o200k_trained   Qwen2's pattern, SmolLM2's
#                   digit split, GPT-4o's and Phi-4-mini's o200k pattern
#   qwen2_nfc       qwen2_trained with Qwen2's NFC normalizer
#   spm_legacy, spm_metaspace   SentencePiece-style BPE as Hugging Face
#                   converts Llama 2's (make_spm_tokenizer.js: U+2581 pieces,
#                   <0xXX> byte fallback, the legacy Prepend + Replace
#                   normalizer or a Metaspace pre-tokenizer); spm_gemma as
#                   Hugging Face converts Gemma's (Replace alone, no prefix)
#   spm_from_gguf   spm_legacy written into a GGUF (llama.cpp's "llama"
#                   vocabulary, scores) and back: the tokenizer.json a Llama
#                   trained with that GGUF's vocabulary keeps beside it
# Every id must be the same, and decoding the ids must give the text back
# (in NFC for qwen2_nfc; for the SentencePiece ones, the text
# @huggingface/tokenizers decodes from the same ids, which drops a leading
# space under Metaspace).
# Usage: hf_tokenizers.sh NABLA_BIN WORK_DIR [BYTES]
# Fails, never skips, when Node.js, npm or the registry is missing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
nabla=$1
work=$2
bytes=${3:-1000000}
fortunes=/usr/share/games/fortunes

. "$here/../node_check.sh"
npm_install "$here"
vocab=$("$here/../../scripts/fetch-gpt2-vocab") || fail "scripts/fetch-gpt2-vocab could not install GPT-2's vocabulary"

rm -rf "$work"
mkdir -p "$work"
"$nabla" tokenizer convert --tokenizer gpt2 --vocab "$vocab" -o "$work/gpt2.json" || fail "tokenizer convert failed"
for pattern in gpt2 llama3 qwen2 digits o200k; do
  "$nabla" tokenizer train --pattern $pattern --vocab-size 3000 -o "$work/${pattern}_trained.json" ||
    fail "tokenizer train --pattern $pattern failed"
done
node -e '
const fs = require("fs");
const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
j.model.ignore_merges = true;
fs.writeFileSync(process.argv[2], JSON.stringify(j));
' "$work/llama3_trained.json" "$work/llama3_ignore_merges.json"
node -e '
const fs = require("fs");
const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
j.normalizer = {type: "NFC"};
fs.writeFileSync(process.argv[2], JSON.stringify(j));
' "$work/qwen2_trained.json" "$work/qwen2_nfc.json"
# shellcheck disable=SC2046
cat $(find "$fortunes" -maxdepth 1 -type f ! -name '*.*' | sort | head -n 5) | head -c 300000 >"$work/spm_text.txt"
for style in legacy metaspace gemma; do
  node "$here/make_spm_tokenizer.js" "$work/spm_text.txt" "$work/spm_$style.json" 700 $style >/dev/null ||
    fail "make_spm_tokenizer.js $style failed"
done

# A Llama trained with a SentencePiece-style tokenizer: its Hugging Face
# folder carries the file as it is, and its GGUF the vocabulary as llama.cpp's
# "llama" model; sampling from each gives the same text. A model trained with
# that GGUF's vocabulary keeps it as tokenizer.json (spm_from_gguf, below).
status=0
"$nabla" train llama --preset llama-tiny-byte --layers 1 --width 32 --heads 2 --kv-heads 1 --steps 2 --batch 2 \
  --context 16 --eval-batches 1 --text "$work/spm_text.txt" --tokenizer "$work/spm_legacy.json" \
  --save "$work/spm_model.safetensors" >"$work/spm_train.log" 2>&1 || fail "train llama with spm_legacy.json failed"
"$nabla" export hf "$work/spm_model.safetensors" -o "$work/spm_hf" >/dev/null || fail "export hf with spm_legacy.json failed"
cmp -s "$work/spm_legacy.json" "$work/spm_hf/tokenizer.json" || { echo "the HF folder's tokenizer.json is not the one trained with"; status=1; }
"$nabla" export gguf "$work/spm_model.safetensors" -o "$work/spm.gguf" >/dev/null || fail "export gguf with spm_legacy.json failed"
for m in spm_model.safetensors spm_hf spm.gguf; do
  "$nabla" sample --checkpoint "$work/$m" --prompt "The cat" --tokens 6 --temperature 0 >"$work/$m.txt" ||
    fail "sample from $m failed"
done
for m in spm_hf spm.gguf; do
  cmp -s "$work/spm_model.safetensors.txt" "$work/$m.txt" || { echo "the checkpoint and $m sample differently"; status=1; }
done
"$nabla" train llama --preset llama-tiny-byte --layers 1 --width 32 --heads 2 --kv-heads 1 --steps 1 --batch 2 \
  --context 16 --eval-batches 1 --text "$work/spm_text.txt" --tokenizer "$work/spm.gguf" \
  --save "$work/spm_gguf_model.safetensors" >"$work/spm_gguf_train.log" 2>&1 || fail "train llama with spm.gguf's vocabulary failed"
cp "$work/spm_gguf_model.tokenizer.json" "$work/spm_from_gguf.json"

for name in gpt2 gpt2_trained llama3_trained llama3_ignore_merges qwen2_trained qwen2_nfc digits_trained o200k_trained spm_legacy \
  spm_metaspace spm_gemma spm_from_gguf; do
  json="$work/$name.json" dir="$work/$name"
  mkdir -p "$dir"
  echo "== $name"
  node "$here/bpe_reference.js" write "$json" "$dir" "$fortunes" "$bytes" || fail "@huggingface/tokenizers could not encode with $json"
  tokenize() { "$nabla" tokenize --tokenizer "$json" "$@"; }
  tokenize <"$dir/lines.txt" >"$dir/lines.actual" || fail "nabla tokenize failed on $dir/lines.txt"
  tokenize --whole <"$dir/whole.txt" >"$dir/whole.actual" || fail "nabla tokenize --whole failed on $dir/whole.txt"
  node "$here/bpe_reference.js" compare "$dir/lines.ids" "$dir/lines.actual" "$dir/lines.txt" || status=1
  node "$here/bpe_reference.js" compare "$dir/whole.ids" "$dir/whole.actual" || status=1
  tokenize --decode <"$dir/lines.ids" >"$dir/lines.decoded" || fail "nabla tokenize --decode failed"
  want="$dir/lines.txt"
  if [ "${name#spm_}" != "$name" ]; then
    want="$dir/lines.hf_decoded"
    node "$here/bpe_reference.js" decode "$json" "$dir/lines.ids" "$want" || fail "@huggingface/tokenizers could not decode"
  fi
  if [ $name = qwen2_nfc ]; then
    want="$dir/lines.nfc"
    node -e 'process.stdout.write(require("fs").readFileSync(0, "utf8").normalize("NFC"))' <"$dir/lines.txt" >"$want"
    cmp -s "$dir/lines.txt" "$want" && { echo "no text of $dir/lines.txt changes in NFC: the check checks nothing"; status=1; }
  fi
  cmp -s "$want" "$dir/lines.decoded" || { echo "decoding $dir/lines.ids does not give $want back"; status=1; }
done

[ $status -eq 0 ] || fail "nabla's ids differ from @huggingface/tokenizers' (texts and ids in $work)"
echo "ok: nabla encodes as @huggingface/tokenizers with all twelve tokenizer.json files, and decodes back to the text;" \
  "a Llama trains, exports (Hugging Face, GGUF) and samples with the SentencePiece one"
