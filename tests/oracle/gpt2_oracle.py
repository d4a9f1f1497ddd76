#!/usr/bin/env python3
"""Cross-checks nabla's GPT-2 against an independent PyTorch implementation.

Usage: gpt2_oracle.py NABLA_BIN [--preset small|gpt2] [--batch N] [--context T]
                      [--adamw-steps N] [--no-loader] [--keep DIR]

A GPT-2 written here in plain PyTorch, to Hugging Face's GPT2LMHeadModel
semantics and GPT2Model's parameter names (transformers itself is not
imported), gets random weights; nabla reads them from a safetensors file, runs
`nabla grad` on a random batch of tokens, and the loss (mean next-token
cross-entropy over all B * T positions) and every parameter gradient must
equal torch's. `nabla grad --adamw-steps N` then trains N AdamW steps on that
batch, and the loss before each step must equal torch.optim.AdamW's (llm.c's
test_gpt2 check). Then (unless --no-loader) a checkpoint written by
`nabla train gpt2` must load into the torch model by name (strict), with the
same gradients and AdamW losses. With the small preset, malformed batches must
be refused with status 2 and a one-line message.

Gradient tolerance, per tensor: max|nabla - torch| <= RTOL * max(|torch|) +
ATOL, both in f32 (grad_compare.py); the table also prints each side's distance
from torch in f64. Exits 1 on any mismatch.

Run with Debian's /usr/bin/python3 (python3-torch); a missing torch is a
failure, not a skip.
"""
import argparse
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
    sys.exit(f"gpt2_oracle: PyTorch is required ({e}); install Debian's python3-torch (scripts/install-deps) "
             f"and run with /usr/bin/python3")

# Attention through F.scaled_dot_product_attention (PyTorch 2's fused kernels),
# as the libraries use it on a GPU; the gradient oracles keep the explicit
# product and softmax (PyTorch 1.13 has no fused attention).
FUSED_ATTENTION = False

import grad_compare
from grad_compare import Report, nabla_grad
from safetensors_io import DTYPE_NAMES, read_safetensors, write_safetensors

# max|diff| <= RTOL * max|g| + ATOL, as in vit_oracle.py: f32 rounding in
# either framework is about 1e-6 of a tensor's largest entry here (torch
# against its own f64 as much as nabla against torch); RTOL leaves room over
# that. A wrong LayerNorm eps, erf for tanh GELU, or a missing causal mask
# exceeds it by orders of magnitude.
RTOL = 1e-5
ATOL = 1e-7
LOSS_RTOL = 1e-6
# Losses before each AdamW step, relative. Adam's first steps move every
# element by about +-lr whatever its gradient's size, so rounding-level
# differences in tiny gradients (e.g. the key bias, whose exact gradient is
# zero) could move parameters apart by 2 lr; measured, the losses agree to
# 1.3e-7 or better. The weight decay is large (0.5) so that the decayed set
# matters: decaying wpe as well shows at 2.8e-5, eps 1e-6 for 1e-8 at 1.6e-5,
# beta2 0.999 for 0.95 at 4.9e-4.
ADAMW_LOSS_RTOL = 2e-6

# ---------------------------------------------------------------------------
# The model: Hugging Face's GPT2LMHeadModel, reduced to what nabla's config
# names. Pre-LN blocks, Conv1D weights [in, out], fused c_attn (q, k, v),
# causal attention scaled by 1/sqrt(head dim), ln_f, head tied to wte.
# ---------------------------------------------------------------------------


def gelu_fn(name):
    if name == "gelu":  # Hugging Face's "gelu_new" (NewGELUActivation), GPT-2's
        return lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    if name == "gelu_erf":
        return lambda x: F.gelu(x)
    if name == "gelu_quick":
        return lambda x: x * torch.sigmoid(1.702 * x)
    raise ValueError(f"unknown gelu {name!r}")


