#!/bin/sh
# `nabla export gguf` on checkpoints it cannot export: each must exit with
# status 2 and one line on stderr that names the file and says what was
# expected; nothing may be left at the output path. The GPT-2 and other
# checkpoints come from nabla_io_fixtures.
# Usage: export_gguf_errors.sh PATH_TO_NABLA PATH_TO_FIXTURES WORK_DIR
set -u
nabla=$1 fixtures=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir/empty" || exit 1
"$fixtures" "$dir" || { echo "$fixtures could not write the fixture files"; exit 1; }
failed=0

# expect_error WHAT TEXT ARGS...: runs `nabla export gguf ARGS -o OUT`.
expect_error() {
  what=$1 text=$2
  shift 2
  rm -f "$dir/out.gguf"
  "$nabla" export gguf "$@" -o "$dir/out.gguf" >/dev/null 2>"$dir/err"
  status=$?
  lines=$(wc -l <"$dir/err")
  if [ "$status" -ne 2 ]; then
    echo "FAIL: $what: exit status $status, expected 2"; failed=1
  elif [ "$lines" -ne 1 ]; then
    echo "FAIL: $what: $lines lines on stderr, expected 1:"; cat "$dir/err"; failed=1
  elif ! grep -qF -- "$text" "$dir/err"; then
    echo "FAIL: $what: stderr does not contain '$text':"; cat "$dir/err"; failed=1
  elif [ -e "$dir/out.gguf" ]; then
    echo "FAIL: $what: $dir/out.gguf was written"; failed=1
  else
    echo "ok: $what: $(cat "$dir/err")"
  fi
}

printf 'not a checkpoint at all' >"$dir/garbage.safetensors"
expect_error "corrupt checkpoint" "$dir/garbage.safetensors" "$dir/garbage.safetensors"
head -c 300 "$dir/gpt2_byte.safetensors" >"$dir/cut.safetensors"
expect_error "truncated checkpoint" "$dir/cut.safetensors" "$dir/cut.safetensors"
expect_error "unsupported architecture" "$dir/mlp.safetensors: GGUF export supports the architectures \"vit\", \"gpt2\" and \"llama\", got \"mlp\"" \
  "$dir/mlp.safetensors"
expect_error "erf GELU" "$dir/gpt2_erf.safetensors: llama.cpp's gpt2 architecture uses the tanh GELU" \
  "$dir/gpt2_erf.safetensors"
expect_error "vocabulary folder without the files" "$dir/empty/encoder.json" \
  "$dir/gpt2_bpe.safetensors" --vocab "$dir/empty"
# Where find_gpt2_vocab looks, nothing (an empty variable counts as unset).
saved_vocab=${NABLA_GPT2_VOCAB-} saved_cache=${NABLA_CACHE-}
export NABLA_GPT2_VOCAB="" NABLA_CACHE="$dir/no-cache"
expect_error "vocabulary not installed" "$dir/gpt2_bpe.safetensors: its tokenizer: gpt2 tokenizer: no vocabulary found: run scripts/fetch-gpt2-vocab" \
  "$dir/gpt2_bpe.safetensors"
export NABLA_GPT2_VOCAB="$saved_vocab" NABLA_CACHE="$saved_cache"
expect_error "missing checkpoint" "$dir/missing.safetensors" "$dir/missing.safetensors"

# And the one that works.
"$nabla" export gguf "$dir/gpt2_byte.safetensors" -o "$dir/ok.gguf" >/dev/null || { echo "FAIL: byte GPT-2 did not export"; failed=1; }
exit $failed
