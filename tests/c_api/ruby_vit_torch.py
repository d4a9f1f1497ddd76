"""A ViT trained from Ruby (examples/ruby/train_vit.rb, through nabla's C
API) must load by name into a timm-layout PyTorch ViT and compute the same
test logits: the round trip an FFI framework's users make with real weights.

Usage: ruby_vit_torch.py CHECKPOINT LOGITS [DATA_DIR]

CHECKPOINT is train_vit.rb's --save output, LOGITS its --logits output (f32
logits of the first N test images, N a multiple of 64). The model is
tests/oracle/vit_oracle.py's VisionTransformer (timm's structure and names),
loaded strictly: every name, shape and no extra tensor. Exits 1 when a
logit differs by more than 1e-4 of the largest, or a prediction differs.
"""
import gzip
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "oracle"))
from safetensors_io import read_safetensors  # noqa: E402
from vit_oracle import VisionTransformer  # noqa: E402

CONFIG = {"architecture": "vit", "img_size": 28, "patch_size": 7, "in_chans": 1, "embed_dim": 64, "depth": 2,
          "num_heads": 4, "mlp_ratio": 2.0, "num_classes": 10, "global_pool": "token", "qkv_bias": True,
          "norm_eps": 1e-6, "gelu": "gelu_erf"}


def main():
    ckpt, logits_path = sys.argv[1], sys.argv[2]
    data = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
    torch.set_num_threads(1)
    model = VisionTransformer(CONFIG)
    state, _ = read_safetensors(ckpt)
    model.load_state_dict(state, strict=True)
    model.eval()

    nabla_logits = torch.frombuffer(bytearray(open(logits_path, "rb").read()), dtype=torch.float32).reshape(-1, 10)
    n = nabla_logits.shape[0]
    with gzip.open(os.path.join(data, "t10k-images-idx3-ubyte.gz")) as f:
        raw = f.read()[16:16 + n * 784]
    pixels = torch.frombuffer(bytearray(raw), dtype=torch.uint8).float().reshape(n, 1, 28, 28)
    images = pixels / 255 * (1 / 0.3530) - 0.2860 / 0.3530  # train_vit.rb's normalisation
    with torch.no_grad():
        logits = model(images)
    err = (logits - nabla_logits).abs().max().item()
    scale = logits.abs().max().item()
    same = (logits.argmax(1) == nabla_logits.argmax(1)).sum().item()
    print(f"{len(state)} tensors loaded by name into a timm-layout torch ViT; logits of {n} test images "
          f"differ by at most {err:.2e} (largest {scale:.2f}); {same}/{n} predictions agree")
    if err > 1e-4 * scale or same != n:
        sys.exit(1)


if __name__ == "__main__":
    main()
