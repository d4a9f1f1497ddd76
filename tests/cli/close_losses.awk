# awk -f close_losses.awk A.log B.log: two training logs (nabla finetune or
# train) report the same losses, every step's ("... step 3/8 loss 5.3138 ...")
# and the final validation loss, each within 2e-4 of A's (the log prints
# 4 decimals; two backends' kernels round differently). At least 4 of them.
function collect(line, out, n,   i, f, k) {
  k = split(line, f, " ")
  for (i = 1; i < k; ++i) if (f[i] ~ /^[0-9]+\/[0-9]+$/ && f[i - 1] == "step" && f[i + 1] == "loss") out[++n] = f[i + 2]
  if (line ~ /final validation loss/) out[++n] = f[k]
  return n
}
FNR == NR { na = collect($0, a, na); next }
{ nb = collect($0, b, nb) }
END {
  if (na < 4 || na != nb) { printf "%d and %d losses reported (at least 4, as many in each)\n", na, nb; exit 1 }
  for (i = 1; i <= na; ++i) {
    d = a[i] - b[i]
    if (d > 2e-4 * a[i] || -d > 2e-4 * a[i]) bad = 1
  }
  if (bad) { for (i = 1; i <= na; ++i) printf "%s\t%s\n", a[i], b[i]; print "the losses differ"; exit 1 }
  printf "%d losses agree\n", na
}
