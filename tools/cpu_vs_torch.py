#!/usr/bin/env python3
"""Training step time on the CPU: frugal's Fashion-MNIST examples and ResNet-50 against PyTorch.

For each model (the CNN and the MLP of examples/mnist_train.cpp: make_model), runs
`build/examples/fashion_mnist --model M --device cpu --steps N` and the same model in
PyTorch (same layers, PyTorch's default initialization, Adam lr 1e-3, batch 64, shuffled
batches of the standardized training images gathered per step as frugal's loader does),
each as a fresh process, alternating (frugal, torch, frugal, torch, ...) so both see the
same machine load. Each run prints the median of its N step times; a model's figure is
the median over its --rounds runs. Prints one line per run, then

    cpu_step_ratio_cnn: <torch ms per step / frugal ms per step>
    cpu_step_ratio_mlp: ...

`--models resnet50` does the same for ResNet-50 (torchvision's v1.5, written out below, as
torchvision is not installed): `build/bench/train_step --model resnet50 --device cpu --optim sgd`
against PyTorch's model on one fixed random batch of --resnet-batch (8) images of
--image-size (224) pixels and random labels, SGD lr 0.01 momentum 0.9, float32, NCHW, one
warm-up step and --resnet-steps (3) timed ones per run.

(>= 1: frugal is at least as fast). Both sides get the same thread count, by default every
core the process may run on (OMP_NUM_THREADS for frugal, torch.set_num_threads for PyTorch,
whose own default on the 2-core development machine is 1). PyTorch comes from Debian's
python3-torch, installed with apt-get when `import torch` fails, on OpenBLAS
(libopenblas0-pthread, installed when PyTorch would load the reference BLAS).

    python3 tools/cpu_vs_torch.py [--build build] [--steps 200] [--rounds 3] [--models cnn,mlp,resnet50]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

from idx_file import read_idx

DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # examples/mnist_train.h: kFashionMnistMean, kFashionMnistStd


def torch_python():
    """An interpreter that imports torch: this one, else Debian's /usr/bin/python3 (where
    python3-torch installs it, when python3 on PATH is another), after apt-get when neither does."""
    candidates = [sys.executable] + (["/usr/bin/python3"] if os.path.exists("/usr/bin/python3") else [])

    def first_with_torch():
        for py in candidates:
            if subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
                return py
        return None

    py = first_with_torch()
    if py is None:
        print("cpu_vs_torch: import torch failed; apt-get install -y python3-torch", flush=True)
        subprocess.run(["apt-get", "install", "-y", "python3-torch"], check=True, stdout=subprocess.DEVNULL)
        py = first_with_torch()
    if py is None:
        sys.exit("cpu_vs_torch: no python3 imports torch, even after apt-get install python3-torch")
    if "openblas" not in torch_blas(py):
        # Debian's torch calls the system libblas.so.3: the reference BLAS unless OpenBLAS is
        # installed, which would make PyTorch's Linear layers several times slower than a pip
        # wheel's (MKL). Installing libopenblas0-pthread makes it the libblas alternative.
        print("cpu_vs_torch: PyTorch uses the reference BLAS; apt-get install -y libopenblas0-pthread", flush=True)
        subprocess.run(["apt-get", "install", "-y", "libopenblas0-pthread"], stdout=subprocess.DEVNULL)
    print(f"cpu_vs_torch: PyTorch's BLAS: {torch_blas(py)}", flush=True)
    return py


def torch_blas(py):
    """The BLAS library `py`'s torch maps after a product (from /proc/self/maps)."""
    code = ("import torch; torch.ones(4, 4) @ torch.ones(4, 4); "
            "print(' '.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libblas' in l})))")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def torch_model(kind):
    from torch import nn
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def torch_resnet50():
    """torchvision's resnet50() (v1.5: the stride on the 3x3 convolution), written out."""
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = mid * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
            self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
            self.conv3, self.bn3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                               if stride != 1 or cin != cout else None)

        def forward(self, x):
            r = x if self.downsample is None else self.downsample(x)
            y = self.bn1(self.conv1(x)).relu()
            y = self.bn2(self.conv2(y)).relu()
            return (self.bn3(self.conv3(y)) + r).relu()

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for mid, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(blocks):
            layers.append(Bottleneck(cin, mid, stride if i == 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


def torch_resnet_worker(args):
    """ResNet-50's SGD step on one fixed random batch; prints step_ms as train_step does."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = torch_resnet50()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.resnet_batch, 3, args.image_size, args.image_size)
    y = torch.randint(0, 1000, (args.resnet_batch,))
    times = []
    for i in range(1 + args.resnet_steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if i > 0:
            times.append((time.perf_counter() - start) * 1e3)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"step_ms: {statistics.median(times):.3f}")


def torch_worker(args):
    """Runs in its own process: prints step_ms, the median step time, as fashion_mnist --steps does."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    images = torch.from_numpy(read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz")).copy())
    labels = torch.from_numpy(read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz")).copy()).long()
    images = ((images.float() / 255 - MEAN) / STD).unsqueeze(1)  # (60000, 1, 28, 28), as frugal's loader gives
    model = torch_model(args.torch_worker)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    batch, n = args.batch_size, images.shape[0]
    order, pos = torch.randperm(n), 0
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        if pos + batch > n:
            order, pos = torch.randperm(n), 0
        idx = order[pos:pos + batch]
        pos += batch
        x, y = images.index_select(0, idx), labels.index_select(0, idx)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - start) * 1e3)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"final_loss: {loss.item():.4f}")
    print(f"step_ms: {statistics.median(times):.3f}")


