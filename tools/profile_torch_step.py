#!/usr/bin/env python3
"""Where PyTorch's step time goes, kernel by kernel: the peer's side of `train_step --profile`.

Builds the same workload as tools/train_step_torch.py (one row, eager or --compile), warms it
up, runs one step under torch.profiler and prints the CUDA kernels by total device time, with
the count and share of the step. Use it to see which fusions torch.compile makes that frugal's
op table (bench/train_step --profile DIR) lacks.

    python3 tools/profile_torch_step.py --row vit_b16-b128-amp --compile --top 40
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step_torch as ts  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--row", default="vit_b16-b128-amp")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--optim", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--channels-last", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.backends.cudnn.benchmark = True
    row = ts.parse_row(args.row)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model, loss_fn = ts.torch_workload(torch, row, args, device)
    if args.compile:
        model.compile()
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-4) if args.optim == "adamw"
           else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    scaler = torch.amp.GradScaler(device.type, enabled=row["amp"])

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.float16, enabled=row["amp"]):
            loss = loss_fn()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(4):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        k = kernels.setdefault(e.name, [0.0, 0])
        k[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        k[1] += 1
    total = sum(v[0] for v in kernels.values())
    print(f"{args.row}{' compile' if args.compile else ''}: {total / 1e3:.2f} device ms in {len(kernels)} kernels")
    print(f"{'ms':>8} {'share':>6} {'count':>6}  kernel")
    for name, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{us / 1e3:8.3f} {100 * us / total:5.1f}% {n:6d}  {name[:110]}")


if __name__ == "__main__":
    main()
