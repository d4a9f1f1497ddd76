#!/usr/bin/env python3
"""Cross-checks nabla's LoRA against an independent PyTorch implementation.

Usage: lora_oracle.py NABLA_BIN [--keep DIR]

The base is llama_oracle.py's plain-PyTorch Llama (Hugging Face's semantics
and names). Each targeted nn.Linear is wrapped here as PEFT's LoraLayer
computes it: base(x) + lora_B(lora_A(x)) * scaling, scaling = alpha / r (or
alpha / sqrt(r) with use_rslora), the base frozen. Random base weights go to
nabla as a Hugging Face folder, random adapter weights (B non-zero, so every
path matters) as a PEFT folder (adapter_config.json, adapter_model.safetensors
with PEFT's names); `nabla grad --adapter` must give torch's loss and the
gradient of every adapter tensor and of nothing else, and with
--adamw-steps 3 the loss before each AdamW step on the adapters alone.
Configs: all seven targets at GQA 3 with an untied head, q/v only with
rsLoRA on a tied head with Qwen2's biases, q/k and the MLP on Qwen3's head
norms, all seven on Gemma 3 (GeGLU, a sliding and a full layer), q/v/o on
Gemma 2 (soft-capped scores and logits, alternating windows), Phi-3's four
(one adapter on each fused qkv_proj and gate_up_proj); DoRA (use_dora, its
magnitude vectors as PEFT names them) on Qwen2's biases and on Phi-3's
fused projections.

Tolerances: llama_oracle.py's (RTOL, ATOL, LOSS_RTOL, ADAMW_LOSS_RTOL): f32
rounding in either framework; a wrong scale, a transposed A or B, or a
gradient reaching the frozen base is off by orders of magnitude.
"""
import argparse
import json
import math
import os
import sys
import tempfile

try:
    import torch
    import torch.nn as nn
except ImportError as e:
    sys.exit(f"lora_oracle: PyTorch is required ({e}); install Debian's python3-torch (scripts/install-deps) "
             f"and run with /usr/bin/python3")

import grad_compare
from grad_compare import Report, nabla_grad
from llama_oracle import ADAMW, ADAMW_LOSS_RTOL, ATOL, LOSS_RTOL, RTOL, Llama, config, randomize, write_hf_folder
from safetensors_io import write_safetensors


class LoraLinear(nn.Module):
    """PEFT's Linear LoraLayer at inference (dropout is the identity)."""

    def __init__(self, base, r, scaling):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        self.scaling = scaling

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


class DoraLinear(LoraLinear):
    """PEFT's DoRA (use_dora) at inference: the base output plus
    (m / n - 1) x W^T + (m / n) scaling x A^T B^T, n = ||W + scaling B A|| per
    output row, detached (the DoRA paper's section 4.3, as PEFT does)."""

    def __init__(self, base, r, scaling):
        super().__init__(base, r, scaling)
        self.lora_magnitude_vector = nn.Parameter(torch.zeros(base.out_features))

    def forward(self, x):
        w = self.base_layer.weight
        n = torch.linalg.norm(w + self.scaling * (self.lora_B.weight @ self.lora_A.weight), dim=1).detach()
        m = self.lora_magnitude_vector / n
        return (self.base_layer(x) + (m - 1) * nn.functional.linear(x, w) +
                m * self.lora_B(self.lora_A(x)) * self.scaling)


def add_lora(model, targets, r, scaling, gen, dora=False):
    """Wraps the targeted projections; returns the adapter's parameters by
    PEFT name. The base's parameters stop requiring gradients. DoRA's
    magnitudes: the weight's row norms, perturbed (so that m / n matters)."""
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in targets:
                if hasattr(parent, name):
                    lora = (DoraLinear if dora else LoraLinear)(getattr(parent, name), r, scaling)
                    with torch.no_grad():
                        lora.lora_A.weight.copy_(torch.randn(lora.lora_A.weight.shape, generator=gen) /
                                                 math.sqrt(lora.lora_A.weight.shape[1]))
                        lora.lora_B.weight.copy_(torch.randn(lora.lora_B.weight.shape, generator=gen) / math.sqrt(r))
                        if dora:
                            norms = torch.linalg.norm(lora.base_layer.weight, dim=1)
                            lora.lora_magnitude_vector.copy_(
                                norms * (1 + 0.3 * torch.randn(norms.shape, generator=gen)))
                    setattr(parent, name, lora)
    return {"base_model.model." + n: p for n, p in model.named_parameters() if ".lora_" in n}


