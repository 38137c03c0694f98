"""Reads the IDX files of (Fashion-)MNIST (gzip-compressed) as numpy arrays, for the tools
that train the same data in PyTorch (parity_mlp.py, cpu_vs_torch.py)."""
import gzip


def read_idx(path):
    """The array in an .idx*-ubyte.gz file: uint8, shaped by the file's dims."""
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
