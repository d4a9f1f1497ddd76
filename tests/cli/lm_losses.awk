# Reads a `nabla train gpt2|llama` log: the training loss must fall to under
# 0.7 of its first report, and the last validation loss be below 3.0 nats
# (under the fortunes' byte unigram entropy, 3.32: the model uses context).
# "step 25/300 loss 4.4441 ..." (training, mean over a window);
# "step 300: validation loss 2.7937, ..."
$1 == "step" && $3 == "loss" { if (first == "") first = $4; last = $4 }
$1 == "step" && $3 == "validation" { val = $5; sub(",", "", val) }
END {
  if (first == "" || val == "") { print "no training or validation loss was reported"; exit 1 }
  if (last + 0 >= 0.7 * first) { printf "training loss did not fall enough: first %s, last %s\n", first, last; exit 1 }
  if (val + 0 >= 3.0) { printf "final validation loss %s is not below 3.0\n", val; exit 1 }
  printf "training loss fell from %s to %s; final validation loss %s\n", first, last, val
}
