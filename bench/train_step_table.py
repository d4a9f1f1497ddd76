#!/usr/bin/env python3
"""The table of bench/train_step.sh from its results file (one JSON line per
run): medians of the interleaved rounds, and, because a busy host slows
whole rounds, the best round of each side against the other's.

Usage: bench/train_step_table.py RESULTS.jsonl ROUNDS
"""
import json, statistics, sys, platform, datetime, subprocess
rows = [json.loads(l) for l in open(sys.argv[1])]
machine = {}
for r in rows:
    if r.get("kind") == "machine":
        best = machine.setdefault(r["threads"], dict(r))
        best["fma_gflops"] = max(best["fma_gflops"], r["fma_gflops"])
        best["sgemm_gflops"] = max(best["sgemm_gflops"], r["sgemm_gflops"])
        best["gemm_gflops"] = max(best["gemm_gflops"], r["gemm_gflops"])
fma2, sgemm2, gemm2 = machine[2]["fma_gflops"], machine[2]["sgemm_gflops"], machine[2]["gemm_gflops"]
target = {"vit-tiny": 1.5, "fmnist": 2.0, "gpt2-small-byte": 2.0, "gpt2": 1.5, "smollm2-135m": 1.5,
          "smollm2-135m-lora16": 1.5}
def med(xs):
    return statistics.median(xs) if xs else float("nan")
def best_setting(runs):
    """PyTorch's thread setting with the best median, and its runs."""
    settings = {}
    for r in runs:
        key = f"{r['torch_threads']} torch thread(s)" + (f", OPENBLAS_NUM_THREADS={r['openblas_threads']}" if r["openblas_threads"] else "") + (f", OMP_WAIT_POLICY={r['omp_wait_policy']}" if r["omp_wait_policy"] else "")
        settings.setdefault(key, []).append(r)
    key = max(settings, key=lambda k: med([r["per_s"] for r in settings[k]]))
    return key, settings[key]
equal_work = []
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
print(f"\n{datetime.date.today()}, {cpu}, {machine[2]['threads']} threads; FMA peak {machine[1]['fma_gflops']:.0f} "
      f"GFLOP/s (1 thread), {fma2:.0f} (2); OpenBLAS sgemm {sgemm2:.0f} GFLOP/s on 2 threads, nabla's gemm "
      f"{gemm2:.0f} ({machine[2]['gemm']}), bf16 on {machine[2].get('gemm_bf16', 'avx512')}; "
      f"medians of {sys.argv[2]} interleaved rounds\n")
