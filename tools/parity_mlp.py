#!/usr/bin/env python3
"""PyTorch parity for frugal's training loop (run on the GPU machine, which has PyTorch).

Runs build/tools/mlp_parity (frugal), then replays the same run in PyTorch: the same
MLP (784-512-256-10, ReLU) from the same initial weights (via safetensors), the same
batches in the same order, Adam(lr=1e-3) or SGD(lr=0.05, momentum=0.9), float32, TF32 off. Prints both loss
curves side by side and fails if any step differs by more than 1e-4 relative.

    python3 tools/parity_mlp.py --build /tmp/b --data-dir data/fashion-mnist --device cuda
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file

from idx_file import read_idx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    args = ap.parse_args()

    out = tempfile.mkdtemp(prefix="frugal_parity_")
    subprocess.run([os.path.join(args.build, "tools", "mlp_parity"), "--data-dir", args.data_dir, "--out", out,
                    "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--device", args.device,
                    "--optimizer", args.optimizer],
                   check=True)
    frugal_losses = [float(l) for l in open(os.path.join(out, "frugal_losses.txt"))]

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model.load_state_dict(load_file(os.path.join(out, "mlp_init.safetensors")))
    model.to(dev)
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images = torch.from_numpy(read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz")).copy())
    labels = torch.from_numpy(read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz")).astype(np.int64))
    images = images.float().div(255.0).unsqueeze(1)

    worst = 0.0
    print(f"{'step':>4} {'frugal':>12} {'pytorch':>12} {'rel diff':>10}")
    for step in range(args.steps):
        lo = step * args.batch_size
        x = images[lo:lo + args.batch_size].to(dev)
        y = labels[lo:lo + args.batch_size].to(dev)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref = loss.item()
        rel = abs(frugal_losses[step] - ref) / abs(ref)
        worst = max(worst, rel)
        if step < 5 or step % 10 == 9:
            print(f"{step:>4} {frugal_losses[step]:>12.7f} {ref:>12.7f} {rel:>10.2e}")
    print(f"parity_max_rel_diff: {worst:.3e} over {args.steps} steps, {args.optimizer} on {args.device} "
          f"(tolerance {args.rtol})")
    return 0 if worst <= args.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
