#!/usr/bin/env python3
"""Cross-checks nabla's ViT against an independent PyTorch implementation.

Usage: vit_oracle.py NABLA_BIN [--preset small|vit-tiny] [--batch N] [--no-loader] [--keep DIR]

A ViT written here in plain PyTorch, to timm's VisionTransformer structure and
parameter names (timm itself is not imported), gets random weights; nabla reads
them from a safetensors file, runs `nabla grad` on a batch, and the loss and
every parameter gradient must equal torch's. Then (unless --no-loader) a
checkpoint written by `nabla train vit` must load into the torch model by name
(strict), with torch's gradients and per-image class probabilities equal to
nabla's on real Fashion-MNIST images.

Tolerance, per tensor: max|nabla - torch| <= RTOL * max(|torch|) + ATOL, both
in f32 (grad_compare.py). The table also prints each side's distance from
torch in f64, which says which side is off when the check fails. Exits 1 on
any mismatch.

Run with Debian's /usr/bin/python3 (python3-torch); a missing torch is a
failure, not a skip.
"""
import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"vit_oracle: PyTorch is required ({e}); install Debian's python3-torch (scripts/install-deps) "
             f"and run with /usr/bin/python3")

# Attention through F.scaled_dot_product_attention (PyTorch 2's fused kernels),
# as the libraries use it on a GPU; the gradient oracles keep the explicit
# product and softmax (PyTorch 1.13 has no fused attention).
FUSED_ATTENTION = False

import grad_compare
from grad_compare import Report, nabla_grad
from safetensors_io import DTYPE_NAMES, read_safetensors, write_safetensors

torch.set_num_threads(1)  # PyTorch's default thread count is very slow on small shared machines

# max|diff| <= RTOL * max|g| + ATOL. f32 rounding in either framework (summation
# order, fused kernels) is up to ~2e-6 of a tensor's largest entry here, for
# torch against its own f64 as for nabla against torch (small configs and
# vit-tiny alike); RTOL leaves ~4x over that. A wrong LayerNorm eps (1e-6 for
# 1e-3), tanh for erf GELU or pooling before the norm exceeds it by 60x or more.
RTOL = 1e-5
ATOL = 1e-7
# Loss: relative to |loss|.
LOSS_RTOL = 1e-6

# ---------------------------------------------------------------------------
# The model: timm's VisionTransformer, reduced to what nabla's config names.
# global_pool "token": cls token, final norm, x[:, 0] (timm's default ViT).
# global_pool "avg": no cls token, final norm, mean over tokens: timm's
#   VisionTransformer(class_token=False, global_pool="avg", fc_norm=False), as
#   in its *_gap_* models. NOTE: timm's default for "avg" (fc_norm=None) puts
#   the norm after pooling under the name fc_norm; nabla does not model that.
# ---------------------------------------------------------------------------