class Conv1D(nn.Module):
    """y = x W + b with W [in, out] (transformers.pytorch_utils.Conv1D)."""

    def __init__(self, n_in, n_out, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None

    def forward(self, x):
        y = x @ self.weight
        return y + self.bias if self.bias is not None else y


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["n_embd"]
        self.n_head = c["n_head"]
        self.c_attn = Conv1D(d, 3 * d, c["bias"])
        self.c_proj = Conv1D(d, d, c["bias"])

    def forward(self, x):  # GPT2Attention, eager; sdpa where FUSED_ATTENTION (Hugging Face's default)
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        heads = lambda y: y.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)  # [B, H, T, hd]
        q, k, v = heads(q), heads(k), heads(v)
        if FUSED_ATTENTION:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            w = (q @ k.transpose(-1, -2)) / math.sqrt(v.shape[-1])
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            w = w.masked_fill(~causal, float("-inf")).softmax(dim=-1)
            y = w @ v
        y = y.transpose(1, 2).reshape(b, t, d)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["n_embd"]
        self.c_fc = Conv1D(d, 4 * d, c["bias"])
        self.act = gelu_fn(c["gelu"])
        self.c_proj = Conv1D(4 * d, d, c["bias"])

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, eps = c["n_embd"], c["layer_norm_epsilon"]
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.attn = Attention(c)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt2(nn.Module):
    def __init__(self, c):
        super().__init__()
        assert c["architecture"] == "gpt2", c
        self.config = c
        d = c["n_embd"]
        self.wte = nn.Embedding(c["vocab_size"], d)
        self.wpe = nn.Embedding(c["n_positions"], d)
        self.h = nn.ModuleList([Block(c) for _ in range(c["n_layer"])])
        self.ln_f = nn.LayerNorm(d, eps=c["layer_norm_epsilon"])

    def forward(self, idx):  # [B, T] -> logits [B, T, V]
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # lm_head tied to wte

    def loss(self, tokens):
        """Mean next-token cross-entropy over all B * T positions of tokens [B, T + 1]."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def randomize(model, gen):
    """Weights at scales where every path matters: Conv1D weights N(0, 1/in),
    biases and LayerNorm shifts N(0, 0.1), LayerNorm gains 1 + N(0, 0.2),
    wte N(0, 4/D) (logits of order 2 through the tied head), wpe N(0, 1/D)."""
    d = model.config["n_embd"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name == "wte.weight":
                v = 2 * r / math.sqrt(d)
            elif name == "wpe.weight":
                v = r / math.sqrt(d)
            elif ".ln_" in name or name.startswith("ln_f"):
                v = 1 + 0.2 * r if name.endswith(".weight") else 0.1 * r
            elif name.endswith(".bias"):
                v = 0.1 * r
            else:
                v = r / math.sqrt(p.shape[0])  # Conv1D: fan_in is the first dimension
            p.copy_(v.to(p.dtype))


def nabla_decays(name, p):
    """nabla's optim::default_decay: weight decay for tensors of rank >= 2
    except position embeddings (so wte and the Conv1D weights)."""
    return p.dim() >= 2 and "wpe" not in name


# ---------------------------------------------------------------------------
# Torch's side
# ---------------------------------------------------------------------------
def copy_of(model, dtype):
    m = Gpt2(model.config).to(dtype)
    m.load_state_dict(model.state_dict())
    return m


def torch_grads(model, tokens, dtype):
    m = copy_of(model, dtype)
    loss = m.loss(tokens)
    loss.backward()
    return loss.detach(), {n: p.grad.detach() for n, p in m.named_parameters()}


def torch_adamw_losses(model, tokens, steps, opt, dtype):
    """The loss before each of `steps` AdamW steps on the same batch."""
    m = copy_of(model, dtype)
    decay = [p for n, p in m.named_parameters() if nabla_decays(n, p)]
    rest = [p for n, p in m.named_parameters() if not nabla_decays(n, p)]
    o = torch.optim.AdamW([{"params": decay, "weight_decay": opt["weight_decay"]},
                           {"params": rest, "weight_decay": 0.0}],
                          lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    losses = []
    for _ in range(steps):
        o.zero_grad()
        loss = m.loss(tokens)
        loss.backward()
        losses.append(loss.item())
        o.step()
    return losses


def compare_adamw(title, report, got, model, tokens, steps, opt):
    if steps == 0:
        return 0.0
    if "losses" not in got or tuple(got["losses"].shape) != (steps,):
        report.fail(f"{title}: nabla's output has no losses [{steps}]")
        return float("inf")
    nl = got["losses"].double().tolist()
    t32 = torch_adamw_losses(model, tokens, steps, opt, torch.float32)
    t64 = torch_adamw_losses(model, tokens, steps, opt, torch.float64)
    print(f"\n== {title}: {steps} AdamW steps on the same batch (lr {opt['lr']}, betas ({opt['beta1']}, "
          f"{opt['beta2']}), eps {opt['eps']}, weight decay {opt['weight_decay']} on rank >= 2 except wpe)")
    print(f"{'step':>4} {'nabla':>12} {'torch f32':>12} {'torch f64':>12} {'rel':>9} {'nabla-f64':>10} "
          f"{'torch-f64':>10}  ok")
    worst = 0.0
    for i in range(steps):
        rel = abs(nl[i] - t32[i]) / abs(t32[i])
        ok = rel <= ADAMW_LOSS_RTOL and math.isfinite(nl[i])
        worst = max(worst, rel)
        print(f"{i + 1:>4} {nl[i]:12.7f} {t32[i]:12.7f} {t64[i]:12.7f} {rel:9.2e} "
              f"{abs(nl[i] - t64[i]) / abs(t64[i]):10.2e} {abs(t32[i] - t64[i]) / abs(t64[i]):10.2e}  "
              f"{'ok' if ok else 'FAIL'}")
        if not ok:
            report.fail(f"{title}: loss before AdamW step {i + 1}: nabla {nl[i]!r} torch {t32[i]!r}")
    if steps > 1 and not t32[-1] < t32[0]:
        report.fail(f"{title}: torch's loss did not fall over {steps} AdamW steps: the check proves little")
    print(f"worst rel {worst:.2e} (limit {ADAMW_LOSS_RTOL:.0e}); loss {t32[0]:.4f} -> {t32[-1]:.4f}")
    return worst


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------
def adamw_args(steps, opt):
    if steps == 0:
        return []
    return ["--adamw-steps", str(steps), "--lr", repr(opt["lr"]), "--weight-decay", repr(opt["weight_decay"]),
            "--beta1", repr(opt["beta1"]), "--beta2", repr(opt["beta2"]), "--eps", repr(opt["eps"])]


def check(nabla, work, report, title, model, tokens, token_dtype, weights, steps, opt):
    """Runs `nabla grad` on `weights` (a file holding `model`'s parameters)
    and a batch of `tokens`, and compares it with torch. Returns the worst
    relative gradient error."""
    tag = title.split(":")[0].replace(" ", "_")
    b, o = (os.path.join(work, f"{tag}.{s}.safetensors") for s in ("batch", "grads"))
    write_safetensors(b, {"tokens": tokens.to(token_dtype)})
    got = nabla_grad(nabla, weights, b, o, adamw_args(steps, opt))
    title = f"{title} (tokens {DTYPE_NAMES[token_dtype]} {list(tokens.shape)})"
    worst = grad_compare.compare(title, report, got, torch_grads(model, tokens, torch.float32),
                                 torch_grads(model, tokens, torch.float64), RTOL, ATOL, LOSS_RTOL,
                                 outputs=("loss", "losses"))
    compare_adamw(title, report, got, model, tokens, steps, opt)
    return worst


def random_check(nabla, work, report, title, config, n, t, seed, token_dtype, steps, opt):
    gen = torch.Generator().manual_seed(seed)
    model = Gpt2(config)
    randomize(model, gen)
    tokens = torch.randint(0, config["vocab_size"], (n, t + 1), generator=gen)
    w = os.path.join(work, f"{title.replace(' ', '_')}.weights.safetensors")
    write_safetensors(w, model.state_dict(), {"format": "pt", "nabla.config": json.dumps(config)})
    return check(nabla, work, report, title, model, tokens, token_dtype, w, steps, opt)


def loader_check(nabla, work, report, steps, opt):
    """A checkpoint that `nabla train gpt2` wrote loads into the torch model by
    name (strict), and the loaded model computes what nabla computes."""
    ckpt = os.path.join(work, "trained.safetensors")
    r = subprocess.run([nabla, "train", "gpt2", "--layers", "2", "--heads", "4", "--width", "32", "--positions", "24",
                        "--context", "24", "--batch", "4", "--steps", "30", "--warmup", "5", "--eval-every", "30",
                        "--eval-batches", "2", "--threads", "2", "--save", ckpt], capture_output=True, text=True)
    if r.returncode != 0:
        report.fail(f"nabla train gpt2 exited {r.returncode}:\n{r.stdout}{r.stderr}")
        return
    tensors, meta = read_safetensors(ckpt)
    config = json.loads(meta["nabla.config"])
    model = Gpt2(config)
    params = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    print(f"\n== loader: {ckpt}: {len(params)} parameters, {len(tensors) - len(params)} optimizer tensors, "
          f"config {meta['nabla.config']}")
    for k, v in params.items():
        if v.dtype != torch.float32:
            report.fail(f"loader: {k} is {v.dtype}, expected float32")
    try:
        model.load_state_dict(params, strict=True)
    except RuntimeError as e:
        report.fail(f"loader: strict load_state_dict failed: {e}")
        return
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, config["vocab_size"], (3, 17), generator=gen)
    check(nabla, work, report, "loader: nabla checkpoint after 30 steps", model, tokens, torch.int64, ckpt, steps,
          opt)


def bad_batch_checks(nabla, work, report):
    """Batches `nabla grad` must refuse: status 2 and one line naming the file."""
    config = small_config()
    w = os.path.join(work, "bad.weights.safetensors")
    write_safetensors(w, Gpt2(config).state_dict(), {"nabla.config": json.dumps(config)})
    i64 = torch.int64
    cases = {"f32 tokens": {"tokens": torch.zeros(2, 5)},
             "rank 1": {"tokens": torch.zeros(5, dtype=i64)},
             "T = 0": {"tokens": torch.zeros(2, 1, dtype=i64)},
             "T > n_positions": {"tokens": torch.zeros(2, config["n_positions"] + 2, dtype=i64)},
             "id = vocab_size": {"tokens": torch.full((2, 5), config["vocab_size"], dtype=i64)},
             "negative id": {"tokens": torch.full((2, 5), -100, dtype=torch.int32)},
             "no tokens": {"images": torch.zeros(2, 3, 4, 4), "labels": torch.zeros(2, dtype=i64)}}
    print("\n== bad batches")
    for what, tensors in cases.items():
        b = os.path.join(work, "bad.batch.safetensors")
        write_safetensors(b, tensors)
        r = subprocess.run([nabla, "grad", "--weights", w, "--batch", b, "--out", os.path.join(work, "bad.out")],
                           capture_output=True, text=True)
        ok = r.returncode == 2 and r.stderr.count("\n") == 1 and b in r.stderr and not r.stdout
        print(f"{what:<16} status {r.returncode}: {r.stderr.strip()}")
        if not ok:
            report.fail(f"bad batch ({what}): expected status 2 and one line naming {b}, got status "
                        f"{r.returncode}: {r.stdout}{r.stderr}")


def small_config(**kw):
    c = {"architecture": "gpt2", "vocab_size": 256, "n_positions": 16, "n_layer": 2, "n_head": 4, "n_embd": 32,
         "layer_norm_epsilon": 1e-5, "dropout": 0.0, "bias": True, "gelu": "gelu", "tokenizer": "byte",
         "preset": ""}
    c.update(kw)
    return c


def gpt2_124m_config():
    # nabla's "gpt2" preset: Hugging Face's gpt2 (124M).
    return {"architecture": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_layer": 12, "n_head": 12,
            "n_embd": 768, "layer_norm_epsilon": 1e-5, "dropout": 0.0, "bias": True, "gelu": "gelu",
            "tokenizer": "gpt2", "preset": "gpt2"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nabla", help="path to the nabla binary")
    ap.add_argument("--preset", choices=["small", "gpt2"], default="small")
    ap.add_argument("--batch", type=int, default=0, help="sequences (default: 3 small, 4 gpt2)")
    ap.add_argument("--context", type=int, default=0, help="tokens per sequence T (default: 16 small, 64 gpt2)")
    ap.add_argument("--adamw-steps", type=int, default=5, help="AdamW steps to compare (0: none)")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--no-loader", action="store_true", help="skip the trained-checkpoint loader check")
    ap.add_argument("--keep", help="write the files here and keep them")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)  # PyTorch's default thread count is very slow on small shared machines
    opt = {"lr": a.lr, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.5}
    report = Report()
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="nabla_oracle_") as tmp:
        work = a.keep or tmp
        os.makedirs(work, exist_ok=True)
        if a.preset == "small":
            n, t = a.batch or 3, a.context or 16
            worst = max(worst, random_check(a.nabla, work, report, "small", small_config(), n, t, 1, torch.int64,
                                            a.adamw_steps, opt))
            # No Conv1D biases, erf GELU, an eps large enough to matter at f32
            # tolerance, a context shorter than n_positions; tokens as I32.
            variant = small_config(bias=False, gelu="gelu_erf", layer_norm_epsilon=1e-3, n_positions=24, n_head=2)
            worst = max(worst, random_check(a.nabla, work, report, "small no-bias erf-gelu", variant, n, 11, 2,
                                            torch.int32, 0, opt))
            bad_batch_checks(a.nabla, work, report)
        else:
            worst = random_check(a.nabla, work, report, "gpt2 124M", gpt2_124m_config(), a.batch or 4,
                                 a.context or 64, 3, torch.int64, a.adamw_steps, opt)
        if not a.no_loader:
            loader_check(a.nabla, work, report, a.adamw_steps, opt)
    if report.failures:
        print(f"\n{len(report.failures)} mismatch(es)")
        return 1
    print(f"\nnabla agrees with PyTorch (worst relative gradient error {worst:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
