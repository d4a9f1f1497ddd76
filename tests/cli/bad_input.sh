#!/bin/sh
# Bad input to the `nabla` command: each CASE must exit with status 2 and
# exactly one line on stderr, "nabla: error: ..." containing an expected
# phrase, never a crash, an abort or a stack trace.
# Usage: bad_input.sh PATH_TO_NABLA WORK_DIR CASE
set -u
nabla=$1 dir=$2 case=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1

# IDX files: u8 magic (00 00 08 RANK), big-endian u32 dims, then the bytes.
u32() { printf "\\$(printf %03o $(($1 >> 24 & 255)))\\$(printf %03o $(($1 >> 16 & 255)))"; printf "\\$(printf %03o $(($1 >> 8 & 255)))\\$(printf %03o $(($1 & 255)))"; }
idx_images() {  # PATH N SIDE
  { printf '\000\000\010\003'; u32 "$2"; u32 "$3"; u32 "$3"; head -c $(($2 * $3 * $3)) /dev/zero; } >"$1"
}
idx_labels() {  # PATH LABEL... (each 0..255)
  path=$1; shift
  { printf '\000\000\010\001'; u32 $#; for l in "$@"; do printf "\\$(printf %03o "$l")"; done; } >"$path"
}
# A Fashion-MNIST directory of N images of SIDE x SIDE, labels given.
fashion_dir() {  # DIR SIDE LABEL...
  d=$1 side=$2; shift 2
  mkdir -p "$d"
  for split in train t10k; do
    idx_images "$d/$split-images-idx3-ubyte" $# "$side"
    idx_labels "$d/$split-labels-idx1-ubyte" "$@"
  done
}
tiny_vit="--depth 1 --embed-dim 16 --heads 2 --batch 8 --eval-batch 8 --max-steps 1 --threads 1"
vit_checkpoint() {  # PATH: a one-step ViT training checkpoint on made-up images
  fashion_dir "$dir/fm_ok" 28 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5
  "$nabla" train vit --data "$dir/fm_ok" $tiny_vit --save "$1" >"$dir/vit.log" 2>&1 ||
    { cat "$dir/vit.log"; echo "could not make a ViT checkpoint"; exit 1; }
}
gpt2_checkpoint() {  # PATH: a one-step GPT-2 training checkpoint on a short text
  i=0
  while [ $i -lt 200 ]; do echo "line $i of a short text for a tiny model"; i=$((i + 1)); done >"$dir/text.txt"
  "$nabla" train gpt2 --text "$dir/text.txt" --steps 1 --batch 1 --context 8 --eval-batches 1 --threads 1 \
      --save "$1" >"$dir/gpt2.log" 2>&1 || { cat "$dir/gpt2.log"; echo "could not make a GPT-2 checkpoint"; exit 1; }
}

# Runs the command; passes when it exits 2 with one stderr line that starts
# with "nabla: error: " and contains PHRASE.
expect_error() {  # PHRASE COMMAND...
  phrase=$1; shift
  "$@" >"$dir/stdout" 2>"$dir/stderr"
  status=$?
  err=$(cat "$dir/stderr")
  lines=$(wc -l <"$dir/stderr")
  echo "exit status $status; stderr: $err"
  [ "$status" -eq 2 ] || { echo "FAIL: expected exit status 2"; exit 1; }
  [ "$lines" -eq 1 ] || { echo "FAIL: expected one line on stderr, got $lines"; exit 1; }
  case "$err" in
    "nabla: error: "*"$phrase"*) echo "ok" ;;
    *) echo "FAIL: expected 'nabla: error: ...$phrase...'"; exit 1 ;;
  esac
}