def gelu_fn(name):
    if name == "gelu_erf":
        return lambda x: F.gelu(x)  # nn.GELU(): exact erf
    if name in ("gelu", "gelu_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu_quick":
        return lambda x: x * torch.sigmoid(1.702 * x)
    raise ValueError(f"unknown gelu {name!r}")


class PatchEmbed(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.proj = nn.Conv2d(c["in_chans"], c["embed_dim"], c["patch_size"], stride=c["patch_size"])

    def forward(self, x):  # [N, C, H, W] -> [N, T', D]
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["embed_dim"]
        self.num_heads = c["num_heads"]
        self.head_dim = d // self.num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(d, 3 * d, bias=c["qkv_bias"])
        self.proj = nn.Linear(d, d)

    def forward(self, x):  # timm's Attention.forward, fused where FUSED_ATTENTION (timm's default)
        n, t, d = x.shape
        qkv = self.qkv(x).reshape(n, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if FUSED_ATTENTION:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            x = attn @ v
        x = x.transpose(1, 2).reshape(n, t, d)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["embed_dim"]
        hidden = int(d * c["mlp_ratio"])
        self.fc1 = nn.Linear(d, hidden)
        self.act = gelu_fn(c["gelu"])
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, eps = c["embed_dim"], c["norm_eps"]
        self.norm1 = nn.LayerNorm(d, eps=eps)
        self.attn = Attention(c)
        self.norm2 = nn.LayerNorm(d, eps=eps)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        assert c["architecture"] == "vit" and c["global_pool"] in ("token", "avg"), c
        self.global_pool = c["global_pool"]
        d = c["embed_dim"]
        grid = c["img_size"] // c["patch_size"]
        tokens = grid * grid + (self.global_pool == "token")
        self.patch_embed = PatchEmbed(c)
        if self.global_pool == "token":
            self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, d))
        self.blocks = nn.Sequential(*[Block(c) for _ in range(c["depth"])])
        self.norm = nn.LayerNorm(d, eps=c["norm_eps"])
        self.head = nn.Linear(d, c["num_classes"])

    def forward(self, x):  # [N, C, H, W] -> logits [N, K]
        x = self.patch_embed(x)
        if self.global_pool == "token":
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.blocks(x + self.pos_embed)
        x = self.norm(x)
        x = x[:, 0] if self.global_pool == "token" else x.mean(dim=1)
        return self.head(x)


def randomize(model, gen):
    """Weights at scales where every path matters: linear and conv weights
    N(0, 1/fan_in), biases and LayerNorm shifts N(0, 0.1), LayerNorm gains
    1 + N(0, 0.2), cls token and position embedding N(0, 0.5)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name in ("cls_token", "pos_embed"):
                v = 0.5 * r
            elif "norm" in name and name.endswith(".weight"):
                v = 1 + 0.2 * r
            elif name.endswith(".bias"):
                v = 0.1 * r
            else:
                v = r / math.sqrt(p[0].numel())  # fan_in: D*P*P for the conv, in for Linear
            p.copy_(v.to(p.dtype))


# ---------------------------------------------------------------------------
# Comparison (the table and the safetensors files: grad_compare.py,
# safetensors_io.py)
# ---------------------------------------------------------------------------
def torch_grads(model, images, labels, dtype):
    m = VisionTransformer(model.config).to(dtype)
    m.load_state_dict(model.state_dict())
    m.zero_grad()
    logits = m(images.to(dtype))
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    return loss.detach(), {n: p.grad.detach() for n, p in m.named_parameters()}, logits.detach()


def compare(title, report, model, images, labels, got):
    """`got`: nabla's output tensors (loss, grad.<name>)."""
    loss32, g32, _ = torch_grads(model, images, labels, torch.float32)
    loss64, g64, _ = torch_grads(model, images, labels, torch.float64)
    grad_compare.compare(title, report, got, (loss32, g32), (loss64, g64), RTOL, ATOL, LOSS_RTOL)


def small_config(pool):
    return {"architecture": "vit", "img_size": 16, "patch_size": 4, "in_chans": 3, "embed_dim": 32,
            "depth": 2, "num_heads": 4, "mlp_ratio": 2.0, "num_classes": 5, "global_pool": pool,
            "qkv_bias": True, "norm_eps": 1e-6, "gelu": "gelu_erf", "drop_rate": 0.0, "preset": ""}


def vit_tiny_config():
    # nabla's "vit-tiny" preset: timm's vit_tiny_patch16_224.
    return {"architecture": "vit", "img_size": 224, "patch_size": 16, "in_chans": 3, "embed_dim": 192,
            "depth": 12, "num_heads": 3, "mlp_ratio": 4.0, "num_classes": 1000, "global_pool": "token",
            "qkv_bias": True, "norm_eps": 1e-6, "gelu": "gelu_erf", "drop_rate": 0.0, "preset": "vit-tiny"}


def build(config):
    m = VisionTransformer(config)
    m.config = config
    return m


def grad_check(nabla, work, report, title, config, n, seed, label_dtype):
    gen = torch.Generator().manual_seed(seed)
    model = build(config)
    randomize(model, gen)
    c = config
    images = torch.randn((n, c["in_chans"], c["img_size"], c["img_size"]), generator=gen)
    labels = torch.randint(0, c["num_classes"], (n,), generator=gen)
    tag = title.replace(" ", "_")
    w, b, o = (os.path.join(work, f"{tag}.{s}.safetensors") for s in ("weights", "batch", "grads"))
    write_safetensors(w, model.state_dict(), {"format": "pt", "nabla.config": json.dumps(config)})
    write_safetensors(b, {"images": images, "labels": labels.to(label_dtype)})
    got = nabla_grad(nabla, w, b, o)
    compare(f"{title} (labels {DTYPE_NAMES[label_dtype]})", report, model, images, labels, got)


def fashion_mnist_test(n):
    """The first n test images, scaled to [0, 1] and standardised; labels i64."""
    d = "/usr/share/datasets/fashion-mnist"
    with gzip.open(os.path.join(d, "t10k-images-idx3-ubyte.gz")) as f:
        raw = f.read(16 + n * 784)
    with gzip.open(os.path.join(d, "t10k-labels-idx1-ubyte.gz")) as f:
        lab = f.read(8 + n)
    x = torch.tensor(list(raw[16:]), dtype=torch.float32).reshape(n, 1, 28, 28) / 255
    return (x - 0.2860) / 0.3530, torch.tensor(list(lab[8:]), dtype=torch.int64)


def loader_check(nabla, work, report):
    """A checkpoint that `nabla train vit` wrote loads into the torch model by
    name (strict), and the loaded model computes what nabla computes."""
    ckpt = os.path.join(work, "fmnist.safetensors")
    r = subprocess.run([nabla, "train", "vit", "--preset", "fmnist", "--max-steps", "2", "--train-subset", "256",
                        "--test-subset", "100", "--save", ckpt], capture_output=True, text=True)
    if r.returncode != 0:
        report.fail(f"nabla train vit exited {r.returncode}:\n{r.stdout}{r.stderr}")
        return
    tensors, meta = read_safetensors(ckpt)
    config = json.loads(meta["nabla.config"])
    model = build(config)
    params = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    state = model.state_dict()
    print(f"\n== loader: {ckpt}: {len(params)} parameters, {len(tensors) - len(params)} optimizer tensors, "
          f"config {meta['nabla.config']}")
    for k, v in params.items():
        if v.dtype != torch.float32:
            report.fail(f"loader: {k} is {v.dtype}, expected float32")
        if k in state and tuple(v.shape) != tuple(state[k].shape):
            report.fail(f"loader: {k} is {tuple(v.shape)} in the checkpoint, {tuple(state[k].shape)} in torch")
    try:
        model.load_state_dict(params, strict=True)
    except RuntimeError as e:
        report.fail(f"loader: strict load_state_dict failed: {e}")
        return
    # Optimizer state names the parameters it belongs to, with their shapes.
    for k, v in tensors.items():
        if k.startswith("optimizer."):
            p = k.split(".", 2)[2]
            if p not in params or tuple(params[p].shape) != tuple(v.shape):
                report.fail(f"loader: optimizer tensor {k} {tuple(v.shape)} matches no parameter")
    # A trained model should differ from torch's fresh init: the load did something.
    fresh = build(config).state_dict()
    assert any(not torch.equal(fresh[k], params[k]) for k in params)

    images, labels = fashion_mnist_test(16)
    b, o = os.path.join(work, "fmnist.batch.safetensors"), os.path.join(work, "fmnist.grads.safetensors")
    write_safetensors(b, {"images": images, "labels": labels})
    compare("loader: nabla checkpoint, 16 Fashion-MNIST test images", report, model, images, labels,
            nabla_grad(nabla, ckpt, b, o))

    # Per image: with a batch of one, d loss / d head.bias = softmax(logits) - onehot(label),
    # so nabla's gradient gives its class probabilities, which torch's logits must match.
    with torch.no_grad():
        probs = model(images).softmax(-1)
    worst = 0.0
    for i in range(4):
        write_safetensors(b, {"images": images[i:i + 1], "labels": labels[i:i + 1]})
        got = nabla_grad(nabla, ckpt, b, o)
        p = got["grad.head.bias"].clone()
        p[labels[i]] += 1
        d = (p - probs[i]).abs().max().item()
        worst = max(worst, d)
        if d > 1e-6:
            report.fail(f"loader: image {i}: nabla probabilities {p.tolist()} torch {probs[i].tolist()}")
    print(f"per-image class probabilities (4 images): max|nabla - torch| {worst:.2e} (limit 1e-6); "
          f"torch argmax {probs[:4].argmax(-1).tolist()}, labels {labels[:4].tolist()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nabla", help="path to the nabla binary")
    ap.add_argument("--preset", choices=["small", "vit-tiny"], default="small")
    ap.add_argument("--batch", type=int, default=0, help="batch size (default: 3 small, 2 vit-tiny)")
    ap.add_argument("--no-loader", action="store_true", help="skip the trained-checkpoint loader check")
    ap.add_argument("--keep", help="write the files here and keep them")
    a = ap.parse_args()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="nabla_oracle_") as tmp:
        work = a.keep or tmp
        os.makedirs(work, exist_ok=True)
        if a.preset == "small":
            n = a.batch or 3
            grad_check(a.nabla, work, report, "small token", small_config("token"), n, 1, torch.int64)
            grad_check(a.nabla, work, report, "small avg", small_config("avg"), n, 2, torch.int64)
            # tanh GELU, no qkv bias, an eps large enough to matter at f32 tolerance; labels as I32.
            variant = dict(small_config("token"), gelu="gelu", qkv_bias=False, norm_eps=1e-3)
            grad_check(a.nabla, work, report, "small token tanh-gelu no-qkv-bias", variant, n, 4, torch.int32)
        else:
            grad_check(a.nabla, work, report, "vit-tiny", vit_tiny_config(), a.batch or 2, 3, torch.int64)
        if not a.no_loader:
            loader_check(a.nabla, work, report)
    if report.failures:
        print(f"\n{len(report.failures)} mismatch(es)")
        return 1
    print("\nnabla agrees with PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
