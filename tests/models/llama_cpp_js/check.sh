#!/bin/sh
# llama.cpp runs nabla's GGUF Llama-family exports: node-llama-cpp (pinned in
# package-lock.json, its prebuilt CPU binary for linux-x64, installed here
# into node_modules on first use) loads each file `nabla export gguf --type`
# wrote from the fixture checkpoints (F32, Q8_0, Q4_0, Q4_K, Q6_K), and its
# next-token log-probabilities must match nabla's on the same file
# (check_llama_cpp.mjs); so too the F32 files with a PEFT LoRA adapter that
# `nabla export lora-gguf` converted (llama.cpp applying it) and the models
# `nabla export gguf --adapter` merged. Then tokenizers: `nabla tokenizer train` on the
# fortunes with GPT-2's, Qwen2's, SmolLM2's and Llama 3's patterns (Llama 3's
# with ignore_merges on, as llama.cpp reads that pattern), each written into
# a GGUF with `nabla export gguf --tokenizer`; so too Llama-2-style
# SentencePiece tokenizer.json files (GGUF model "llama", with scores).
# llama.cpp must tokenize hand texts and fortunes into nabla's ids
# (check_tokenizers.mjs).
# Usage: check.sh FIXTURE_PROGRAM WORK_DIR NABLA [TYPES]
# TYPES: the --type list (default all five; the sanitized build passes
# "f32 q4_k", its time being llama.cpp's, and each quantizer being sanitized
# in the unit tests).
# Fails, never skips, when Node.js, npm or the npm registry is missing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
fixtures=$1
work=$2
nabla=$3
types=${4:-f32 q8_0 q4_0 q4_k q6_k}

. "$here/../../node_check.sh"
# Without the optional GPU builds (85 MB instead of 725 MB), and without
# install scripts: the prebuilt binary is used as it is, nothing is built.
# `npm install --no-save` rather than `npm ci`: the lock file lacks the other
# platforms' optional builds, which npm ci would demand.
npm_install "$here" install --omit=optional --ignore-scripts --no-save