def write_peft_folder(path, adapter, c):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": c["r"], "lora_alpha": c["alpha"],
                   "lora_dropout": 0.1, "target_modules": c["targets"], "use_rslora": c["rslora"],
                   "bias": "none", "fan_in_fan_out": False, "use_dora": c.get("dora", False), "modules_to_save": None,
                   "base_model_name_or_path": "oracle-base", "revision": None, "inference_mode": True,
                   "rank_pattern": {}, "alpha_pattern": {}, "layers_to_transform": None, "layers_pattern": None},
                  f, indent=2)
    write_safetensors(os.path.join(path, "adapter_model.safetensors"),
                      {n: p.detach().float() for n, p in adapter.items()}, {"format": "pt"})


def torch_grads(model, adapter, ids, labels, dtype):
    m = model.to(dtype)
    for p in adapter.values():
        p.grad = None
    loss = m.loss(ids, labels)
    loss.backward()
    if any(p.grad is not None for n, p in m.named_parameters() if ".lora_" not in n):
        raise RuntimeError("torch built a gradient for the frozen base")
    out = loss.detach(), {n: p.grad.detach().clone() for n, p in adapter.items()}
    m.float()
    return out


def torch_adamw_losses(model, adapter, ids, labels, steps):
    """nabla's decay rule on the adapters alone: tensors of rank >= 2 (A and
    B) decay, DoRA's magnitude vectors do not."""
    groups = [{"params": [p for p in adapter.values() if p.dim() >= 2]},
              {"params": [p for p in adapter.values() if p.dim() < 2], "weight_decay": 0.0}]
    o = torch.optim.AdamW([g for g in groups if g["params"]], lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                          eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
    losses = []
    for _ in range(steps):
        o.zero_grad()
        loss = model.loss(ids, labels)
        loss.backward()
        losses.append(loss.item())
        o.step()
    return losses


def check(nabla, work, report, title, c, lora, n, t, seed, steps=3):
    gen = torch.Generator().manual_seed(seed)
    model = Llama(c)
    randomize(model, gen)
    tag = title.split(":")[0].replace(" ", "_")
    base = os.path.join(work, f"{tag}.base")
    write_hf_folder(base, model, torch.float32, 1)  # before the wrapping renames the projections
    scaling = lora["alpha"] / (math.sqrt(lora["r"]) if lora["rslora"] else lora["r"])
    adapter = add_lora(model, lora["targets"], lora["r"], scaling, gen, lora.get("dora", False))
    peft = os.path.join(work, f"{tag}.adapter")
    write_peft_folder(peft, adapter, lora)
    ids = torch.randint(0, c["vocab_size"], (n, t), generator=gen)
    labels = ids.clone()
    labels[torch.rand((n, t), generator=gen) < 0.3] = -100  # prompt tokens, padding
    b, o = (os.path.join(work, f"{tag}.{s}.safetensors") for s in ("batch", "grads"))
    write_safetensors(b, {"input_ids": ids, "labels": labels})
    extra = ["--adapter", peft, "--adamw-steps", str(steps), "--lr", repr(ADAMW["lr"]), "--weight-decay",
             repr(ADAMW["weight_decay"]), "--beta1", repr(ADAMW["beta1"]), "--beta2", repr(ADAMW["beta2"]),
             "--eps", repr(ADAMW["eps"])]
    got = nabla_grad(nabla, base, b, o, extra)
    title = f"{title} (r {lora['r']}, alpha {lora['alpha']}, scale {scaling:.4g}; {len(adapter)} adapter tensors)"
    g32 = torch_grads(model, adapter, ids, labels, torch.float32)
    g64 = torch_grads(model, adapter, ids, labels, torch.float64)
    grad_compare.compare(title, report, got, g32, g64, RTOL, ATOL, LOSS_RTOL, outputs=("loss", "losses"))
    grad_compare.compare_adamw_losses(title, report, got["losses"].double().tolist(),
                                      torch_adamw_losses(model, adapter, ids, labels, steps), ADAMW_LOSS_RTOL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("nabla")
    ap.add_argument("--keep", help="keep the files here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    report = Report()
    work = args.keep or tempfile.mkdtemp(prefix="lora_oracle.")
    os.makedirs(work, exist_ok=True)
    every = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    check(args.nabla, work, report, "all seven: gqa 3, untied", config(),
          {"r": 4, "alpha": 8.0, "rslora": False, "targets": every}, 2, 13, 1)
    check(args.nabla, work, report, "q and v, rslora: qwen2 biases, tied",
          config(model_type="qwen2", attention_bias=True, tie_word_embeddings=True, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=12),
          {"r": 3, "alpha": 5.0, "rslora": True, "targets": ["q_proj", "v_proj"]}, 3, 9, 2)
    check(args.nabla, work, report, "q, k and the MLP: qwen3 head norms, gqa 3",
          config(model_type="qwen3", head_dim=16, rms_norm_eps=1e-6),
          {"r": 4, "alpha": 16.0, "rslora": False, "targets": ["q_proj", "k_proj", "gate_proj", "up_proj", "down_proj"]},
          2, 11, 3)
    check(args.nabla, work, report, "all seven: gemma3 GeGLU, a sliding and a full layer",
          config(model_type="gemma3_text", num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 tie_word_embeddings=True, rms_norm_eps=1e-6, sliding_window=3,
                 layer_types=["sliding_attention", "full_attention"], rope_local_base_freq=10000.0,
                 query_pre_attn_scalar=16),
          {"r": 4, "alpha": 8.0, "rslora": False, "targets": every}, 2, 10, 4)
    # Through the fused op's soft-capped scores (caps small enough to bite)
    # and the capped logits.
    check(args.nabla, work, report, "q, v and o: gemma2 soft caps, alternating windows",
          config(model_type="gemma2", num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 tie_word_embeddings=True, rms_norm_eps=1e-6, sliding_window=4, query_pre_attn_scalar=24,
                 attn_logit_softcapping=1.5, final_logit_softcapping=3.0, num_hidden_layers=2),
          {"r": 4, "alpha": 8.0, "rslora": False, "targets": ["q_proj", "v_proj", "o_proj"]}, 2, 11, 5)
    # Phi-3's fused projections: one adapter per qkv_proj and gate_up_proj,
    # its A shared by the parts (Phi-4-mini's shape: grouped heads, partial
    # rotation, longrope's long factors).
    check(args.nabla, work, report, "phi3: fused qkv_proj and gate_up_proj, gqa 3, partial rotation, longrope",
          config(model_type="phi3", num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                 partial_rotary_factor=0.75, original_max_position_embeddings=8,
                 rope_scaling={"type": "longrope", "short_factor": [1.0, 1.5, 2.0], "long_factor": [1.2, 3.0, 5.5]}),
          {"r": 4, "alpha": 8.0, "rslora": False, "targets": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]},
          2, 11, 6)
    # DoRA (use_dora): the magnitudes' gradients too, the norms detached; on
    # Qwen2's biases (the bias outside the scaled product) and on Phi-3's
    # fused projections (each part's rows normalized on their own).
    check(args.nabla, work, report, "dora, all seven: qwen2 biases, gqa 3",
          config(model_type="qwen2", attention_bias=True, rms_norm_eps=1e-6),
          {"r": 4, "alpha": 8.0, "rslora": False, "dora": True, "targets": every}, 2, 11, 7)
    check(args.nabla, work, report, "dora, rslora: phi3 fused qkv_proj and gate_up_proj",
          config(model_type="phi3", num_attention_heads=6, num_key_value_heads=2, head_dim=8),
          {"r": 3, "alpha": 6.0, "rslora": True, "dora": True, "targets": ["qkv_proj", "o_proj", "gate_up_proj"]},
          2, 9, 8)
    if report.failures:
        print(f"\n{len(report.failures)} failure(s)")
        return 1
    print("\nall LoRA checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
