"""What the PyTorch oracles share: running `nabla grad`, and the table that
compares its loss and gradients with torch's.

Tolerance, per tensor: max|nabla - torch| <= rtol * max(|torch|) + atol, both
in f32. The table also prints each side's distance from torch in f64, which
says which side is off when the check fails."""
import math
import subprocess

import torch

from safetensors_io import read_safetensors


class Report:
    def __init__(self):
        self.failures = []

    def fail(self, msg):
        print(f"FAIL: {msg}")
        self.failures.append(msg)


def nabla_grad(nabla, weights, batch, out, extra=()):
    """Runs `nabla grad` and returns its output tensors (loss, grad.<name>, ...)."""
    r = subprocess.run([nabla, "grad", "--weights", weights, "--batch", batch, "--out", out, *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nabla grad exited {r.returncode}:\n{r.stdout}{r.stderr}")
    tensors, _ = read_safetensors(out)
    return tensors


def compare(title, report, got, torch32, torch64, rtol, atol, loss_rtol, outputs=("loss",)):
    """`got`: nabla's output tensors (loss, grad.<name>, and the other names in
    `outputs`). torch32, torch64: (loss, {name: gradient}) from torch in f32
    and in f64, parameters in model order. Returns the worst relative error."""
    loss32, g32 = torch32
    loss64, g64 = torch64
    names = set(g32)
    nabla_names = {k[len("grad."):] for k in got if k.startswith("grad.")}
    for n in sorted(names - nabla_names):
        report.fail(f"{title}: torch parameter {n} has no grad.{n} in nabla's output")
    for n in sorted(nabla_names - names):
        report.fail(f"{title}: nabla's grad.{n} names no torch parameter")
    for n in sorted(set(got) - {"grad." + n for n in nabla_names} - set(outputs)):
        report.fail(f"{title}: unexpected tensor {n} in nabla's output")
    if "loss" not in got:
        report.fail(f"{title}: no loss in nabla's output")
        return float("inf")

    width = max([28] + [len(n) + 1 for n in names])
    print(f"\n== {title}")
    print(f"{'tensor':<{width}} {'shape':<16} {'max|g|':>10} {'max|nabla-torch|':>17} {'rel':>9} "
          f"{'nabla-f64':>10} {'torch-f64':>10}  ok")
    worst = 0.0
    nl = got["loss"].double().reshape(()).item()
    tl, tl64 = loss32.double().item(), loss64.double().item()
    d = abs(nl - tl)
    ok = d <= loss_rtol * max(1.0, abs(tl))
    print(f"{'loss':<{width}} {'[]':<16} {abs(tl):10.4g} {d:17.3e} {d / max(abs(tl), 1e-30):9.2e} "
          f"{abs(nl - tl64):10.2e} {abs(tl - tl64):10.2e}  {'ok' if ok else 'FAIL'}")
    if not ok:
        report.fail(f"{title}: loss nabla {nl!r} torch {tl!r}")
    for n in sorted(names & nabla_names, key=list(g32).index):
        a, t, t64 = got["grad." + n], g32[n], g64[n]
        shape = "[" + ", ".join(map(str, t.shape)) + "]"
        if a.dtype != torch.float32 or tuple(a.shape) != tuple(t.shape):
            report.fail(f"{title}: grad.{n} is {a.dtype} {tuple(a.shape)}, torch {tuple(t.shape)}")
            continue
        scale = t.abs().max().item()
        diff = (a - t).abs().max().item()
        d64 = (a.double() - t64).abs().max().item()
        t_d64 = (t.double() - t64).abs().max().item()
        rel = diff / scale if scale > 0 else float("inf") if diff > 0 else 0.0
        ok = diff <= rtol * scale + atol and math.isfinite(diff)
        worst = max(worst, rel)
        print(f"{n:<{width}} {shape:<16} {scale:10.4g} {diff:17.3e} {rel:9.2e} {d64:10.2e} {t_d64:10.2e}  "
              f"{'ok' if ok else 'FAIL'}")
        if not ok:
            report.fail(f"{title}: grad.{n}: max|diff| {diff:.3e} > {rtol} * {scale:.4g} + {atol}")
        if scale == 0:
            report.fail(f"{title}: grad.{n} is all zero in torch: the check would prove nothing")
    print(f"worst rel {worst:.2e} (limit {rtol:.0e}); loss nabla {nl:.7f} torch {tl:.7f}")
    return worst


def compare_adamw_losses(title, report, nabla_losses, torch_losses, rtol):
    """nabla's loss before each AdamW step (`nabla grad --adamw-steps`'s
    `losses`) against torch's, relative to torch's; and torch's must fall,
    or the check proves little."""
    for i, (n, t) in enumerate(zip(nabla_losses, torch_losses)):
        rel = abs(n - t) / abs(t)
        print(f"AdamW step {i + 1}: nabla {n:.7f} torch {t:.7f} rel {rel:.2e}")
        if not rel <= rtol:
            report.fail(f"{title}: loss before AdamW step {i + 1}: nabla {n!r} torch {t!r}")
    if not torch_losses[-1] < torch_losses[0]:
        report.fail(f"{title}: torch's loss did not fall over {len(torch_losses)} AdamW steps: the check proves little")
