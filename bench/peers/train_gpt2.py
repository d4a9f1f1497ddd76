#!/usr/bin/env python3
"""PyTorch peer of `nabla train gpt2` for bench/train_gpt2_vs_torch.sh: the
same model (its initial weights read from nabla's step-0 checkpoint), the same
token streams (`nabla tokenize --dataset-out`), the same batches (TextBatcher's
counter-based windows, reproduced below), the same AdamW (betas 0.9/0.95, eps
1e-8, decoupled weight decay on matrices except wpe), clipping, warmup +
cosine schedule and validation windows. Trains until --steps or
--max-minutes of training time (validation excluded, as in nabla), printing
validation losses, and writes a CSV of the curve.
"""
import argparse
import csv
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "tests", "oracle"))
from gpt2_oracle import Gpt2  # noqa: E402
from safetensors_io import read_safetensors  # noqa: E402

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(x):  # splitmix64's finaliser, as src/text/text_data.cpp
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def batch(stream, B, T, seed, step):
    """TextBatcher::batch: row b is the window at an offset drawn from (seed, step, b)."""
    offsets = len(stream) - (T + 1) + 1
    h = mix64(mix64((seed + GOLDEN) & MASK) ^ (step & MASK))
    starts = [((mix64(h ^ ((b * GOLDEN) & MASK)) * offsets) >> 64) for b in range(B)]
    return torch.stack([stream[s:s + T + 1] for s in starts]).long()


def warmup_cosine(step, warmup, total, base, min_lr):  # optim::warmup_cosine
    if warmup > 0 and step < warmup:
        return base * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (base - min_lr) * (1 + math.cos(math.pi * progress))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", required=True, help="nabla checkpoint with the initial weights and config")
    ap.add_argument("--data", required=True, help="token streams from `nabla tokenize --dataset-out`")
    ap.add_argument("--steps", type=int, required=True, help="schedule length (as nabla's --steps)")
    ap.add_argument("--max-minutes", type=float, default=0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--csv", help="write step, val_loss, train_loss, elapsed_s here")
    a = ap.parse_args()
    torch.set_num_threads(a.torch_threads)

    weights, meta = read_safetensors(a.init)
    config = json.loads(meta["nabla.config"])
    model = Gpt2(config)
    model.load_state_dict({k: v for k, v in weights.items() if not k.startswith("optimizer.")}, strict=True)
    streams, _ = read_safetensors(a.data)
    train, val = streams["train"], streams["val"]
    B, T = a.batch, a.context

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "wpe" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    val_batches = [batch(val, B, T, a.seed + 1, i) for i in range(a.eval_batches)]

    def loss_of(tokens):
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    def validate():
        model.eval()
        with torch.no_grad():
            v = sum(loss_of(t).item() for t in val_batches) / len(val_batches)
        model.train()
        return v

    rows, train_time, step, last_val = [], 0.0, 0, float("nan")
    window = []
    model.train()
    while step < a.steps:
        t0 = time.perf_counter()
        tokens = batch(train, B, T, a.seed, step)
        lr = warmup_cosine(step, a.warmup, a.steps, a.lr, a.lr * 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss = loss_of(tokens)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        step += 1
        window.append(loss.item())
        train_time += time.perf_counter() - t0
        out_of_time = a.max_minutes > 0 and train_time >= a.max_minutes * 60
        if step % a.log_every == 0:
            print(f"torch step {step}/{a.steps} loss {sum(window) / len(window):.4f} "
                  f"{step * B * T / train_time:.0f} tok/s", flush=True)
            window = []
        if step % a.eval_every == 0 or step == a.steps or out_of_time:
            last_val = validate()
            rows.append((step, last_val, loss.item(), train_time))
            print(f"torch step {step}: validation loss {last_val:.4f}, {train_time:.0f} s of training", flush=True)
        if out_of_time:
            break
    print(f"torch done: {step} steps in {train_time:.0f} s of training ({step * B * T / train_time:.0f} tokens/s); "
          f"final validation loss {last_val:.4f}", flush=True)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "val_loss", "train_loss", "elapsed_s"])
            w.writerows(rows)


if __name__ == "__main__":
    main()
