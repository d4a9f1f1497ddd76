#!/bin/sh
# llama.cpp runs nabla's GGUF Llama-family exports: node-llama-cpp (pinned in
# package-lock.json, its prebuilt CPU binary for linux-x64, installed here
# into node_modules on first use) loads each file `nabla export gguf --type`
# wrote from the fixture checkpoints (F32, Q8_0, Q4_0, Q4_K, Q6_K), and its
# next-token log-probabilities must match nabla's on the same file
# (check_llama_cpp.mjs).
# Usage: check.sh FIXTURE_PROGRAM WORK_DIR NABLA
# Fails, never skips, when Node.js, npm or the npm registry is missing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
fixtures=$1
work=$2
nabla=$3

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
  for type in f32 q8_0 q4_0 q4_k q6_k; do
    "$nabla" export gguf "$ckpt" --type $type -o "${ckpt%.safetensors}.$type.gguf" >/dev/null ||
      fail "nabla export gguf --type $type could not export $ckpt"
  done
done
# nabla's side reads the GGUF files back, so each type is compared on the
# values it stores.
"$fixtures" expect "$work" || fail "$fixtures could not compute nabla's log-probabilities from the GGUF files"
node "$here/check_llama_cpp.mjs" "$work" || fail "llama.cpp's next-token log-probabilities differ from nabla's"