def step_ms(cmd, env, tool="cpu_vs_torch"):
    """The step_ms: line of a run of `cmd` (a frugal or a torch worker); `tool` names the caller in errors."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{tool}: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    for line in p.stdout.splitlines():
        if line.startswith("step_ms:"):
            return float(line.split()[1])
    sys.exit(f"{tool}: no step_ms line from {' '.join(cmd)}:\n{p.stdout}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="frugal's build directory")
    ap.add_argument("--steps", type=int, default=200, help="training steps per run (the median is taken)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per framework and model, alternating")
    ap.add_argument("--models", default="cnn,mlp")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="threads for both (default: the cores this process may use)")
    ap.add_argument("--data-dir", default=DATA_DIR)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resnet-batch", type=int, default=8, help="ResNet-50's batch")
    ap.add_argument("--resnet-steps", type=int, default=3, help="ResNet-50's timed steps per run (after one warm-up)")
    ap.add_argument("--image-size", type=int, default=224, help="ResNet-50's image size")
    ap.add_argument("--torch-worker", choices=["cnn", "mlp", "resnet50"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker == "resnet50":
        return torch_resnet_worker(args)
    if args.torch_worker:
        return torch_worker(args)

    python = torch_python()
    binary = os.path.join(args.build, "examples", "fashion_mnist")
    train_step = os.path.join(args.build, "bench", "train_step")
    for model in args.models.split(","):
        needed = train_step if model == "resnet50" else binary
        if not os.access(needed, os.X_OK):
            sys.exit(f"cpu_vs_torch: {needed} not found; build it first (ninja -C {args.build})")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    common = ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--seed", str(args.seed)]
    ckpt_dir = os.path.join(args.build, "cpu_vs_torch_checkpoints")  # must be writable; --steps saves nothing
    resnet = ["--resnet-batch", str(args.resnet_batch), "--resnet-steps", str(args.resnet_steps), "--image-size",
              str(args.image_size)]
    for model in args.models.split(","):
        if model == "resnet50":
            frugal_cmd = [train_step, "--model", "resnet50", "--batch", str(args.resnet_batch), "--device", "cpu",
                          "--optim", "sgd", "--steps", str(args.resnet_steps), "--warmup", "1", "--image-size",
                          str(args.image_size)]
            torch_cmd = [python, os.path.abspath(__file__), "--torch-worker", model, "--threads", str(args.threads),
                         "--seed", str(args.seed)] + resnet
        else:
            frugal_cmd = [binary, "--model", model, "--device", "cpu", "--data-dir", args.data_dir,
                          "--checkpoint-dir", ckpt_dir] + common
            torch_cmd = [python, os.path.abspath(__file__), "--torch-worker", model, "--data-dir", args.data_dir,
                         "--threads", str(args.threads)] + common
        ms = {"frugal": [], "torch": []}
        for r in range(args.rounds):
            for side, cmd in (("frugal", frugal_cmd), ("torch", torch_cmd)):
                ms[side].append(step_ms(cmd, env))
                print(f"{model} round {r + 1}: {side:6s} {ms[side][-1]:8.3f} ms/step", flush=True)
        f, t = statistics.median(ms["frugal"]), statistics.median(ms["torch"])
        steps = args.resnet_steps if model == "resnet50" else args.steps
        print(f"{model}: frugal {f:.3f} ms/step, torch {t:.3f} ms/step (medians of {args.rounds} runs of "
              f"{steps} steps)")
        print(f"cpu_step_ratio_{model}: {t / f:.3f}", flush=True)


if __name__ == "__main__":
    main()
