#!/usr/bin/env python3
"""Cross-checks nabla's Llama against an independent PyTorch implementation.

Usage: llama_oracle.py NABLA_BIN [--keep DIR]

A Llama written here in plain PyTorch, to Hugging Face's LlamaForCausalLM
semantics and parameter names (transformers itself is not imported): RMSNorm,
q/k/v/o projections with grouped-query attention (key/value heads repeated
for their query heads), rotate-half rotary positions, SwiGLU, a tied or
untied head, the causal-LM loss with labels shifted inside and -100 ignored.
It gets random weights; nabla reads them, runs `nabla grad` on a random
batch (input_ids, labels), and the loss and every parameter gradient must
equal torch's; then `nabla grad --adamw-steps 3`, whose loss before each step
must equal torch.optim.AdamW's. Configs: GQA ratios 1 and 3, a head size that
is neither a multiple of 8 nor hidden / heads, tied and untied heads, q/k/v
biases (Qwen2), per-head q/k RMSNorms (Qwen3), Mistral's sliding window
(rows longer than it), Qwen2's use_sliding_window (layers from
max_window_layers on), Gemma 3 (norms scaled by 1 + weight around both
branches, GeGLU, the scaled embedding, sliding layers with their own rotary
base beside full ones with linear rope scaling), SmolLM3 (layers without
rotary positions), Llama 3's rope_scaling, Phi-3 (fused qkv_proj and
gate_up_proj; longrope's short and long factors, each side of the original
length, and its attention factor; Phi-4-mini's partial rotation and grouped
heads; Phi-3-mini-4k's sliding window), -100 labels.

The weights reach nabla as Hugging Face writes them: a folder of config.json
(as transformers 4 writes it, or 5: rope_parameters) and BF16 shards with
model.safetensors.index.json, a multimodal Gemma 3's folder (text_config
holding what differs from Gemma3TextConfig's defaults, the text model under
model.language_model.*, a vision tower beside it), a folder of F16
model.safetensors (weights rounded to those dtypes first, so both sides
compute on the same values), and a nabla checkpoint. That checkpoint, written
back out by `nabla export hf`, must load into the torch model with strict
names and give the same loss bit for bit.

Gradient tolerance, per tensor: max|nabla - torch| <= RTOL * max(|torch|) +
ATOL, both in f32 (grad_compare.py). Exits 1 on any mismatch.

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
    sys.exit(f"llama_oracle: PyTorch is required ({e}); install Debian's python3-torch (scripts/install-deps) "
             f"and run with /usr/bin/python3")

import grad_compare
from grad_compare import Report, nabla_grad
from safetensors_io import read_safetensors, write_safetensors

# As gpt2_oracle.py: f32 rounding in either framework is about 1e-6 of a
# tensor's largest entry; RTOL leaves room over that. A wrong RoPE pairing,
# head grouping, RMSNorm eps or label shift is off by orders of magnitude.
RTOL = 1e-5
ATOL = 1e-7
LOSS_RTOL = 1e-6
ADAMW_LOSS_RTOL = 2e-6
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.5}


class RmsNorm(nn.Module):
    def __init__(self, d, eps, unit_offset=False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d) if unit_offset else torch.ones(d))
        self.eps, self.unit_offset = eps, unit_offset

    def forward(self, x):  # LlamaRMSNorm; Gemma3RMSNorm scales by 1 + weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (
            1 + self.weight if self.unit_offset else self.weight)


def gemma(c):  # Gemma 2's and 3's block
    return c["model_type"] in ("gemma3_text", "gemma2")


def gemma_layer_types(c):  # Gemma2Config without layer_types: the even layers slide
    return c.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                    for i in range(c["num_hidden_layers"])]


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def llama3_inv_freq(inv_freq, s):  # transformers' _compute_llama3_parameters
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / s["low_freq_factor"], old / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s["factor"], inv_freq)
    smooth = (old / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def longrope(c):
    """transformers' _compute_longrope_parameters for Phi3Config: the
    original length and the attention factor (cos and sin scaled by it)."""
    original = c["original_max_position_embeddings"]
    factor = c["max_position_embeddings"] / original
    return original, 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))


def rope(x, theta, scaling=None, dims=None, c=None):
    """x [B, H, T, hd]: LlamaRotaryEmbedding + apply_rotary_pos_emb; Phi-3's
    rotates the first `dims` of each head (partial_rotary_factor) and passes
    the rest through; its longrope divides by the short factors, or past the
    original length by the long ones, and scales cos and sin."""
    hd, t = x.shape[-1], x.shape[-2]
    dims = dims or hd
    inv_freq = 1.0 / (theta ** (torch.arange(0, dims, 2, dtype=torch.float64) / dims))
    m = 1.0
    if scaling and scaling.get("type") == "longrope":
        original, m = longrope(c)
        ext = scaling["long_factor"] if t > original else scaling["short_factor"]
        inv_freq = inv_freq / torch.tensor(ext, dtype=torch.float64)
    elif scaling and scaling["rope_type"] == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif scaling:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    r, rest = x[..., :dims], x[..., dims:]
    r = r * (emb.cos() * m).to(x.dtype) + rotate_half(r) * (emb.sin() * m).to(x.dtype)
    return torch.cat((r, rest), dim=-1)


class Attention(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        d, self.h, self.kv, self.hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.theta, self.scaling = c["rope_theta"], c.get("rope_scaling")
        self.scale = 1 / math.sqrt(c["query_pre_attn_scalar"] if gemma(c) else self.hd)
        b = c["attention_bias"]
        self.phi3, self.c = c["model_type"] == "phi3", c
        if self.phi3:  # Phi3Attention: queries, keys, values in one projection
            self.qkv_proj = nn.Linear(d, (self.h + 2 * self.kv) * self.hd, bias=False)
            self.dims = int(self.hd * c.get("partial_rotary_factor", 1.0))
        else:
            self.q_proj = nn.Linear(d, self.h * self.hd, bias=b)
            self.k_proj = nn.Linear(d, self.kv * self.hd, bias=b)
            self.v_proj = nn.Linear(d, self.kv * self.hd, bias=b)
            self.dims = None
        self.o_proj = nn.Linear(self.h * self.hd, d, bias=False)
        self.qk_norm = c["model_type"] in ("qwen3", "gemma3_text")
        if self.qk_norm:  # Qwen3Attention, Gemma3Attention: each head RMS-normed before the rotation
            self.q_norm = RmsNorm(self.hd, c["rms_norm_eps"], gemma(c))
            self.k_norm = RmsNorm(self.hd, c["rms_norm_eps"], gemma(c))
        self.window = c.get("sliding_window") if c["model_type"] in ("mistral", "phi3") else None
        if c.get("use_sliding_window") and c.get("sliding_window"):  # Qwen2Config: from max_window_layers on
            slides = c["layer_types"][i] == "sliding_attention" if "layer_types" in c else i >= c["max_window_layers"]
            self.window = c["sliding_window"] if slides else None
        self.rotate = c["no_rope_layers"][i] if c["model_type"] == "smollm3" else 1  # SmolLM3Attention.use_rope
        if gemma(c) and gemma_layer_types(c)[i] == "sliding_attention":
            self.window = c["sliding_window"]
            if c["model_type"] == "gemma3_text":  # Gemma 3's local layers: their own base
                self.theta, self.scaling = c["rope_local_base_freq"], None
        self.softcap = c.get("attn_logit_softcapping") if c["model_type"] == "gemma2" else None

    def forward(self, x):
        b, t, _ = x.shape

        def heads(y, n, norm=None):  # [B, n, T, hd]
            y = y.view(b, t, n, self.hd)
            return (norm(y) if self.qk_norm and norm else y).transpose(1, 2)
        if self.phi3:  # Phi3Attention's split: queries, then keys, then values
            qkv, qn = self.qkv_proj(x), self.h * self.hd
            q, k, v = qkv[..., :qn], qkv[..., qn:qn + self.kv * self.hd], qkv[..., qn + self.kv * self.hd:]
            q, k, v = heads(q, self.h), heads(k, self.kv), heads(v, self.kv)
        else:
            q = heads(self.q_proj(x), self.h, getattr(self, "q_norm", None))
            k = heads(self.k_proj(x), self.kv, getattr(self, "k_norm", None))
            v = heads(self.v_proj(x), self.kv)
        if self.rotate:
            q, k = (rope(y, self.theta, self.scaling, self.dims, self.c) for y in (q, k))
        g = self.h // self.kv
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)  # repeat_kv
        w = (q @ k.transpose(-1, -2)) * self.scale
        if self.softcap:  # Gemma2Attention: tanh(w / cap) * cap before the mask
            w = torch.tanh(w / self.softcap) * self.softcap
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        if self.window:  # transformers' sliding_window_overlay: key j visible to query i where i - j < window
            causal &= ~torch.ones(t, t, dtype=torch.bool).tril(-self.window)
        w = w.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.o_proj((w @ v).transpose(1, 2).reshape(b, t, self.h * self.hd))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.phi3 = c["model_type"] == "phi3"
        if self.phi3:  # Phi3MLP: the gate's rows, then up's
            self.gate_up_proj = nn.Linear(d, 2 * f, bias=False)
        else:
            self.gate_proj = nn.Linear(d, f, bias=False)
            self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.act = (lambda x: F.gelu(x, approximate="tanh")) if gemma(c) else F.silu  # gelu_pytorch_tanh

    def forward(self, x):
        if self.phi3:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(up * self.act(gate))
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        d, eps, g = c["hidden_size"], c["rms_norm_eps"], gemma(c)
        self.input_layernorm = RmsNorm(d, eps, g)
        self.self_attn = Attention(c, i)
        self.post_attention_layernorm = RmsNorm(d, eps, g)
        self.mlp = Mlp(c)
        if g:  # Gemma3DecoderLayer: norms of both branches' outputs too
            self.pre_feedforward_layernorm = RmsNorm(d, eps, g)
            self.post_feedforward_layernorm = RmsNorm(d, eps, g)
        self.gemma = g

    def forward(self, x):
        if self.gemma:
            x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x)))
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c, i) for i in range(c["num_hidden_layers"])])
        self.norm = RmsNorm(c["hidden_size"], c["rms_norm_eps"], gemma(c))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Body(c)
        if not c["tie_word_embeddings"]:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        if gemma(self.config):  # Gemma3TextScaledWordEmbedding: sqrt(hidden_size) in the weights' dtype
            x = x * torch.tensor(self.config["hidden_size"] ** 0.5, dtype=x.dtype)
        for layer in self.model.layers:
            x = layer(x)
        head = self.model.embed_tokens.weight if self.config["tie_word_embeddings"] else self.lm_head.weight
        logits = self.model.norm(x) @ head.t()
        cap = self.config.get("final_logit_softcapping") if self.config["model_type"] == "gemma2" else None
        return torch.tanh(logits / cap) * cap if cap else logits  # Gemma2ForCausalLM

    def loss(self, ids, labels):  # LlamaForCausalLM: shift inside, -100 ignored, mean over the counted
        logits = self(ids)[:, :-1]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def randomize(model, gen):
    """Weights at scales where every path matters: projections N(0, 1/in),
    biases N(0, 0.1), norm gains 1 + N(0, 0.2), the embedding's rows N(0, 4/D)
    as the blocks see them."""
    d = model.config["hidden_size"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name == "model.embed_tokens.weight":  # Gemma's scaled by sqrt(d) in the model
                v = 2 * r / (d if gemma(model.config) else math.sqrt(d))
            elif "norm" in name:
                v = 0.2 * r if gemma(model.config) else 1 + 0.2 * r  # Gemma's gains are 1 + weight
            elif name.endswith(".bias"):
                v = 0.1 * r
            else:
                v = r / math.sqrt(p.shape[1])
            p.copy_(v.to(p.dtype))


def copy_of(model, dtype):
    m = Llama(model.config).to(dtype)
    m.load_state_dict(model.state_dict())
    return m


def torch_grads(model, ids, labels, dtype):
    m = copy_of(model, dtype)
    loss = m.loss(ids, labels)
    loss.backward()
    return loss.detach(), {n: p.grad.detach() for n, p in m.named_parameters()}


def torch_adamw_losses(model, ids, labels, steps, dtype):
    """nabla's decay rule: tensors of rank >= 2 (the embedding and projections)."""
    m = copy_of(model, dtype)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    rest = [p for p in m.parameters() if p.dim() < 2]
    o = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                           {"params": rest, "weight_decay": 0.0}],
                          lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    losses = []
    for _ in range(steps):
        o.zero_grad()
        loss = m.loss(ids, labels)
        loss.backward()
        losses.append(loss.item())
        o.step()
    return losses