case $case in
  unknown_option)
    expect_error "--no-such-option" "$nabla" train vit --no-such-option ;;
  unknown_dataset)
    expect_error "imagenet" "$nabla" train vit --dataset imagenet ;;
  bad_number)
    expect_error "not a number" "$nabla" train vit --lr fast ;;
  missing_data_dir)
    expect_error "$dir/nowhere: has neither train-images-idx3-ubyte" "$nabla" train vit --data "$dir/nowhere" ;;
  missing_cifar_dir)
    expect_error "$dir/nowhere/data_batch_1.bin: cannot open" "$nabla" train vit --dataset cifar10 --data "$dir/nowhere" ;;
  wrong_image_size)
    fashion_dir "$dir/fm32" 32 0 1 2 3
    expect_error "Fashion-MNIST images are 28x28 grey, got 1x32x32" "$nabla" train vit --data "$dir/fm32" $tiny_vit ;;
  truncated_images)
    fashion_dir "$dir/fm" 28 0 1 2 3
    head -c 1000 "$dir/fm/train-images-idx3-ubyte" >"$dir/fm/cut" && mv "$dir/fm/cut" "$dir/fm/train-images-idx3-ubyte"
    expect_error "train-images-idx3-ubyte: IDX shape [4, 28, 28] needs 3136 bytes of data" \
        "$nabla" train vit --data "$dir/fm" $tiny_vit ;;
  label_out_of_range)
    fashion_dir "$dir/fm" 28 0 1 12 3
    expect_error "label 12 of sample 2 is outside [0, 10)" "$nabla" train vit --data "$dir/fm" $tiny_vit ;;
  cifar_label_out_of_range)
    mkdir -p "$dir/cifar"
    for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
      { printf '\012'; head -c 3072 /dev/zero; } >"$dir/cifar/$f.bin"
    done
    expect_error "data_batch_1.bin: record 0 has label 10, expected 0 to 9" \
        "$nabla" train vit --dataset cifar10 --data "$dir/cifar" $tiny_vit ;;
  cifar_truncated)
    mkdir -p "$dir/cifar"
    head -c 3000 /dev/zero >"$dir/cifar/data_batch_1.bin"
    expect_error "data_batch_1.bin: 3000 bytes is not a whole number of 3073-byte CIFAR-10 records" \
        "$nabla" train vit --dataset cifar10 --data "$dir/cifar" $tiny_vit ;;
  empty_text)
    : >"$dir/empty.txt"
    expect_error "$dir/empty.txt: no text" "$nabla" train gpt2 --text "$dir/empty.txt" --steps 1 ;;
  eval_gpt2_checkpoint)
    gpt2_checkpoint "$dir/g.safetensors"
    expect_error "$dir/g.safetensors: vit config: architecture is \"gpt2\", expected \"vit\"" \
        "$nabla" eval "$dir/g.safetensors" ;;
  sample_vit_checkpoint)
    vit_checkpoint "$dir/v.safetensors"
    expect_error "$dir/v.safetensors: gpt2 config: architecture is \"vit\", expected \"gpt2\"" \
        "$nabla" sample --checkpoint "$dir/v.safetensors" --tokens 1 ;;
  resume_vit_from_gpt2)
    gpt2_checkpoint "$dir/g.safetensors"
    expect_error "$dir/g.safetensors: vit config: architecture is \"gpt2\", expected \"vit\"" \
        "$nabla" train vit --resume "$dir/g.safetensors" ;;
  resume_gpt2_from_vit)
    vit_checkpoint "$dir/v.safetensors"
    expect_error "$dir/v.safetensors: gpt2 config: architecture is \"vit\", expected \"gpt2\"" \
        "$nabla" train gpt2 --resume "$dir/v.safetensors" ;;
  truncated_checkpoint)
    vit_checkpoint "$dir/v.safetensors"
    head -c 2000 "$dir/v.safetensors" >"$dir/cut.safetensors"
    expect_error "$dir/cut.safetensors: " "$nabla" eval "$dir/cut.safetensors" ;;
  hf_folder_without_weights)
    mkdir -p "$dir/hf" && echo '{"model_type": "llama"}' >"$dir/hf/config.json"
    : >"$dir/batch.safetensors"
    expect_error "$dir/hf: a Hugging Face model folder needs model.safetensors or model.safetensors.index.json" \
        "$nabla" grad --weights "$dir/hf" --batch "$dir/batch.safetensors" --out "$dir/g.safetensors" ;;
  export_hf_gpt2)
    gpt2_checkpoint "$dir/g.safetensors"
    expect_error "$dir/g.safetensors: Hugging Face folders are written for llama checkpoints, this one is \"gpt2\"" \
        "$nabla" export hf "$dir/g.safetensors" -o "$dir/hf" ;;
  grad_gpt2_gguf)
    gpt2_checkpoint "$dir/g.safetensors"
    "$nabla" export gguf "$dir/g.safetensors" -o "$dir/g.gguf" >/dev/null || { echo "could not export"; exit 1; }
    : >"$dir/batch.safetensors"
    expect_error "$dir/g.gguf: general.architecture is \"gpt2\", nabla reads \"llama\", \"qwen2\", \"qwen3\", \"smollm3\", \"gemma2\", \"gemma3\" and \"phi3\" GGUF files" \
        "$nabla" grad --weights "$dir/g.gguf" --batch "$dir/batch.safetensors" --out "$dir/out.safetensors" ;;
  sample_probabilities)
    expect_error "--top-p: '0' is not in (0, 1]" "$nabla" sample --checkpoint "$dir" --top-p 0
    expect_error "--min-p: '1' is not in [0, 1)" "$nabla" sample --checkpoint "$dir" --min-p 1 ;;
  *)
    echo "bad_input.sh: unknown case '$case'"; exit 1 ;;
esac
