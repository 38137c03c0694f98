#!/usr/bin/env python3
"""The memory frontier: step time against peak memory, PyTorch's points and frugal's, per model.

For each model (AMP; ResNet-50 b128 224px channels-last, ViT-B/16 b128, BERT-base MLM
b64 x 128; SGD momentum, as tools/train_step_torch.py, whose workloads and timing this
reuses) it measures
  PyTorch: eager, eager + checkpointing, torch.compile (default), and torch.compile with
           torch._functorch.config.activation_memory_budget 0.5 and 0.2;
  frugal:  each --frugal-point NAME=ARGS, bench/train_step's flags for one point (default:
           "default=", "selective=--checkpoint selective" and "checkpoint=--checkpoint"), then
           one point per --budget F: the memory planner's plan for F x PyTorch eager's peak
           (train_step --memory-budget; F x frugal's default peak with --skip-torch).
It prints one table (step ms, samples/s, peak allocated GiB, peak / eager's) and writes the
frontier as an SVG (--svg, default frontier.svg): one panel per model, x = peak GiB,
y = step ms, one curve per system (lower left is better).

    python3 tools/frontier.py --frugal build/bench/train_step
    python3 tools/frontier.py --frugal build/bench/train_step --models bert_base --frugal-point 'selective=--checkpoint selective'
    python3 tools/frontier.py --frugal build/bench/train_step --skip-torch --device cpu \\
        --models resnet50 --batch 2 --image-size 64 --steps 1 --warmup 1      # CPU smoke run
    python3 tools/frontier.py --redraw vit.log bert_resnet.log --svg frontier.svg  # the picture again, from
                                                                                   # tables printed by earlier runs
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step_torch as tst  # noqa: E402

MODELS = {"resnet50": 128, "vit_b16": 128, "bert_base": 64}  # batch per model
TORCH_POINTS = [("eager", {}), ("eager + checkpointing", {"ckpt": True}), ("compile", {"compile_budget": 1.0}),
                ("compile, budget 0.5", {"compile_budget": 0.5}), ("compile, budget 0.2", {"compile_budget": 0.2})]
DEFAULT_FRUGAL_POINTS = ["default=", "selective=--checkpoint selective", "checkpoint=--checkpoint"]
DEFAULT_BUDGETS = "0.7,0.5,0.33,0.25"


def frugal_point(spec):
    name, sep, flags = spec.partition("=")
    if not sep or not name:
        raise SystemExit(f"frontier: --frugal-point wants NAME=ARGS, got '{spec}'")
    return name, shlex.split(flags)


def run_frugal(row, flags, args, name=""):
    """{'ms', 'peak_gib'} from bench/train_step with the point's flags (its output kept in
    --log-dir, when given: the planner's per-block table is there)."""
    cmd = [args.frugal, "--model", row["model"], "--batch", str(row["batch"]), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--device", args.device, "--image-size", str(args.image_size),
           "--seq-len", str(args.seq_len), "--amp"] + flags
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.row_timeout)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        with open(os.path.join(args.log_dir, re.sub(r"[^\w.-]+", "_", f"{row['model']}_{name}") + ".txt"), "w") as f:
            f.write(" ".join(cmd) + "\n" + p.stdout + p.stderr)
    if p.returncode != 0:
        lines = (p.stderr.strip() or p.stdout.strip() or f"exit {p.returncode}").splitlines()
        raise RuntimeError(f"exit {p.returncode}: {lines[-1]}")
    figures = dict(re.findall(r"^(\w+): (\S+)$", p.stdout, re.M))
    return {"ms": float(figures["step_ms"]), "peak_gib": float(figures["peak_allocated_gib"])}


TABLE_ROW = re.compile(r"^(\w+)\s+(PyTorch eager|PyTorch compile|frugal)\s+(.+?)\s+([\d.]+)\s+(\d+)\s+([\d.]+)\s+(\S+)$")


def rows_of(paths):
    """The measured rows of the tables earlier runs printed (error rows left out)."""
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                m = TABLE_ROW.match(line.rstrip())
                if m:
                    rows.append({"model": m[1], "system": m[2], "point": m[3], "ms": float(m[4]),
                                 "peak_gib": float(m[6])})
    return rows