def nabla_config(c):
    """nabla's checkpoint config: config.json's keys plus its architecture."""
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
            "tie_word_embeddings", "attention_bias")
    if gemma(c):
        keys += ("sliding_window", "query_pre_attn_scalar")
        return json.dumps({"architecture": "llama", "model_type": c["model_type"], **{k: c[k] for k in keys},
                           "layer_types": gemma_layer_types(c),
                           **{k: c[k] for k in ("rope_local_base_freq", "attn_logit_softcapping",
                                                "final_logit_softcapping") if k in c}})
    if c["model_type"] == "smollm3":
        keys += ("no_rope_layers",)
    if c["model_type"] == "phi3":
        keys += tuple(k for k in ("sliding_window", "partial_rotary_factor", "original_max_position_embeddings") if k in c)
    return json.dumps({"architecture": "llama", "model_type": c["model_type"], **{k: c[k] for k in keys}})


def rope_parameters(c):
    """transformers 5's rope_parameters for rope_theta and rope_scaling (and
    Gemma's rope_local_base_freq): one object, or one per layer type."""
    full = {"rope_type": "default", **(c["rope_scaling"] or {}), "rope_theta": c["rope_theta"]}
    if not gemma(c):
        return full
    return {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": c["rope_local_base_freq"]}}


def hf_config(c, transformers5=False):
    """config.json as transformers writes it (no nabla keys); version 5 with
    rope_parameters."""
    arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM",
            "smollm3": "SmolLM3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
            "gemma3_text": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM"}.get(c["model_type"], "LlamaForCausalLM")
    act = {"hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
           "attn_logit_softcapping": None} if gemma(c) else {"hidden_act": "silu"}
    out = {"architectures": [arch], **act, "torch_dtype": "bfloat16", "use_cache": True,
           **{k: v for k, v in c.items() if not (c["model_type"] in ("qwen2", "phi3") and k == "attention_bias")}}
    if c["model_type"] == "phi3":  # Phi3Config's dropouts, written as 0
        out.update(resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)
    if transformers5:
        for k in ("rope_theta", "rope_scaling", "rope_local_base_freq", "torch_dtype"):
            out.pop(k, None)
        out.update(rope_parameters=rope_parameters(c), dtype="bfloat16", transformers_version="5.0.0")
    return out


# transformers' Gemma3TextConfig defaults, which a multimodal Gemma 3's
# text_config leaves out.
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                        "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                        "tie_word_embeddings": True, "attention_bias": False, "rope_scaling": None,
                        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
                        "attn_logit_softcapping": None}