print("| configuration | nabla | PyTorch (best setting) | ratio (target) | best round vs best round | nabla matmul GFLOP/s | % of FMA peak | % of OpenBLAS sgemm | peak RSS nabla / torch (ratio) | 2 vs 1 thread | nabla --bf16-matmul (ratio to PyTorch f32) | nabla in the other memory mode (--low-memory, or --no-low-memory where low memory is the default): peak RSS (ratio to torch), speed (to nabla's default) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
order = ["vit-tiny", "fmnist", "gpt2-small-byte", "gpt2", "smollm2-135m", "smollm2-135m-lora16"]
for m in order:
    nabla = [r for r in rows if r.get("framework") == "nabla" and r["model"] == m]
    # Runs with --replicas given compare the ways of using two threads.
    split = [r for r in nabla if r.get("replicas_given") and r["threads"] == 2]
    # Older results files lack low_memory_given: --low-memory was never the default.
    memory_given = lambda r: r.get("low_memory_given", r.get("low_memory"))
    plain = [r for r in nabla if not memory_given(r) and not r.get("replicas_given")]
    n2 = [r for r in plain if r["threads"] == 2 and not r.get("bf16_matmul")]
    nb = [r for r in plain if r["threads"] == 2 and r.get("bf16_matmul")]
    nl = [r for r in nabla if memory_given(r) and r["threads"] == 2 and not r.get("bf16_matmul")]
    if not n2:
        continue
    n1 = [r for r in plain if r["threads"] == 1 and not r.get("bf16_matmul")]
    t = [r for r in rows if r.get("framework") == "torch" and r["model"] == m and not r.get("class_token_last_block")]
    best_key, tb = best_setting(t)
    unit = n2[0]["unit"]
    nps, tps = med([r["per_s"] for r in n2]), med([r["per_s"] for r in tb])
    nabla_best = max(r["per_s"] for r in n2)  # for best round against best round
    pruned = [r for r in rows if r.get("framework") == "torch" and r["model"] == m and r.get("class_token_last_block")]
    if pruned:
        pruned_key, pruned_runs = best_setting(pruned)
        pps = med([r["per_s"] for r in pruned_runs])
        # As the table's column: a slow phase of the host can take most of
        # one side's rounds, and then the medians alone mislead.
        pbest = nabla_best / max(r["per_s"] for r in pruned)
        equal_work.append(f"{m}: PyTorch with its last block on the class token alone (--class-token-last-block, "
                          f"{pruned_key}) {pps:,.1f} {unit}/s, {100 * (pps / tps - 1):+.0f}% against its full last "
                          f"block; nabla {nps:,.1f}: {nps / pps:.2f}x at equal work, {pbest:.2f}x best round "
                          f"against best round")
    gf = med([r["gflops"] for r in n2])
    nrss, trss = med([r["peak_rss_mib"] for r in n2]), med([r["peak_rss_mib"] for r in tb])
    scale = nps / med([r["per_s"] for r in n1]) if n1 else float("nan")
    shape = f"batch {n2[0]['batch']}" + (f" x {n2[0]['context']}" if n2[0]["context"] else "")
    replicas = n2[0].get("replicas", 1)
    if replicas > 1:
        shape += f" ({replicas} replicas on 2 threads)"
    if n2[0].get("low_memory"):
        shape += f" (low memory: {n2[0]['factored']} gradients factored)"
    scale_cell = f"{scale:.2f}x"
    if split and n1:
        scale_cell += f" ({med([r['per_s'] for r in split]) / med([r['per_s'] for r in n1]):.2f}x with 1 replica, kernels split)"
    ok = "met" if nps / tps >= target[m] else "not met"
    bps = med([r["per_s"] for r in nb])
    bf16 = f"{bps:,.0f} {unit}/s ({bps / tps:.2f}x)" if nb else "-"
    best = nabla_best / max(r["per_s"] for r in t)
    low = "-"
    if nl:
        lrss, lps = med([r["peak_rss_mib"] for r in nl]), med([r["per_s"] for r in nl])
        flag = "--low-memory" if nl[0]["low_memory"] else "--no-low-memory"
        low = (f"{flag}: {lrss:,.0f} MiB ({lrss / trss:.2f}x), {lps / nps:.2f}x; {nl[0]['factored']} gradient(s) factored")
    print(f"| {m} {shape} | {nps:,.0f} {unit}/s | {tps:,.0f} {unit}/s ({best_key}) | {nps / tps:.2f}x ({target[m]}x: {ok}) | {best:.2f}x "
          f"| {gf:.0f} | {100 * gf / fma2:.0f}% | {100 * gf / sgemm2:.0f}% | {nrss:,.0f} / {trss:,.0f} MiB ({nrss / trss:.2f}x) "
          f"| {scale_cell} | {bf16} | {low} |")
print()
for line in equal_work:
    print(f"Equal work, {line}.")
if equal_work:
    print()
# LoRA's memory modes against its default run (f32 base, activations kept):
# gradient checkpointing, a Q8_0 base kept quantized (QLoRA), and both.
lora = [r for r in rows if r.get("framework") == "nabla" and r["model"] == "smollm2-135m-lora16" and r["threads"] == 2
        and not r.get("bf16_matmul") and not r.get("replicas_given")]
modes = [("gradient checkpointing, f32 base", "smollm2-135m-ckpt-lora16"), ("Q8_0 base", "smollm2-135m-Q8_0-lora16"),
         ("Q8_0 base, gradient checkpointing", "smollm2-135m-ckpt-Q8_0-lora16")]
if lora and any(r.get("model") == m for _, m in modes for r in rows):
    base_rss, base_ps = med([r["peak_rss_mib"] for r in lora]), med([r["per_s"] for r in lora])
    print(f"SmolLM2-135M LoRA r 16 (all seven projections, 4 x 256 tokens, 2 threads), against its f32-base run "
          f"({base_ps:,.0f} tokens/s, peak RSS {base_rss:,.0f} MiB):\n")
    print("| mode | tokens/s (ratio) | peak RSS (ratio; QLoRA target 0.35x with a Q8_0 base) | planned arena |")
    print("|---|---|---|---|")
    for name, m in modes:
        runs = [r for r in rows if r.get("framework") == "nabla" and r["model"] == m]
        if not runs:
            continue
        rss, ps, arena = (med([r[k] for r in runs]) for k in ("peak_rss_mib", "per_s", "arena_mib"))
        rss_all = ", ".join(f"{r['peak_rss_mib']:,.0f}" for r in runs)
        print(f"| {name} | {ps:,.0f} ({ps / base_ps:.2f}x) | {rss:,.0f} MiB ({rss / base_rss:.2f}x; rounds {rss_all}) "
              f"| {arena:,.0f} MiB |")
    print()
