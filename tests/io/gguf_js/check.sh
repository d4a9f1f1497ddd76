#!/bin/sh
# Checks nabla's GGUF writer against an independent reader, @huggingface/gguf
# (pinned in package-lock.json, installed here into node_modules on first use).
# Then exports the fixture GPT-2 checkpoints with `nabla export gguf` and
# checks them against llama.cpp's gpt2 conventions (check_gpt2.mjs): always
# with the byte tokenizer, and with GPT-2's BPE when its vocabulary is
# installed (scripts/fetch-gpt2-vocab).
# Usage: check.sh FIXTURE_PROGRAM WORK_DIR NABLA
#   FIXTURE_PROGRAM  nabla_io_fixtures, which writes WORK_DIR/model.gguf and
#                    the GPT-2 checkpoints
#   NABLA            the nabla command
# Fails, never skips, when Node.js, npm or the npm registry is missing: a
# check that cannot run has not passed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
fixtures=$1
work=$2
nabla=$3

. "$here/../../node_check.sh"
# The package declares node >= 20, but read.mjs runs the same on Debian 12's
# Node.js 18.20 (npm only warns about the engine); older ones are untested.
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 18 ] || fail "read.mjs needs Node.js 18 or newer, this is $(node --version)"

npm_install "$here"

rm -rf "$work"
mkdir -p "$work"
"$fixtures" "$work" || fail "$fixtures could not write the fixture files"
node "$here/read.mjs" "$work/model.gguf" >"$work/model.json" || fail "@huggingface/gguf could not read $work/model.gguf"

# Deep comparison; on a difference, node prints both sides.
node -e '
const assert = require("assert"), fs = require("fs");
const [actual, expected] = process.argv.slice(1).map((p) => JSON.parse(fs.readFileSync(p, "utf8")));
assert.deepStrictEqual(actual, expected);
' "$work/model.json" "$here/expected.json" || fail "@huggingface/gguf reads $work/model.gguf differently from $here/expected.json"
echo "ok: @huggingface/gguf reads $(grep -c '"name"' "$work/model.json") tensors and the metadata as expected"

# GPT-2 for llama.cpp.
"$nabla" export gguf "$work/gpt2_byte.safetensors" -o "$work/gpt2_byte.gguf" >/dev/null ||
  fail "nabla export gguf could not export $work/gpt2_byte.safetensors"
node "$here/check_gpt2.mjs" "$work/gpt2_byte.gguf" "$work/gpt2_byte.safetensors" ||
  fail "$work/gpt2_byte.gguf does not follow llama.cpp's gpt2 conventions"
vocab=$(cat "$work/gpt2_vocab_dir")
if [ -n "$vocab" ]; then
  "$nabla" export gguf "$work/gpt2_bpe.safetensors" -o "$work/gpt2_bpe.gguf" --vocab "$vocab" >/dev/null ||
    fail "nabla export gguf could not export $work/gpt2_bpe.safetensors"
  node "$here/check_gpt2.mjs" "$work/gpt2_bpe.gguf" "$work/gpt2_bpe.safetensors" "$vocab" ||
    fail "$work/gpt2_bpe.gguf does not follow llama.cpp's gpt2 conventions"
else
  echo "note: GPT-2's vocabulary is not installed (scripts/fetch-gpt2-vocab): the BPE export was not checked"
fi
