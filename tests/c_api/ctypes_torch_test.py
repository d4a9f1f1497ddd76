"""The C API's transformer and vision ops, and its trainer, against PyTorch,
driven through ctypes exactly as an FFI framework would call libnabla.so.

Usage: ctypes_torch_test.py path/to/libnabla.so

1. Ops: every op entry point beyond the foundation set (norms, activations,
   softmax with scale/mask/causal, cross-entropy, attention, rope, conv,
   pools, padding...) computes in f64 what torch.nn.functional computes, at
   arguments chosen so that a swapped argument (stride for padding, height
   for width, k for v) changes the result. Each op's gradient is checked
   against finite differences by `nabla gradcheck`; this checks the C
   wrappers.
2. Training: a small ViT (asymmetric conv stem, class token, position
   embedding, LayerNorm, fused attention, GELU MLP, RMSNorm, head,
   cross-entropy with an ignored row) trains 4 steps with nabla_trainer
   (AdamW, weight decay except on the class token, position embedding and
   1-D parameters, clipping at 1.0); the same model in torch, from the same
   weights, with torch.optim.AdamW and clip_grad_norm_. Losses and gradient
   norms at every step, and every parameter at the end, must agree to f32
   rounding.

Run with Debian's /usr/bin/python3 (python3-torch); a missing torch is a
failure, not a skip.
"""
import ctypes
import math
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:
    sys.exit(f"ctypes_torch_test: PyTorch is required ({e}); install Debian's python3-torch "
             f"(scripts/install-deps) and run with /usr/bin/python3")

NABLA_OK = 0
NABLA_F32, NABLA_F64, NABLA_I32 = 0, 1, 2
DTYPES = {torch.float32: NABLA_F32, torch.float64: NABLA_F64, torch.int32: NABLA_I32}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


