"""safetensors by hand (no safetensors package): an u64 LE header length, a
JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then
the raw little-endian data. Shared by the PyTorch oracles."""
import json
import struct
import sys

import torch

assert sys.byteorder == "little"
DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
          "F16": torch.float16, "BF16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: torch tensor}, written in that order."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        # numpy has no bfloat16: 16-bit floats go out as their bits.
        data = (t.view(torch.int16) if t.element_size() == 2 and t.is_floating_point() else t).numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)  # the format allows space padding to align the data
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """({name: torch tensor}, metadata dict)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dt = DTYPES[e["dtype"]]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=dt) if end > b else torch.zeros(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out, meta
