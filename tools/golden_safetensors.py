"""What the PyTorch golden generators share (tools/torch_golden_{ops,optim,modules}.py): a
safetensors writer with no dependency beyond torch, and the view steps their C++ tests replay.
"""
import json
import os
import struct

import torch

STORE = {torch.float64: "F64", torch.int64: "I64", torch.float32: "F32", torch.int32: "I32", torch.float16: "F16",
         torch.bfloat16: "BF16", torch.bool: "BOOL"}
DTYPE_NAME = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
              torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.bool: "bool"}
WIDTH = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "BOOL": 1}


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):  # numpy has no bfloat16: the raw bits
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def save_safetensors(path, tensors, metadata):
    """Writes as the Python library does: widest dtype first, then by name, packed; through a
    temporary file, so a failed run leaves the previous file whole."""
    order = sorted(tensors, key=lambda k: (-WIDTH[STORE[tensors[k].dtype]], k))
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for k in order:
        b = tensor_bytes(tensors[k])
        header[k] = {"dtype": STORE[tensors[k].dtype], "shape": list(tensors[k].shape),
                     "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def apply_view(t, steps):
    """The view steps of a case's input, as apply_view in the C++ tests replays them."""
    for s in steps:
        kind, a = s[0], s[1:]
        if kind == "transpose":
            t = t.transpose(a[0], a[1])
        elif kind == "permute":
            t = t.permute(*a)
        elif kind == "slice":  # dim, start, end, step
            dim, start, end, step = a
            idx = [slice(None)] * t.dim()
            idx[dim] = slice(start, end, step)
            t = t[tuple(idx)]
        elif kind == "expand":
            t = t.expand(*a)
        elif kind == "unsqueeze":
            t = t.unsqueeze(a[0])
        elif kind == "select":
            t = t.select(a[0], a[1])
        else:
            raise ValueError(kind)
    return t