def multimodal_config(c):
    """A Gemma3ForConditionalGeneration config.json around text model c."""
    text = {k: v for k, v in hf_config(c).items()
            if k not in ("architectures", "torch_dtype", "use_cache") and GEMMA3_TEXT_DEFAULTS.get(k, "unset") != v}
    return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text,
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8, "num_hidden_layers": 1},
            "mm_tokens_per_image": 256, "torch_dtype": "bfloat16"}


def write_hf_folder(path, model, dtype, shards, version=None):
    """A Hugging Face model folder in `dtype`: model.safetensors, or `shards`
    files listed by model.safetensors.index.json. version: "transformers5"
    (rope_parameters), "multimodal" (Gemma3ForConditionalGeneration's)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        config = multimodal_config(model.config) if version == "multimodal" else hf_config(model.config,
                                                                                             version == "transformers5")
        json.dump(config, f, indent=2)
    state = {k: v.to(dtype) for k, v in model.state_dict().items()}
    if version == "multimodal":  # transformers >= 4.52's names, the vision tower beside
        state = {"model.language_model." + k[len("model."):] if k.startswith("model.") else k: v for k, v in state.items()}
        state["model.vision_tower.vision_model.post_layernorm.weight"] = torch.ones(8, dtype=dtype)
    if shards == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), state, {"format": "pt"})
        return
    names, weight_map = list(state), {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i * len(names) // shards:(i + 1) * len(names) // shards]
        write_safetensors(os.path.join(path, file), {n: state[n] for n in part}, {"format": "pt"})
        weight_map.update({n: file for n in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                   "weight_map": weight_map}, f)


def check_export(nabla, weights, model, ids, labels, folder, report, title):
    """`nabla export hf`: the folder loads into a torch Llama built from its
    config.json with strict names, and computes the same loss."""
    r = subprocess.run([nabla, "export", "hf", weights, "-o", folder], capture_output=True, text=True)
    if r.returncode != 0:
        report.fail(f"{title}: nabla export hf exited {r.returncode}: {r.stdout}{r.stderr}")
        return
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    loaded = Llama(c)
    state, meta = read_safetensors(os.path.join(folder, "model.safetensors"))
    try:
        loaded.load_state_dict(state, strict=True)
    except RuntimeError as e:
        report.fail(f"{title}: the exported folder does not load with strict names: {e}")
        return
    a, b = model.loss(ids, labels).item(), loaded.loss(ids, labels).item()
    print(f"export hf: {folder} loads with strict names; loss {b:.7f} (original {a:.7f})")
    if a != b or meta.get("format") != "pt":
        report.fail(f"{title}: the exported folder's loss {b!r} is not the original's {a!r}, or format {meta}")


def check(nabla, work, report, title, c, n, t, seed, source, steps=3):
    """source: "checkpoint" (a nabla safetensors file, then exported back as a
    Hugging Face folder), or ("hf", dtype, shards[, "transformers5" or "multimodal"])."""
    gen = torch.Generator().manual_seed(seed)
    model = Llama(c)
    randomize(model, gen)
    ids = torch.randint(0, c["vocab_size"], (n, t), generator=gen)
    labels = ids.clone()
    labels[torch.rand((n, t), generator=gen) < 0.3] = -100  # prompt tokens, padding
    tag = title.split(":")[0].replace(" ", "_")
    w, b, o = (os.path.join(work, f"{tag}.{s}.safetensors") for s in ("weights", "batch", "grads"))
    if source == "checkpoint":
        write_safetensors(w, model.state_dict(), {"format": "pt", "nabla.config": nabla_config(c)})
        check_export(nabla, w, model, ids, labels, os.path.join(work, f"{tag}.exported"), report, title)
    else:
        _, dtype, shards, *version = source
        with torch.no_grad():  # both sides compute on the values the folder holds
            for p in model.parameters():
                p.copy_(p.to(dtype).float())
        w = os.path.join(work, f"{tag}.hf")
        write_hf_folder(w, model, dtype, shards, *version)
        title = f"{title}, {str(dtype).split('.')[-1]} Hugging Face folder" + (f" in {shards} shards" if shards > 1 else "")
        title += {"transformers5": " (transformers 5's config.json)", "multimodal": " (Gemma3ForConditionalGeneration's)"
                  }.get(*version, "") if version else ""
    write_safetensors(b, {"input_ids": ids, "labels": labels})
    extra = ["--adamw-steps", str(steps), "--lr", repr(ADAMW["lr"]), "--weight-decay", repr(ADAMW["weight_decay"]),
             "--beta1", repr(ADAMW["beta1"]), "--beta2", repr(ADAMW["beta2"]), "--eps", repr(ADAMW["eps"])]
    got = nabla_grad(nabla, w, b, o, extra)
    title = f"{title} (input_ids {list(ids.shape)}, {int((labels[:, 1:] >= 0).sum())} counted)"
    grad_compare.compare(title, report, got, torch_grads(model, ids, labels, torch.float32),
                         torch_grads(model, ids, labels, torch.float64), RTOL, ATOL, LOSS_RTOL,
                         outputs=("loss", "losses"))
    grad_compare.compare_adamw_losses(title, report, got["losses"].double().tolist(),
                                      torch_adamw_losses(model, ids, labels, steps, torch.float32), ADAMW_LOSS_RTOL)


def config(**over):
    c = {"model_type": "llama", "vocab_size": 53, "hidden_size": 48, "intermediate_size": 80,
         "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 10,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": False, "attention_bias": False, "rope_scaling": None}
    c.update(over)
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("nabla")
    ap.add_argument("--keep", help="keep the files here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    report = Report()
    work = args.keep or tempfile.mkdtemp(prefix="llama_oracle.")
    os.makedirs(work, exist_ok=True)
    # Llama 3's rope_scaling, with original_max_position_embeddings small
    # enough that head size 10's five frequencies fall in all three bands.
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    check(args.nabla, work, report, "gqa 3: head size 10, untied, llama3 rope scaling", config(rope_scaling=llama3),
          2, 13, 1, ("hf", torch.bfloat16, 2))
    check(args.nabla, work, report, "gqa 1: head size hidden / heads, tied",
          config(num_key_value_heads=6, head_dim=8, tie_word_embeddings=True, rope_theta=500.0), 3, 9, 2,
          ("hf", torch.float16, 1))
    check(args.nabla, work, report, "qwen2: q/k/v biases, gqa 2",
          config(model_type="qwen2", attention_bias=True, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=12, rope_theta=1e6), 2, 11, 3, "checkpoint")
    check(args.nabla, work, report, "qwen3: q/k head norms, gqa 3, tied",
          config(model_type="qwen3", head_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1e6),
          2, 12, 4, ("hf", torch.bfloat16, 1))
    # Mistral with rows of 13 tokens past its window of 5.
    check(args.nabla, work, report, "mistral: sliding window 5, gqa 3",
          config(model_type="mistral", sliding_window=5), 2, 13, 6, ("hf", torch.bfloat16, 1))
    check(args.nabla, work, report, "qwen2 use_sliding_window: window 4 from layer 1 of 2",
          config(model_type="qwen2", attention_bias=True, use_sliding_window=True, sliding_window=4,
                 max_window_layers=1), 2, 12, 12, ("hf", torch.bfloat16, 1))
    # Gemma 3: a sliding layer (window 4, its own rotary base) then a full one
    # (linear rope scaling), rows of 13; the scores scaled by
    # 1/sqrt(query_pre_attn_scalar), not the head size.
    gemma3 = dict(model_type="gemma3_text", num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                  tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1e6, sliding_window=4,
                  layer_types=["sliding_attention", "full_attention"], rope_local_base_freq=10000.0,
                  query_pre_attn_scalar=24, rope_scaling={"rope_type": "linear", "factor": 8.0})
    check(args.nabla, work, report, "gemma3: sandwich norms, GeGLU, sliding and full layers, gqa 4",
          config(**gemma3), 2, 13, 7, ("hf", torch.bfloat16, 1, "transformers5"))
    check(args.nabla, work, report, "gemma3 multimodal: its text model, defaults from Gemma3TextConfig",
          config(**{**gemma3, "num_hidden_layers": 3, "max_position_embeddings": 131072,
                    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
          2, 11, 11, ("hf", torch.bfloat16, 1, "multimodal"))
    # Gemma 2: soft-capped scores and logits (caps small enough to bite),
    # the even layers sliding (derived: no layer_types in its config.json).
    gemma2 = dict(model_type="gemma2", num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  tie_word_embeddings=True, rms_norm_eps=1e-6, sliding_window=4, query_pre_attn_scalar=24,
                  attn_logit_softcapping=2.0, final_logit_softcapping=3.0, num_hidden_layers=3)
    check(args.nabla, work, report, "gemma2: soft-capped scores and logits, alternating windows",
          config(**gemma2), 2, 11, 13, ("hf", torch.bfloat16, 1))
    check(args.nabla, work, report, "gemma2 untied, exported back",
          config(**{**gemma2, "tie_word_embeddings": False, "num_hidden_layers": 2}), 2, 9, 14, "checkpoint")
    check(args.nabla, work, report, "gemma3 untied, exported back",
          config(**{**gemma3, "tie_word_embeddings": False, "num_hidden_layers": 3,
                    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]}), 2, 9, 8, "checkpoint")
    # SmolLM3: layers without rotary positions (NoPE) beside rotating ones.
    check(args.nabla, work, report, "smollm3: every fourth layer NoPE, llama3 rope scaling, tied",
          config(model_type="smollm3", num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0], tie_word_embeddings=True,
                 rope_theta=5e6, rope_scaling=llama3), 2, 12, 9, ("hf", torch.bfloat16, 1, "transformers5"))
    check(args.nabla, work, report, "smollm3 untied: NoPE first and last, exported back",
          config(model_type="smollm3", num_hidden_layers=3, no_rope_layers=[0, 1, 0]), 2, 9, 10, "checkpoint")
    # Phi-3: fused qkv_proj and gate_up_proj; longrope (short factors for
    # rows up to the original length, long ones past it, cos and sin scaled
    # by sqrt(1 + ln(64 / original) / ln(original))); Phi-4-mini's partial
    # rotation and grouped heads; Phi-3-mini-4k's sliding window.
    def factors(n, seed):
        g = torch.Generator().manual_seed(seed)
        return [round(1 + 3 * float(v), 4) for v in torch.rand(n, generator=g)]
    phi3 = dict(model_type="phi3", num_attention_heads=4, num_key_value_heads=4, head_dim=12, rope_theta=10000.0,
                original_max_position_embeddings=16,
                rope_scaling={"type": "longrope", "short_factor": factors(6, 1), "long_factor": factors(6, 2)})
    check(args.nabla, work, report, "phi3: fused projections, longrope short factors (rows within the original 16)",
          config(**phi3), 2, 13, 15, ("hf", torch.bfloat16, 1))
    check(args.nabla, work, report, "phi3: longrope long factors (rows past the original 8), exported back",
          config(**{**phi3, "original_max_position_embeddings": 8}), 2, 13, 16, "checkpoint")
    phi4 = dict(model_type="phi3", num_attention_heads=6, num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.75,
                tie_word_embeddings=True, rope_theta=10000.0, original_max_position_embeddings=8,
                rope_scaling={"type": "longrope", "short_factor": factors(3, 3), "long_factor": factors(3, 4)})
    check(args.nabla, work, report, "phi4-mini: partial rotation 0.75, gqa 3, tied, longrope long factors",
          config(**phi4), 2, 12, 17, ("hf", torch.bfloat16, 1))
    check(args.nabla, work, report, "phi4-mini: partial rotation, exported back",
          config(**{**phi4, "original_max_position_embeddings": 32}), 2, 9, 18, "checkpoint")
    check(args.nabla, work, report, "phi3-mini-4k: sliding window 5, no rope scaling",
          config(model_type="phi3", num_attention_heads=4, num_key_value_heads=4, head_dim=12, sliding_window=5),
          2, 13, 19, ("hf", torch.bfloat16, 1))
    check(args.nabla, work, report, "qwen3 untied: q/k head norms, gqa 1, exported back",
          config(model_type="qwen3", num_attention_heads=4, num_key_value_heads=4, head_dim=8), 2, 9, 5, "checkpoint")
    if report.failures:
        print(f"\n{len(report.failures)} failure(s)")
        return 1
    print("\nall Llama checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
