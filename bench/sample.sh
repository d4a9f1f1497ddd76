#!/usr/bin/env bash
# Sampling speed, nabla against llama.cpp on the same f32 GGUF file in the
# same run: SmolLM2-135M's shape with random weights (its byte vocabulary
# padded to 49,152 tokens, so prompt and ids are the same bytes on both
# sides), a prompt of 256 tokens, then 128 greedy tokens, on 2 threads.
# llama.cpp is node-llama-cpp's prebuilt CPU build (the one the ctest
# llama_cpp_runs_nabla_gguf installs) with its defaults (F16 key/value cache,
# batch 512). Prompt: tokens per second until the first new token is known
# (nabla's includes compiling the prompt's graph); generation: the tokens
# after the first, one decoding step each. Runs alternate; each side's best
# of REPS is printed, with the ratio.
#
# Usage: bench/sample.sh [REPS]     (default 3; about 3 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
prompt_tokens=256
new_tokens=128
scripts/install-deps >/dev/null
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DNABLA_BENCH=ON >/dev/null
ninja -C build nabla_cli nabla_bench_train >/dev/null
. tests/node_check.sh
npm_install tests/models/llama_cpp_js install --omit=optional --ignore-scripts --no-save >&2
work=$(mktemp -d)
build/bench/nabla_bench_train --model smollm2-135m --save "$work/model.safetensors"
build/nabla export gguf "$work/model.safetensors" --tokenizer byte -o "$work/model.gguf" >/dev/null
# Printable ASCII from the fortunes: one byte, one token, on both sides.
prompt=$(head -c $((4 * prompt_tokens)) /usr/share/games/fortunes/fortunes | LC_ALL=C tr -c '[:print:]' ' ' |
  LC_ALL=C cut -c 1-$prompt_tokens)
printf '%s' "$prompt" >"$work/prompt.txt"
for ((r = 1; r <= reps; r++)); do
  echo "round $r/$reps" >&2
  build/nabla sample --checkpoint "$work/model.gguf" --prompt "$prompt" --tokens $new_tokens \
    --temperature 0 --ignore-eos --threads 2 --timings 2>>"$work/nabla.txt" >/dev/null
  node bench/peers/llama_cpp_sample.mjs tests/models/llama_cpp_js/node_modules/node-llama-cpp "$work/model.gguf" \
    "$work/prompt.txt" $new_tokens 2 >>"$work/llama_cpp.txt"
done
/usr/bin/python3 - "$work" "$reps" <<'PY'
import re, sys, datetime, subprocess
work, reps = sys.argv[1], sys.argv[2]
def rates(path):
    text = open(path).read()
    prompt = [float(x) for x in re.findall(r"prompt: .*\(([\d.]+) tokens/s\)", text)]
    gen = [float(x) for x in re.findall(r"generation: .*\(([\d.]+) tokens/s\)", text)]
    return max(prompt), max(gen)
n, l = rates(f"{work}/nabla.txt"), rates(f"{work}/llama_cpp.txt")
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
print(f"\n{datetime.date.today()}, {cpu}, 2 threads; SmolLM2-135M's shape, f32 GGUF; best of {reps} runs each\n")
print("| | nabla sample | llama.cpp (node-llama-cpp) | ratio |")
print("|---|---|---|---|")
print(f"| prompt, 256 tokens (tokens/s) | {n[0]:.1f} | {l[0]:.1f} | {n[0] / l[0]:.2f} |")
print(f"| generation, 128 tokens (tokens/s) | {n[1]:.1f} | {l[1]:.1f} | {n[1] / l[1]:.2f} |")
PY
echo "raw results: $work" >&2
