#!/usr/bin/env python3
"""PyTorch peer of nabla_bench_train: the same model (from the same config
JSON, built by the oracle tests' PyTorch models), the same synthetic batch
shape, AdamW with clipping at 1.0, timed the same way (median step after
warm-up). Prints one JSON line.

Usage: train_step.py --config JSON --batch B [--context T] [--steps N]
                     [--warmup W] [--torch-threads N] [--class-token-last-block]

--class-token-last-block gives a ViT with class-token pooling the change
nabla's Vit makes: its last block computes the class token's row alone
(every token still a key and value), the same loss and gradients for about
7% less matmul work at vit-tiny. Off by default: the peer is the model as
timm writes it; on, it measures the two at equal work (docs/performance.md).

Thread settings are the caller's: bench/train_step.sh runs this under each of
PyTorch's good settings on this machine (1 torch thread with
OPENBLAS_NUM_THREADS=2; 2 threads with OMP_WAIT_POLICY=PASSIVE) and keeps
the faster.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "oracle"))


def build(config):
    if config["architecture"] == "vit":
        from vit_oracle import VisionTransformer
        return VisionTransformer(config)
    if config["architecture"] == "llama":
        from llama_oracle import Llama
        model = Llama(llama_config(config))
        for m in model.modules():  # Hugging Face's _init_weights
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=config["initializer_range"])
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                torch.nn.init.zeros_(m.bias)
        return model
    from gpt2_oracle import Gpt2
    model = Gpt2(config)
    # GPT-2's init, as nabla's (the oracle's Conv1D starts at zero, its
    # embeddings at N(0, 1): a first loss near 268 instead of ln(vocab)).
    resid_std = 0.02 / math.sqrt(2 * max(1, config["n_layer"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") or ".ln_" in name or name.startswith("ln_f"):
                continue  # zero biases, LayerNorm at 1 and 0, as constructed
            torch.nn.init.normal_(p, std=resid_std if name.endswith("c_proj.weight") else 0.02)
    return model


def llama_config(c):
    """nabla's Llama config.json with the keys Hugging Face leaves implied
    written out, as the oracle's Llama reads them."""
    c = dict(c)
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    c.setdefault("attention_bias", c.get("model_type") == "qwen2")
    return c


def class_token_last_block(model):
    """The last block's forward on the class token's row alone: its query,
    output projection, residual and MLP; keys and values from every token."""
    blk, attn = model.blocks[-1], model.blocks[-1].attn
    d = attn.qkv.weight.shape[1]
    w, b = attn.qkv.weight, attn.qkv.bias

    def part(x, lo, hi):
        return F.linear(x, w[lo:hi], None if b is None else b[lo:hi])

    def forward(x):  # [N, T, D] -> [N, 1, D]
        h = blk.norm1(x)
        n, t, _ = h.shape
        q = part(h[:, :1], 0, d).reshape(n, 1, attn.num_heads, attn.head_dim).transpose(1, 2)
        kv = part(h, d, 3 * d).reshape(n, t, 2, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)
        p = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        y = x[:, :1] + attn.proj((p @ v).transpose(1, 2).reshape(n, 1, d))
        return y + blk.mlp(blk.norm2(y))

    blk.forward = forward


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="model config JSON (nabla_bench_train --config)")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--context", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--lora", type=int, default=0,
                    help="Llama: LoRA adapters of this rank (alpha 2r, no dropout) on all seven projections of a "
                         "frozen base, PEFT's LoraLayer, instead of training every weight")
    ap.add_argument("--class-token-last-block", action="store_true",
                    help="a class-token ViT's last block on the class token alone, as nabla's")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (PyTorch eager on the GPU)")
    ap.add_argument("--bf16", action="store_true",
                    help="on the GPU: the forward and backward under torch.autocast(bfloat16), mixed precision "
                         "as PyTorch users train (nabla's peer under --bf16-matmul)")
    ap.add_argument("--explicit-attention", action="store_true",
                    help="on the GPU: attention as its product and softmax, not F.scaled_dot_product_attention")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda" and not a.explicit_attention:
        import gpt2_oracle
        import vit_oracle
        gpt2_oracle.FUSED_ATTENTION = vit_oracle.FUSED_ATTENTION = True
    torch.set_num_threads(a.torch_threads)
    torch.manual_seed(7)
    config = json.loads(a.config)
    model = build(config)
    if a.class_token_last_block:
        if config["architecture"] != "vit" or config["global_pool"] != "token":
            sys.exit("train_step.py: --class-token-last-block needs a ViT with class-token pooling")
        class_token_last_block(model)
    if a.lora:
        if config["architecture"] != "llama":
            sys.exit("train_step.py: --lora takes a Llama config")
        from lora_oracle import add_lora
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        add_lora(model, targets, a.lora, 2.0, torch.Generator().manual_seed(7))
    model.to(dev)
    model.train()
    # nabla's default decay set: matrices and conv kernels, not biases, norms,
    # embeddings' tokens (same cost either way; kept for an identical update).
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # a frozen base: the adapters
    decay = [p for n, p in trained if p.dim() >= 2 and "pos_embed" not in n and "cls_token" not in n]
    no_decay = [p for n, p in trained if not (p.dim() >= 2 and "pos_embed" not in n and "cls_token" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-8)
    if config["architecture"] == "vit":
        c = config
        x = torch.randn(a.batch, c["in_chans"], c["img_size"], c["img_size"]).to(dev)
        y = torch.randint(0, c["num_classes"], (a.batch,)).to(dev)
        items, unit = a.batch, "images"

        def loss_fn():
            return F.cross_entropy(model(x), y)
    else:
        tokens = torch.randint(0, config["vocab_size"], (a.batch, a.context + 1)).to(dev)
        items, unit = a.batch * a.context, "tokens"

        def loss_fn():
            logits = model(tokens[:, :-1])
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    if a.bf16:
        if dev.type != "cuda":
            sys.exit("train_step.py: --bf16 is for --device cuda")
        unmixed = loss_fn

        def loss_fn():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return unmixed()

    # On the GPU a step's time is from the queue empty to the queue empty.
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times, first, last = [], None, None
    for i in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in trained], 1.0)
        opt.step()
        sync()
        dt = (time.perf_counter() - t0) * 1e3
        if i == 0:
            first = loss.item()
        if i >= a.warmup:
            times.append(dt)
        last = loss.item()
    times.sort()
    ms = times[len(times) // 2]
    print(json.dumps({
        "framework": "torch", "model": config.get("preset", "") + (f"-lora{a.lora}" if a.lora else ""),
        "batch": a.batch, "context": a.context,
        "class_token_last_block": a.class_token_last_block,
        "torch_threads": a.torch_threads, "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", ""),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""), "unit": unit, "step_ms": round(ms, 2),
        "per_s": round(items / (ms / 1e3), 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "first_loss": round(first, 4), "last_loss": round(last, 4), "device": a.device, "bf16": a.bf16,
        "peak_device_mib": round(torch.cuda.max_memory_allocated() / 1048576.0, 1) if dev.type == "cuda" else 0.0}))


if __name__ == "__main__":
    main()