class Nabla:
    """ctypes over libnabla.so; raises RuntimeError on a non-zero status."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.nabla_last_error.restype = ctypes.c_char_p
        # Every pointer is a void*; doubles must be declared, the rest are ints.
        self.ctx = ctypes.c_void_p()
        self.check(self.lib.nabla_context_create(ctypes.byref(self.ctx)))

    def close(self):
        self.lib.nabla_context_free(self.ctx)

    def check(self, status):
        if status != NABLA_OK:
            raise RuntimeError(f"status {status}: {self.lib.nabla_last_error().decode()}")

    def leaf(self, t, parameter=False):
        t = t.contiguous()
        dims = (ctypes.c_int64 * max(t.dim(), 1))(*t.shape)
        out = ctypes.c_void_p()
        make = self.lib.nabla_parameter if parameter else self.lib.nabla_tensor_from_data
        self.check(make(self.ctx, DTYPES[t.dtype], t.dim(), dims, ctypes.c_void_p(t.data_ptr()),
                        ctypes.byref(out)))
        return out

    def op(self, name, *args):
        """nabla_<name>(ctx, *args, &out); floats go as doubles, None as NULL."""
        conv = []
        for a in args:
            if isinstance(a, float):
                conv.append(ctypes.c_double(a))
            elif isinstance(a, int):
                conv.append(ctypes.c_int64(a))
            elif a is None:
                conv.append(ctypes.c_void_p())
            else:
                conv.append(a)
        out = ctypes.c_void_p()
        self.check(getattr(self.lib, "nabla_" + name)(self.ctx, *conv, ctypes.byref(out)))
        return out

    def shape(self, t):
        rank = ctypes.c_int()
        self.check(self.lib.nabla_tensor_rank(t, ctypes.byref(rank)))
        dims = (ctypes.c_int64 * max(rank.value, 1))()
        self.check(self.lib.nabla_tensor_shape(t, dims, rank.value))
        return list(dims[: rank.value])

    def dtype(self, t):
        d = ctypes.c_int()
        self.check(self.lib.nabla_tensor_dtype(t, ctypes.byref(d)))
        return TORCH_DTYPES[d.value]

    def compute(self, outputs, threads=2):
        arr = (ctypes.c_void_p * len(outputs))(*[o.value for o in outputs])
        self.check(self.lib.nabla_compute(self.ctx, arr, len(outputs), threads))

    def read(self, t, reader=None):
        out = torch.empty(self.shape(t), dtype=self.dtype(t))
        nbytes = out.numel() * out.element_size()
        if reader is None:
            self.check(self.lib.nabla_tensor_read(self.ctx, t, ctypes.c_void_p(out.data_ptr()),
                                                  ctypes.c_size_t(nbytes)))
        else:
            self.check(reader(t, ctypes.c_void_p(out.data_ptr()), ctypes.c_size_t(nbytes)))
        return out


def i64s(*values):
    return (ctypes.c_int64 * len(values))(*values)


def doubles(*values):
    return (ctypes.c_double * len(values))(*values)


def close(name, got, want, tol=1e-10):
    err = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
    scale = max(want.double().abs().max().item(), 1.0) if want.numel() else 1.0
    ok = tuple(got.shape) == tuple(want.shape) and err <= tol * scale
    print(f"  {name:34s} {'ok ' if ok else 'BAD'} max err {err:.2e}")
    expect(ok, f"{name}: shape {list(got.shape)} vs {list(want.shape)}, max err {err:.3e}")


def rope_ref(x, offset, base, mode, positions=None, factors=None, dims=0, scale=1.0):
    T, D = x.shape[-2], x.shape[-1]
    R = dims or D
    x, rest = x[..., :R], x[..., R:]
    pos = (torch.arange(offset, offset + T) if positions is None else positions).double()[:, None]
    theta = base ** (-torch.arange(0, R // 2, dtype=torch.float64) * 2 / R)
    if factors is not None:
        theta = theta / torch.tensor(factors, dtype=torch.float64)
    cos, sin = scale * torch.cos(pos * theta), scale * torch.sin(pos * theta)
    if mode == 0:
        a, b = x[..., : R // 2], x[..., R // 2:]
        turned = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        turned = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
    return torch.cat([turned, rest], -1)


def attention_ref(q, k, v, scale, mask=None, causal=False):
    s = scale * q @ k.transpose(-1, -2)
    if mask is not None:
        s = s + mask
    if causal:
        tq, tk = s.shape[-2], s.shape[-1]
        hidden = torch.ones(tq, tk, dtype=torch.bool).triu(1 + tk - tq)
        s = s.masked_fill(hidden, float("-inf"))
    return torch.softmax(s, -1) @ v


def test_ops():
    print("ops against torch (f64):")
    g = torch.Generator().manual_seed(3)

    def rand(*shape, lo=-2.0, hi=2.0):
        return torch.rand(*shape, generator=g, dtype=torch.float64) * (hi - lo) + lo

    nb = Nabla(LIB)
    cases = []  # (name, nabla handle, torch reference)

    def case(name, handle, ref):
        cases.append((name, handle, ref))

    x = rand(3, 4, 6)
    X = nb.leaf(x)
    for name, ref in [("gelu", F.gelu(x, approximate="tanh")), ("gelu_erf", F.gelu(x)),
                      ("gelu_quick", x * torch.sigmoid(1.702 * x)), ("erf", torch.erf(x)),
                      ("hardswish", F.hardswish(x)), ("log_softmax", F.log_softmax(x, -1))]:
        case(name, nb.op(name, X), ref)
    case("softplus", nb.op("softplus", X, 2.0, 3.0), F.softplus(x, beta=2.0, threshold=3.0))
    case("elu", nb.op("elu", X, 0.7), F.elu(x, 0.7))
    case("leaky_relu", nb.op("leaky_relu", X, 0.2), F.leaky_relu(x, 0.2))
    case("clamp", nb.op("clamp", X, -0.3, 0.4), x.clamp(-0.3, 0.4))

    gamma, beta = rand(6, lo=0.5, hi=1.5), rand(6)
    G, Bt = nb.leaf(gamma), nb.leaf(beta)
    case("layer_norm affine", nb.op("layer_norm", X, G, Bt, 1e-3), F.layer_norm(x, (6,), gamma, beta, 1e-3))
    case("layer_norm beta only", nb.op("layer_norm", X, None, Bt, 1e-5), F.layer_norm(x, (6,), None, beta, 1e-5))
    case("rms_norm", nb.op("rms_norm", X, G, 1e-3), x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-3) * gamma)
    case("rms_norm no gain", nb.op("rms_norm", X, None, 1e-5), x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5))

    s, mask = rand(2, 3, 4, 6), rand(4, 6)
    mask[1, 2] = float("-inf")
    S, M = nb.leaf(s), nb.leaf(mask)
    causal = torch.ones(4, 6, dtype=torch.bool).triu(3)  # hides j > i + Tk - Tq
    case("softmax scale mask causal", nb.op("softmax", S, 0.5, M, 1),
         torch.softmax((0.5 * s + mask).masked_fill(causal, float("-inf")), -1))
    case("softmax plain", nb.op("softmax", S, 1.0, None, 0), torch.softmax(s, -1))

    logits = rand(6, 5)
    labels = torch.tensor([0, 4, -100, 2, 2, 1], dtype=torch.int32)
    probs = torch.softmax(rand(6, 5), -1)
    Lg, Lb, Pr = nb.leaf(logits), nb.leaf(labels), nb.leaf(probs)
    case("cross_entropy", nb.op("cross_entropy", Lg, Lb, -100), F.cross_entropy(logits, labels.long()))
    labels2 = labels.clone()
    labels2[2] = 3
    case("cross_entropy ignore 2", nb.op("cross_entropy", Lg, nb.leaf(labels2), 2),
         F.cross_entropy(logits, labels2.long(), ignore_index=2))
    case("cross_entropy_soft", nb.op("cross_entropy_soft", Lg, Pr),
         -(probs * F.log_softmax(logits, -1)).sum(-1).mean())

    q, k, v, am = rand(2, 3, 4, 8), rand(2, 3, 6, 8), rand(2, 3, 6, 5), rand(4, 6)
    case("scaled_dot_product_attention", nb.op("scaled_dot_product_attention", nb.leaf(q), nb.leaf(k), nb.leaf(v),
                                                nb.leaf(am), 1, 0.3), attention_ref(q, k, v, 0.3, am, True))
    case("sdpa default scale", nb.op("scaled_dot_product_attention", nb.leaf(q), nb.leaf(k), nb.leaf(v), None, 0, 0.0),
         attention_ref(q, k, v, 1 / math.sqrt(8)))
    qt, kt, vt = q.permute(0, 2, 1, 3).contiguous(), k.permute(0, 2, 1, 3).contiguous(), v.permute(0, 2, 1, 3).contiguous()
    case("attention causal", nb.op("attention", nb.leaf(qt), nb.leaf(kt), nb.leaf(vt), 1, 0.0),
         attention_ref(q, k, v, 1 / math.sqrt(8), None, True).permute(0, 2, 1, 3))
    case("attention scale", nb.op("attention", nb.leaf(qt), nb.leaf(kt), nb.leaf(vt), 0, 0.7),
         attention_ref(q, k, v, 0.7).permute(0, 2, 1, 3))
    # Grouped (4 query heads on 2), within segments and a sliding window of 3.
    qg, kg, vg = rand(2, 6, 4, 8), rand(2, 6, 2, 8), rand(2, 6, 2, 5)
    seg = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, -1]], dtype=torch.int32)
    i, j = torch.arange(6).view(6, 1), torch.arange(6).view(1, 6)
    hidden = (seg.view(2, 1, 6, 1) != seg.view(2, 1, 1, 6)) | (i - j >= 3)
    heads = lambda t: t.permute(0, 2, 1, 3).repeat_interleave(4 // t.shape[2], dim=1)
    case("attention_within grouped segments window",
         nb.op("attention_within", nb.leaf(qg), nb.leaf(kg), nb.leaf(vg), 1, 0.5, nb.leaf(seg), 3),
         attention_ref(heads(qg), heads(kg), heads(vg), 0.5,
                       torch.zeros(2, 1, 6, 6, dtype=torch.float64).masked_fill(hidden, float("-inf")),
                       True).permute(0, 2, 1, 3))
    # The same with scores soft-capped at 0.6 (Gemma 2), as Gemma2Attention caps them.
    s = 0.5 * heads(qg) @ heads(kg).transpose(-1, -2)
    s = 0.6 * torch.tanh(s / 0.6)
    s = s.masked_fill(hidden | torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    case("attention_capped grouped segments window",
         nb.op("attention_capped", nb.leaf(qg), nb.leaf(kg), nb.leaf(vg), 1, 0.5, nb.leaf(seg), 3, 0.6),
         (torch.softmax(s, -1) @ heads(vg)).permute(0, 2, 1, 3))

    r = rand(2, 5, 8)
    case("rope neox", nb.op("rope", nb.leaf(r), 3, 100.0, 0), rope_ref(r, 3, 100.0, 0))
    case("rope original", nb.op("rope", nb.leaf(r), 0, 10000.0, 1), rope_ref(r, 0, 10000.0, 1))
    rpos = torch.tensor([7, 0, 3, 3, 12], dtype=torch.int32)[: r.shape[-2]]
    factors = [1.0, 4.0, 0.5, 9.0][: (r.shape[-1] - 2) // 2]
    case("rope_at positions factors partial scale",
         nb.op("rope_at", nb.leaf(r), nb.leaf(rpos), 0, 100.0, 0, doubles(*factors), len(factors),
               r.shape[-1] - 2, 1.3),
         rope_ref(r, 0, 100.0, 0, rpos, factors, r.shape[-1] - 2, 1.3))
    case("rope_at offset original partial",
         nb.op("rope_at", nb.leaf(r), None, 5, 500.0, 1, None, 0, r.shape[-1] - 2, 1.0),
         rope_ref(r, 5, 500.0, 1, dims=r.shape[-1] - 2))
    seed = nb.leaf(torch.tensor([5], dtype=torch.int32))
    case("dropout eval", nb.op("dropout", X, 0.5, seed, 0, 0), x)
    dropped = nb.op("dropout", X, 0.5, seed, 1, 0)

    img = rand(2, 4, 9, 11)
    w = rand(6, 2, 3, 2)
    bias = rand(6)
    I = nb.leaf(img)
    case("conv_2d groups stride pad dil", nb.op("conv_2d", I, nb.leaf(w), nb.leaf(bias), i64s(2, 3), i64s(1, 2),
                                                 i64s(2, 1), 2),
         F.conv2d(img, w, bias, stride=(2, 3), padding=(1, 2), dilation=(2, 1), groups=2))
    wt = rand(4, 3, 2, 3)
    case("conv_transpose_2d", nb.op("conv_transpose_2d", I, nb.leaf(wt), None, i64s(2, 1), i64s(1, 0), i64s(1, 0),
                                    i64s(1, 2), 1),
         F.conv_transpose2d(img, wt, None, stride=(2, 1), padding=(1, 0), output_padding=(1, 0), dilation=(1, 2)))
    case("avg_pool_2d", nb.op("avg_pool_2d", I, i64s(3, 2), i64s(2, 1), i64s(1, 1)),
         F.avg_pool2d(img, (3, 2), (2, 1), (1, 1), count_include_pad=True))
    case("max_pool_2d", nb.op("max_pool_2d", I, i64s(3, 2), i64s(2, 1), i64s(1, 1)), F.max_pool2d(img, (3, 2), (2, 1), (1, 1)))
    case("max_pool_2d stride = kernel", nb.op("max_pool_2d", I, i64s(2, 3), None, None), F.max_pool2d(img, (2, 3)))

    p = rand(2, 3, 4)
    P = nb.leaf(p)
    case("pad", nb.op("pad", P, 3, i64s(0, 1, 2, 0, 1, 1), 0.5), F.pad(p, (1, 1, 2, 0, 0, 1), value=0.5))
    case("repeat", nb.op("repeat", P, 4, i64s(2, 1, 3, 1)), p.repeat(2, 1, 3, 1))
    dst, vals = rand(5, 3), rand(2, 3)
    want = dst.clone()
    want[4], want[1] = vals[0], vals[1]
    case("set_rows", nb.op("set_rows", nb.leaf(dst), nb.leaf(torch.tensor([4, 1], dtype=torch.int32)), nb.leaf(vals)), want)
    case("argmax", nb.op("argmax", X, 1, 1), torch.argmax(x, 1, keepdim=True).int())
    idx = torch.tensor([0, 2, 5, -1], dtype=torch.int32)
    want = torch.zeros(4, 4, dtype=torch.float64)
    want[0, 0] = want[1, 2] = 1
    case("one_hot", nb.op("one_hot", nb.leaf(idx), 4, NABLA_F64), want)

    nb.compute([h for _, h, _ in cases] + [dropped])
    for name, handle, ref in cases:
        close(name, nb.read(handle), ref)
    d = nb.read(dropped)
    kept = d != 0
    ok = torch.allclose(d[kept], 2 * x[kept]) and 0.3 < kept.double().mean().item() < 0.7
    print(f"  {'dropout train':34s} {'ok ' if ok else 'BAD'} kept {kept.double().mean().item():.2f}, scaled by 2")
    expect(ok, "dropout: kept elements must be doubled, about half kept")
    nb.close()


# ---- Training: the same ViT in nabla (through the C API) and in torch.

B, C, HH, WW, E, HEADS, FF, K = 6, 3, 12, 10, 16, 2, 32, 5
# EPS: AdamW's update lr * g / (|g| + eps) moves a parameter by up to lr / eps
# per unit of gradient rounding. At 1e-6 the few near-zero gradients (the key
# bias's is zero in exact arithmetic) made each library's largest error a
# draw of its rounding noise (nabla's 5-10x torch's in the -O1 sanitizer
# build, 0.5x in the release build); at 1e-4 the update is smooth in g and the
# comparison measures the arithmetic, for both builds.
STEPS, LR, WD, CLIP, EPS = 4, 1e-2, 0.05, 1.0, 1e-4
DRAWS = 3  # torch-f32 runs, each summing the batch in another order


def init_weights():
    g = torch.Generator().manual_seed(11)

    def r(*shape, std=0.2):
        return (torch.randn(*shape, generator=g) * std).float()

    w = {"patch.w": r(E, C, 3, 3), "patch.b": r(E, std=0.02), "cls": r(1, 1, E, std=0.02)}
    tokens = 1 + 6 * 4  # conv output 6 x 4, plus the class token
    w["pos"] = r(1, tokens, E, std=0.02)
    for n in ("ln1", "ln2"):
        w[n + ".g"], w[n + ".b"] = 1 + r(E, std=0.1), r(E, std=0.1)
    for n, (i, o) in {"qkv": (E, 3 * E), "proj": (E, E), "fc1": (E, FF), "fc2": (FF, E), "head": (E, K)}.items():
        w[n + ".w"], w[n + ".b"] = r(i, o, std=1 / math.sqrt(i)), r(o, std=0.02)
    w["norm.g"] = 1 + r(E, std=0.1)
    return w


def batches():
    g = torch.Generator().manual_seed(12)
    out = []
    for _ in range(STEPS):
        images = torch.randn(B, C, HH, WW, generator=g).float()
        labels = torch.randint(0, K, (B,), generator=g).int()
        labels[1] = -100
        out.append((images, labels))
    return out


def forward_torch(p, images, labels):
    B = images.shape[0]
    x = F.conv2d(images, p["patch.w"], p["patch.b"], stride=(2, 3), padding=(1, 2), dilation=(1, 2))
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([p["cls"].expand(B, 1, E), x], 1) + p["pos"]
    T = x.shape[1]
    qkv = (F.layer_norm(x, (E,), p["ln1.g"], p["ln1.b"], 1e-6) @ p["qkv.w"] + p["qkv.b"]).reshape(B, T, 3, HEADS, E // HEADS)
    q, k, v = (qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
    a = attention_ref(q, k, v, 1 / math.sqrt(E // HEADS)).permute(0, 2, 1, 3).reshape(B, T, E)
    x = x + a @ p["proj.w"] + p["proj.b"]
    h = F.gelu(F.layer_norm(x, (E,), p["ln2.g"], p["ln2.b"], 1e-6) @ p["fc1.w"] + p["fc1.b"], approximate="tanh")
    x = x + h @ p["fc2.w"] + p["fc2.b"]
    x = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * p["norm.g"]
    logits = x[:, 0] @ p["head.w"] + p["head.b"]
    return F.cross_entropy(logits, labels.long())


def build_nabla(nb, w, B=B):
    P = {n: nb.leaf(t, parameter=True) for n, t in w.items()}
    images = nb.leaf(torch.zeros(B, C, HH, WW))
    labels = nb.leaf(torch.zeros(B, dtype=torch.int32))
    x = nb.op("conv_2d", images, P["patch.w"], P["patch.b"], i64s(2, 3), i64s(1, 2), i64s(1, 2), 1)
    oh, ow = nb.shape(x)[2:]
    x = nb.op("transpose", nb.op("reshape", x, 3, i64s(B, E, oh * ow)), 1, 2)
    cls = nb.op("expand", P["cls"], 3, i64s(B, 1, E))
    x = nb.op("add", nb.op("concat", (ctypes.c_void_p * 2)(cls.value, x.value), ctypes.c_size_t(2), 1), P["pos"])
    T = 1 + oh * ow

    def linear(t, n):
        return nb.op("matmul_add", t, P[n + ".w"], P[n + ".b"])

    qkv = linear(nb.op("layer_norm", x, P["ln1.g"], P["ln1.b"], 1e-6), "qkv")
    qkv = nb.op("reshape", qkv, 5, i64s(B, T, 3, HEADS, E // HEADS))
    q, k, v = (nb.op("reshape", nb.op("slice", qkv, 2, i, i + 1, 1), 4, i64s(B, T, HEADS, E // HEADS)) for i in range(3))
    a = nb.op("reshape", nb.op("attention", q, k, v, 0, 0.0), 3, i64s(B, T, E))
    x = nb.op("add", x, linear(a, "proj"))
    h = nb.op("gelu", linear(nb.op("layer_norm", x, P["ln2.g"], P["ln2.b"], 1e-6), "fc1"))
    x = nb.op("add", x, linear(h, "fc2"))
    x = nb.op("rms_norm", x, P["norm.g"], 1e-6)
    x = nb.op("reshape", nb.op("slice", x, 1, 0, 1, 1), 2, i64s(B, E))
    logits = linear(x, "head")
    loss = nb.op("cross_entropy", logits, labels, -100)
    return P, images, labels, loss


def train_torch(w, data, dtype, replicas=1, order=0):
    """STEPS steps of torch.optim.AdamW with timm's groups and clip_grad_norm_;
    with replicas, the loss is the mean of each share's mean loss, as
    data-parallel replicas average their gradients. order > 0 rotates each
    share's images by that many places: the same sums in another order, so
    another draw of f32's rounding."""
    tp = {n: t.to(dtype).clone().requires_grad_(True) for n, t in w.items()}
    no_decay = {n for n, t in tp.items() if t.dim() <= 1 or n in ("cls", "pos")}
    opt = torch.optim.AdamW([{"params": [t for n, t in tp.items() if n not in no_decay], "weight_decay": WD},
                             {"params": [t for n, t in tp.items() if n in no_decay], "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.999), eps=EPS)
    losses, norms = [], []
    share = B // replicas
    for images, labels in data:
        rotated = torch.cat([torch.arange(share).roll(order) + r * share for r in range(replicas)])
        images, labels = images[rotated], labels[rotated]
        opt.zero_grad()
        loss = sum(forward_torch(tp, images[r * share:(r + 1) * share].to(dtype), labels[r * share:(r + 1) * share])
                   for r in range(replicas)) / replicas
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(list(tp.values()), CLIP).item())
        losses.append(loss.item())
        opt.step()
    return losses, norms, {n: t.detach().double() for n, t in tp.items()}


def within(name, got, f64, typical):
    """nabla (f32) must be as close to the f64 reference as torch's own f32
    runs typically are, give or take a factor of 4: a training step is as
    sensitive to rounding as its conditioning makes it, for either library.
    `typical` is torch-f32's largest distance over the run and its draws
    (one step's, or one draw's, can be near 0 by chance)."""
    err = abs(got - f64)
    expect(err <= 4 * typical, f"{name}: nabla is {err:.3e} from torch-f64, torch-f32 up to {typical:.3e}")
    return err


def test_training(replicas=1):
    """With replicas, the graph is built for a share of the batch and runs as
    that many copies (NABLA_TRAIN_REPLICAS), each share written through
    nabla_trainer_replica; the first share's labels hold the ignored one, so
    the shares' means weigh their images unequally, as in torch's reference."""
    print(f"training: a ViT, {STEPS} AdamW steps, {replicas} replica(s), against torch in f32 and f64")
    w = init_weights()
    data = batches()
    loss64, norm64, param64 = train_torch(w, data, torch.float64, replicas)
    # torch-f32's distance from f64 is one draw of rounding noise, and a
    # single draw can be lucky (a gradient norm 1 ulp off at one step, 6 at
    # another, by the summation order alone): its typical distance is the
    # largest over DRAWS runs that sum the same terms in other orders.
    draws = [train_torch(w, data, torch.float32, replicas, order) for order in range(DRAWS)]
    loss32, norm32, _ = draws[0]  # printed beside nabla's at each step
    loss_typical = max(abs(a - b) for d in draws for a, b in zip(d[0], loss64))
    norm_typical = max(abs(a - b) for d in draws for a, b in zip(d[1], norm64))

    nb = Nabla(LIB)
    share = B // replicas
    P, images_t, labels_t, loss_t = build_nabla(nb, w, share)
    trainer = ctypes.c_void_p()
    undecayed = (ctypes.c_void_p * 2)(P["cls"].value, P["pos"].value)
    nb.check(nb.lib.nabla_trainer_create(nb.ctx, loss_t, None, ctypes.c_size_t(0), ctypes.c_double(0.9),
                                         ctypes.c_double(0.999), ctypes.c_double(EPS), ctypes.c_double(WD),
                                         undecayed, ctypes.c_size_t(2), 2, replicas << 8 if replicas > 1 else 0,
                                         ctypes.byref(trainer)))
    for step, (images, labels) in enumerate(data):
        for r in range(replicas):
            for leaf, t in ((images_t, images), (labels_t, labels)):
                copy = ctypes.c_void_p()
                nb.check(nb.lib.nabla_trainer_replica(trainer, r, leaf, ctypes.byref(copy)))
                part = t[r * share:(r + 1) * share].contiguous()
                nb.check(nb.lib.nabla_tensor_write(nb.ctx, copy, ctypes.c_void_p(part.data_ptr()),
                                                   ctypes.c_size_t(part.numel() * part.element_size())))
        loss, norm = ctypes.c_float(), ctypes.c_double()
        nb.check(nb.lib.nabla_trainer_run(trainer, ctypes.byref(loss)))
        nb.check(nb.lib.nabla_trainer_update(trainer, ctypes.c_double(LR), ctypes.c_double(CLIP), ctypes.byref(norm)))
        el = within(f"step {step} loss", loss.value, loss64[step], loss_typical)
        en = within(f"step {step} grad norm", norm.value, norm64[step], norm_typical)
        print(f"  step {step}: loss {loss.value:.6f} (f64 {loss64[step]:.6f}; off by {el:.1e}, "
              f"torch-f32 {abs(loss32[step] - loss64[step]):.1e})  grad norm {norm.value:.4f} "
              f"(off by {en:.1e}, torch-f32 {abs(norm32[step] - norm64[step]):.1e})")

    for n in w:
        got = nb.read(P[n], lambda h, dst, nbytes: nb.lib.nabla_trainer_read(trainer, h, dst, nbytes)).double()
        moved = (param64[n] - w[n].double()).abs().max().item()
        expect(moved > 0.1 * LR, f"{n}: the f64 run moved it by only {moved}")
        # The largest error catches a wrong element; the mean, a bias in
        # every element smaller than the rounding noise of the worst one.
        diff = (got - param64[n]).abs()
        ref_diffs = [(d[2][n] - param64[n]).abs() for d in draws]
        err, ref_err = diff.max().item(), max(r.max().item() for r in ref_diffs)
        mean, ref_mean = diff.mean().item(), max(r.mean().item() for r in ref_diffs)
        ok = err <= 4 * ref_err and mean <= 2 * ref_mean
        print(f"  {n:8s} {'ok ' if ok else 'BAD'} off f64 by {err:.1e} max, {mean:.1e} mean "
              f"(torch-f32 draws {ref_err:.1e}, {ref_mean:.1e}), moved {moved:.1e}")
        expect(ok, f"{n}: nabla is {err:.3e} (mean {mean:.3e}) from torch-f64 after {STEPS} steps, "
                   f"torch-f32 {ref_err:.3e} ({ref_mean:.3e})")
    nb.close()


LIB = sys.argv[1] if len(sys.argv) > 1 else sys.exit("usage: ctypes_torch_test.py path/to/libnabla.so")
torch.set_num_threads(1)
test_ops()
test_training()
test_training(replicas=2)
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