def attempt(fn):
    try:
        return fn(), None
    except Exception as e:  # one point's failure must not end the table
        message = str(e).strip().splitlines()
        return None, f"{type(e).__name__}: {message[0] if message else ''}"[:160]
    finally:
        tst.free_torch_memory()


def svg(results, path):
    """One panel per model: x = peak GiB, y = step ms; a polyline per system."""
    colors = {"PyTorch eager": "#d62728", "PyTorch compile": "#ff7f0e", "frugal": "#1f77b4"}
    W, H, pad = 360, 280, 50
    models = list(dict.fromkeys(r["model"] for r in results))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(models)}" height="{H + 30}" '
           f'font-family="sans-serif" font-size="11">']
    for k, model in enumerate(models):
        pts = [r for r in results if r["model"] == model and r["ms"] is not None]
        if not pts:
            continue
        x0 = k * W
        xmax = max(r["peak_gib"] for r in pts) * 1.1
        ymax = max(r["ms"] for r in pts) * 1.1
        sx = lambda v: x0 + pad + v / xmax * (W - pad - 10)  # noqa: E731
        sy = lambda v: H - pad + 10 - v / ymax * (H - pad - 10)  # noqa: E731
        out.append(f'<text x="{x0 + W / 2}" y="14" text-anchor="middle" font-weight="bold">{model} (AMP)</text>')
        out.append(f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(xmax)}" y2="{sy(0)}" stroke="black"/>')
        out.append(f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(0)}" y2="{sy(ymax)}" stroke="black"/>')
        out.append(f'<text x="{x0 + W / 2}" y="{H + 5}" text-anchor="middle">peak allocated (GiB)</text>')
        out.append(f'<text x="{x0 + 12}" y="{H / 2}" transform="rotate(-90 {x0 + 12} {H / 2})" '
                   f'text-anchor="middle">step (ms)</text>')
        for frac in (0.25, 0.5, 0.75, 1.0):
            out.append(f'<text x="{sx(xmax * frac / 1.1)}" y="{sy(0) + 12}" text-anchor="middle">'
                       f'{xmax * frac / 1.1:.3g}</text>')
            out.append(f'<text x="{sx(0) - 4}" y="{sy(ymax * frac / 1.1) + 4}" text-anchor="end">'
                       f'{ymax * frac / 1.1:.3g}</text>')
        for system, color in colors.items():
            line = sorted((r for r in pts if r["system"] == system), key=lambda r: r["peak_gib"])
            if len(line) > 1:
                coords = " ".join(f"{sx(r['peak_gib']):.1f},{sy(r['ms']):.1f}" for r in line)
                out.append(f'<polyline points="{coords}" fill="none" stroke="{color}"/>')
            for r in line:
                out.append(f'<circle cx="{sx(r["peak_gib"]):.1f}" cy="{sy(r["ms"]):.1f}" r="3" fill="{color}">'
                           f'<title>{system} {r["point"]}: {r["ms"]:.1f} ms, {r["peak_gib"]:.2f} GiB</title></circle>')
        for i, (system, color) in enumerate(colors.items()):
            out.append(f'<text x="{x0 + W - 10}" y="{30 + 14 * i}" text-anchor="end" fill="{color}">{system}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frugal", help="path of frugal's train_step binary (build/bench/train_step)")
    ap.add_argument("--redraw", nargs="+", metavar="LOG", help="draw --svg from the tables in these logs; run nothing")
    ap.add_argument("--frugal-point", action="append", help="NAME=ARGS: one frugal point (repeatable)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: resnet50,vit_b16,bert_base")
    ap.add_argument("--batch", type=int, help="one batch for every model (default: 128, 128, 64)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--row-timeout", type=int, default=300, help="seconds per frugal point")
    ap.add_argument("--skip-torch", action="store_true", help="frugal's points only (no torch needed)")
    ap.add_argument("--svg", default="frontier.svg", help="where the picture goes")
    ap.add_argument("--budgets", default=DEFAULT_BUDGETS,
                    help="comma-separated fractions of PyTorch eager's peak, one planned frugal point each ('' for none)")
    ap.add_argument("--plan-choices", help="train_step --plan-choices for the budget points")
    ap.add_argument("--log-dir", help="keep each frugal run's output there")
    ap.add_argument("--torch-cache", help="JSON file of PyTorch points: read where it has a point, written with "
                    "each point measured (the torch.compile points take minutes; measure them once per machine)")
    args = ap.parse_args()
    if args.redraw:
        rows = rows_of(args.redraw)
        if not rows:
            raise SystemExit(f"frontier: no table rows in {', '.join(args.redraw)}")
        svg(rows, args.svg)
        print(f"frontier: wrote {args.svg} from {len(rows)} rows")
        return 0
    if not args.frugal:
        raise SystemExit("frontier: --frugal PATH is needed (or --redraw LOG...)")
    # What train_step_torch's workloads read from args.
    args.optim, args.channels_last, args.tf32 = "sgd", "auto", "off"
    points = [frugal_point(p) for p in (args.frugal_point or DEFAULT_FRUGAL_POINTS)]
    budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"frontier: unknown model '{m}' (resnet50, vit_b16, bert_base)")
    if not args.skip_torch:
        import torch
        torch.backends.cudnn.benchmark = True
        print(f"torch {torch.__version__} on {args.device}", flush=True)

    cache = {}
    if args.torch_cache and os.path.exists(args.torch_cache):
        with open(args.torch_cache) as f:
            cache = json.load(f)

    def torch_point(key, fn):
        """The cached result of `key` (model/point), else fn()'s, then cached."""
        if key in cache:
            return cache[key]
        r = fn()
        if args.torch_cache:
            cache[key] = {"ms": r["ms"], "peak_gib": r["peak_gib"]}
            with open(args.torch_cache, "w") as f:
                json.dump(cache, f, indent=1)
        return r

    results, failures = [], 0
    header = f"{'model':<10} {'system':<16} {'point':<24} {'step ms':>8} {'samples/s':>10} {'peak GiB':>9} {'x eager':>8}"
    print(header + "\n" + "-" * len(header), flush=True)
    for model in models:
        batch = args.batch or MODELS[model]
        base = {"name": model, "model": model, "batch": batch, "amp": True, "ckpt": False}
        eager_peak = None
        runs = [] if args.skip_torch else [("PyTorch " + ("compile" if "compile_budget" in extra else "eager"), name,
                                            lambda extra=extra, name=name: torch_point(
                                                f"{model}/{batch}/{name}", lambda: tst.run_torch({**base, **extra}, args)))
                                           for name, extra in TORCH_POINTS]
        runs += [("frugal", name, lambda flags=flags, name=name: run_frugal(base, flags, args, name))
                 for name, flags in points]
        for f in budgets:
            def planned(f=f):
                # Relative to PyTorch eager's peak when it ran (it runs first), else to frugal's default.
                budget = f"{f * eager_peak:.4f}GiB" if eager_peak else f"{f}x"
                flags = ["--memory-budget", budget] + (["--plan-choices", args.plan_choices] if args.plan_choices else [])
                return run_frugal(base, flags, args, f"budget {f}")
            runs.append(("frugal", f"budget {f}x eager" if not args.skip_torch else f"budget {f}x", planned))
        for system, name, fn in runs:
            r, err = attempt(fn)
            entry = {"model": model, "system": system, "point": name, "ms": r["ms"] if r else None,
                     "peak_gib": r["peak_gib"] if r else None}
            results.append(entry)
            if r is None:
                failures += 1
                print(f"{model:<10} {system:<16} {name:<24} error: {err}", flush=True)
                continue
            if system == "PyTorch eager" and name == "eager":
                eager_peak = r["peak_gib"]
            ratio = f"{r['peak_gib'] / eager_peak:.2f}" if eager_peak else "-"
            print(f"{model:<10} {system:<16} {name:<24} {r['ms']:8.1f} {batch / r['ms'] * 1e3:10.0f} "
                  f"{r['peak_gib']:9.2f} {ratio:>8}", flush=True)
    svg(results, args.svg)
    print(f"frontier: wrote {args.svg}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