rm -rf "$work"
mkdir -p "$work"
"$fixtures" write "$work" || fail "$fixtures could not write the fixture checkpoints"
for ckpt in "$work"/*.safetensors; do
  for type in $types; do
    "$nabla" export gguf "$ckpt" --type $type -o "${ckpt%.safetensors}.$type.gguf" >/dev/null ||
      fail "nabla export gguf --type $type could not export $ckpt"
  done
done
for lora in "$work"/*.lora; do
  model=${lora%.lora}
  "$nabla" export lora-gguf "$lora" --base "$model.f32.gguf" -o "$model.lora.adapter" >/dev/null ||
    fail "nabla export lora-gguf could not convert $lora"
  "$nabla" export gguf "$model.safetensors" --adapter "$lora" -o "$model.merged.gguf" >/dev/null ||
    fail "nabla export gguf --adapter could not merge $lora"
done
# nabla's side reads the GGUF files back, so each type is compared on the
# values it stores.
"$fixtures" expect "$work" || fail "$fixtures could not compute nabla's log-probabilities from the GGUF files"
node "$here/check_llama_cpp.mjs" "$work" || fail "llama.cpp's next-token log-probabilities differ from nabla's"

# ---- tokenizers
tok="$work/tokenizers"
fortunes=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' | sort)
[ -n "$fortunes" ] || fail "Debian's fortunes are not installed (scripts/install-deps installs them)"
{
  cat <<'TEXTS'
Hello, world! It's a test: don't we'll they've I'd you're.
  leading spaces, trailing spaces   
tabs	and	more		tabs
numbers 1 12 123 1234 12345 3.14159 -42 1e10 0x1F 2024-12-05
Unicode: 東京 Ελληνικά русский عربى हिन्दी 🙂👍🏽 café naïve ﬁ
code: for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // done
def f(x):    return x**2 if x > 0 else -x  # python
special<|endoftext|>tokens <|endoftext|> in <|endoftext|>text
llama's special</s>tokens <s> in </s> text<unk>, and <0x41> as text
     
mixed   whitespace 	  runs  and punctuation!!! ??? ... ,,, ;;; ---
TEXTS
  printf 'a carriage\r return inside a line\n'
  cat $fortunes | head -n 3000
} >"$tok/lines.txt"
{ cat "$tok/lines.txt"; cat $fortunes | head -c 200000; } >"$tok/whole.txt"
names=""
for pattern in gpt2 qwen2 digits llama3 o200k; do
  json="$tok/$pattern.json"
  "$nabla" tokenizer train --pattern $pattern --vocab-size 1000 -o "$json" >/dev/null ||
    fail "nabla tokenizer train --pattern $pattern failed"
  if [ $pattern = llama3 ]; then
    node -e '
const fs = require("fs");
const j = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
j.model.ignore_merges = true;
fs.writeFileSync(process.argv[1], JSON.stringify(j));
' "$json"
  fi
  "$nabla" export gguf "$tok/host.safetensors" --tokenizer "$json" -o "$tok/$pattern.gguf" >/dev/null ||
    fail "nabla export gguf --tokenizer $json failed"
  "$nabla" tokenize --tokenizer "$tok/$pattern.gguf" <"$tok/lines.txt" >"$tok/$pattern.lines" ||
    fail "nabla tokenize --tokenizer $tok/$pattern.gguf failed"
  "$nabla" tokenize --whole --tokenizer "$tok/$pattern.gguf" <"$tok/whole.txt" >"$tok/$pattern.whole" ||
    fail "nabla tokenize --whole failed"
  names="$names $pattern"
done
# SentencePiece-style BPE: make_spm_tokenizer.js's Llama-2-style
# tokenizer.json (legacy normalizer; Metaspace) written as GGUF's "llama"
# vocabulary, with scores from its merges. nabla reads that GGUF as
# llama.cpp does; from the legacy form (SentencePiece's own spacing) it
# must also give the tokenizer.json's ids, and the tokenizer.json nabla
# writes back from either GGUF the GGUF's.
# shellcheck disable=SC2046
cat $(echo "$fortunes" | head -n 5) | head -c 300000 >"$tok/spm_text.txt"
for style in legacy metaspace; do
  json="$tok/spm_$style.json"
  node "$here/../../text/make_spm_tokenizer.js" "$tok/spm_text.txt" "$json" 700 $style >/dev/null ||
    fail "make_spm_tokenizer.js $style failed"
  "$nabla" export gguf "$tok/host.safetensors" --tokenizer "$json" -o "$tok/spm_$style.gguf" >/dev/null ||
    fail "nabla export gguf --tokenizer $json failed"
  "$nabla" tokenizer convert --tokenizer "$tok/spm_$style.gguf" -o "$tok/spm_$style.back.json" ||
    fail "nabla tokenizer convert --tokenizer $tok/spm_$style.gguf failed"
  for source in gguf json back.json; do
    "$nabla" tokenize --tokenizer "$tok/spm_$style.$source" <"$tok/lines.txt" >"$tok/spm_$style.lines.$source" ||
      fail "nabla tokenize --tokenizer $tok/spm_$style.$source failed"
    "$nabla" tokenize --whole --tokenizer "$tok/spm_$style.$source" <"$tok/whole.txt" >"$tok/spm_$style.whole.$source" ||
      fail "nabla tokenize --whole --tokenizer $tok/spm_$style.$source failed"
  done
  mv "$tok/spm_$style.lines.gguf" "$tok/spm_$style.lines"
  mv "$tok/spm_$style.whole.gguf" "$tok/spm_$style.whole"
  names="$names spm_$style"
done
cmp -s "$tok/spm_legacy.lines" "$tok/spm_legacy.lines.json" && cmp -s "$tok/spm_legacy.whole" "$tok/spm_legacy.whole.json" ||
  fail "the GGUF nabla wrote from $tok/spm_legacy.json tokenizes differently from it (spm_legacy.lines{,.json})"
for style in legacy metaspace; do
  cmp -s "$tok/spm_$style.lines" "$tok/spm_$style.lines.back.json" &&
    cmp -s "$tok/spm_$style.whole" "$tok/spm_$style.whole.back.json" ||
    fail "the tokenizer.json nabla wrote from $tok/spm_$style.gguf tokenizes differently from it"
done
node "$here/check_tokenizers.mjs" "$tok" $names || fail "llama.cpp tokenizes differently from nabla (texts and ids in $tok)"
