#!/usr/bin/env python3
"""One training step in PyTorch eager against frugal's bench/train_step, row by row.

Each row is a (model, batch, precision, checkpointing) configuration. PyTorch runs it in this
process: torchvision resnet50 / vit_b_16, Hugging Face BertForMaskedLM with the bert-base
config (its default attention implementation), on a fixed random batch on the device; forward
under torch.autocast(float16) for AMP, loss (cross entropy over 1000 classes; BERT: the MLM
loss with 15% of the tokens labelled, the others -100), backward through torch.amp.GradScaler
(enabled with AMP), SGD momentum 0.9 (or AdamW), zero_grad(set_to_none=True), with
cudnn.benchmark on (the warm-up steps absorb its algorithm search). ResNet with AMP
on CUDA runs channels_last (as frugal's --channels-last auto). Checkpointing wraps each
torchvision block in torch.utils.checkpoint (non-reentrant); HF BERT uses
gradient_checkpointing_enable(). With --frugal PATH, frugal's binary runs the same row as a
separate process (so neither framework's cache holds memory during the other's run).

Timing: --warmup steps (3), then --steps measured steps (8), each synchronized; the median.
Peak memory: torch.cuda.max_memory_allocated after reset_peak_memory_stats following warm-up
(frugal: memory::reset_peak likewise). Each row is printed as soon as it is measured; a row that
fails (OOM, crash, timeout) shows the error and the table goes on.

    python3 tools/train_step_torch.py --frugal build/bench/train_step            # the 7 default rows
    python3 tools/train_step_torch.py --frugal build/bench/train_step --rows resnet50-b128-amp,bert_base-b64-amp
    python3 tools/train_step_torch.py --frugal build/bench/train_step --compile   # and a torch.compile column
    python3 tools/train_step_torch.py --frugal build/bench/train_step --cuda-graph --rows resnet50-b16-amp,vit_b16-b16-amp
    python3 tools/train_step_torch.py --frugal build/bench/train_step --skip-torch --device cpu \\
        --rows resnet50-b2-fp32 --image-size 64 --steps 1 --warmup 1             # CPU smoke run

float32 rows run without TF32 on both sides unless --tf32 on (PyTorch's default allows it
for cuDNN convolutions, so its fp32 ResNet figure in issue 5 used TF32 convolutions).

Columns: torch ms, frugal ms, frugal's fwd+bwd host ms (near frugal ms: host-bound), throughput ratio = torch ms / frugal ms (>= 1: frugal at least as
fast), torch and frugal peak allocated GiB, peak ratio = frugal / torch (<= 1: frugal uses less).
"""
import argparse
import gc
import re
import statistics
import subprocess
import sys
import time

DEFAULT_ROWS = [
    "resnet50-b128-fp32",
    "resnet50-b128-amp",
    "resnet50-b128-amp-ckpt",
    "vit_b16-b128-amp",
    "vit_b16-b128-amp-ckpt",
    "bert_base-b64-amp",
    "bert_base-b64-amp-ckpt",
]
ROW_PATTERN = re.compile(r"^(resnet50|vit_b16|bert_base)-b(\d+)-(fp32|amp)(-ckpt)?$")


def parse_row(name):
    m = ROW_PATTERN.match(name)
    if not m:
        raise SystemExit(f"train_step_torch: row '{name}' is not MODEL-bN-fp32|amp[-ckpt] "
                         "with MODEL resnet50, vit_b16 or bert_base")
    return {"name": name, "model": m.group(1), "batch": int(m.group(2)), "amp": m.group(3) == "amp",
            "ckpt": m.group(4) is not None}


# ---- PyTorch -------------------------------------------------------------------------------

def mlm_labels(torch, batch, tokens, vocab, gen):
    """round(15%) of each sequence's positions (at least one) hold a random token, others -100."""
    labelled = max(1, (tokens * 15 + 50) // 100)
    labels = torch.full((batch, tokens), -100, dtype=torch.long)
    for b in range(batch):
        pos = torch.randperm(tokens, generator=gen)[:labelled]
        labels[b, pos] = torch.randint(0, vocab, (labelled,), generator=gen)
    return labels


class Checkpointed:
    """Factory for a module wrapper that runs the wrapped block under torch.utils.checkpoint."""

    @staticmethod
    def wrap(torch, block):
        import torch.utils.checkpoint as cp

        class Wrapper(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return cp.checkpoint(self.inner, x, use_reentrant=False)

        return Wrapper(block)


def torch_workload(torch, row, args, device):
    """(model, loss_fn) for the row, on device, in train mode."""
    import torchvision
    gen = torch.Generator().manual_seed(0)
    batch, amp, ckpt = row["batch"], row["amp"], row["ckpt"]
    if row["model"] in ("resnet50", "vit_b16"):
        size = args.image_size
        if row["model"] == "resnet50":
            model = torchvision.models.resnet50()
            if ckpt:
                for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
                    for i in range(len(layer)):
                        layer[i] = Checkpointed.wrap(torch, layer[i])
        else:
            model = torchvision.models.vit_b_16(image_size=size)
            if ckpt:
                layers = model.encoder.layers
                for i in range(len(layers)):
                    layers[i] = Checkpointed.wrap(torch, layers[i])
        model = model.to(device)
        x = torch.randn(batch, 3, size, size, generator=gen).to(device)
        y = torch.randint(0, 1000, (batch,), generator=gen).to(device)
        channels_last = (row["model"] == "resnet50" and amp and device.type == "cuda"
                         if args.channels_last == "auto" else args.channels_last == "on")
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        loss_fn = lambda: torch.nn.functional.cross_entropy(model(x), y)
    else:
        import transformers
        config = transformers.BertConfig()  # bert-base-uncased's sizes
        model = transformers.BertForMaskedLM(config)
        if ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = model.to(device)
        ids = torch.randint(0, config.vocab_size, (batch, args.seq_len), generator=gen).to(device)
        labels = mlm_labels(torch, batch, args.seq_len, config.vocab_size, gen).to(device)
        mask = None
        if args.padding:  # as train_step --padding: odd sequences lose their last quarter of tokens
            mask = torch.ones(batch, args.seq_len, dtype=torch.long)
            mask[1::2, args.seq_len * 3 // 4:] = 0
            mask = mask.to(device)
        loss_fn = lambda: model(input_ids=ids, attention_mask=mask, labels=labels).loss
    model.train()
    return model, loss_fn


def run_torch(row, args):
    """{'ms', 'peak_gib'} for one row in PyTorch eager, or under torch.compile when the row has
    'compile_budget' (torch._functorch.config.activation_memory_budget: 1.0 is compile's
    default, lower values let its partitioner recompute activations to fit that fraction)."""
    import torch
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model, loss_fn = torch_workload(torch, row, args, device)
    budget = row.get("compile_budget")
    if budget is not None:
        import torch._dynamo
        import torch._functorch.config as functorch_config
        torch._dynamo.reset()  # a fresh compile per row: the budget is read when the graph is partitioned
        functorch_config.activation_memory_budget = budget
        model.compile()  # in place: loss_fn keeps calling model(...)
    if args.optim == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=row["amp"])
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if cuda else None
    mark = (lambda i: marks[i].record()) if cuda else (lambda i: None)

    def step():  # the phase marks as frugal's train_step: forward, backward, optimizer
        mark(0)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.float16, enabled=row["amp"]):
            loss = loss_fn()
        mark(1)
        scaler.scale(loss).backward()
        mark(2)
        scaler.step(opt)
        scaler.update()
        mark(3)

    for _ in range(args.warmup):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times, phases = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
        if cuda:
            phases.append([marks[i].elapsed_time(marks[i + 1]) for i in range(3)])
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else float("nan")
    return {"ms": statistics.median(times) * 1e3, "peak_gib": peak,
            "phases": [statistics.median(p[i] for p in phases) for i in range(3)] if phases else None}


def free_torch_memory():
    gc.collect()
    if "torch" in sys.modules:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ---- frugal --------------------------------------------------------------------------------

def run_frugal(row, args):
    """{'ms', 'peak_gib'} from frugal's train_step, run as its own process."""
    cmd = [args.frugal, "--model", row["model"], "--batch", str(row["batch"]), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--optim", args.optim, "--device", args.device,
           "--channels-last", args.channels_last, "--image-size", str(args.image_size),
           "--seq-len", str(args.seq_len)]
    if args.padding:
        cmd.append("--padding")
    if row["amp"]:
        cmd.append("--amp")
    if row["ckpt"]:
        cmd.append("--checkpoint")
    if args.tf32 == "on":
        cmd.append("--tf32")
    if args.cuda_graph:
        cmd.append("--cuda-graph")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.row_timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {args.row_timeout} s")
    if p.returncode != 0:
        lines = (p.stderr.strip() or p.stdout.strip() or f"exit {p.returncode}").splitlines()
        raise RuntimeError(f"exit {p.returncode}: {lines[-1]}")
    figures = dict(re.findall(r"^(\w+): (\S+)$", p.stdout, re.M))
    m = re.search(r"device ms per phase \(median\): forward (\S+), backward (\S+), optimizer (\S+)", p.stdout)
    return {"ms": float(figures["step_ms"]), "peak_gib": float(figures["peak_allocated_gib"]),
            "host_ms": float(figures.get("host_ms", "nan")),
            "phases": [float(m.group(i)) for i in (1, 2, 3)] if m else None}


# ---- table ---------------------------------------------------------------------------------

COLUMNS = [("row", 24), ("torch ms", 10), ("frugal ms", 10), ("host ms", 9), ("thru ratio", 10), ("torch GiB", 10),
           ("frugal GiB", 10), ("peak ratio", 10)]


# With --compile: torch.compile's step time and frugal's speed over it (torch.compile ms / frugal ms).
COMPILE_COLUMNS = [("compile ms", 10), ("x compile", 9)]


def print_line(cells, columns=COLUMNS):
    out = []
    for (name, width), cell in zip(columns, cells):
        out.append(cell.ljust(width) if name == "row" else cell.rjust(width))
    print("  ".join(out), flush=True)


def attempt(fn, row, args):
    """(result, None) or (None, error text). Frees torch's memory afterwards, once the
    exception (whose traceback holds the failed step's tensors) is gone."""
    result, error = None, None
    try:
        result = fn(row, args)
    except Exception as e:  # one row's failure must not end the table
        message = str(e).strip().splitlines()
        error = f"{type(e).__name__}: {message[0] if message else ''}"[:200]
    free_torch_memory()
    return result, error


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frugal", help="path of frugal's train_step binary (build/bench/train_step)")
    ap.add_argument("--rows", help="comma-separated rows, e.g. resnet50-b128-amp,bert_base-b64-amp-ckpt "
                                   "(default: the 7 rows of issue 5)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--optim", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--channels-last", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--padding", action="store_true",
                    help="BERT rows get an attention_mask: odd sequences' last quarter of tokens padded")
    ap.add_argument("--row-timeout", type=int, default=150, help="seconds per frugal row")
    ap.add_argument("--tf32", choices=["on", "off"], default="off",
                    help="TF32 for float32 convolutions and matmuls on both sides (torch's own default "
                         "turns it on for cuDNN convolutions; off compares the same float32 math)")
    ap.add_argument("--skip-torch", action="store_true", help="frugal's column only (no torch needed)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="frugal's rows replay a captured step (train_step --cuda-graph; SGD, or a capturable AdamW); PyTorch stays eager")
    ap.add_argument("--compile", action="store_true",
                    help="also run each row under torch.compile (default inductor, in this process) and print "
                         "its ms and frugal's throughput over it")
    args = ap.parse_args()
    if not args.frugal and args.skip_torch:
        raise SystemExit("train_step_torch: --skip-torch needs --frugal")
    rows = [parse_row(r.strip()) for r in (args.rows.split(",") if args.rows else DEFAULT_ROWS) if r.strip()]

    if not args.skip_torch:
        import torch
        torch.backends.cudnn.benchmark = True  # as torchvision's reference training scripts
        torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
        torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
        print(f"torch {torch.__version__} on {args.device}", flush=True)
    print(f"{args.optim}, median of {args.steps} steps after {args.warmup} warm-up; "
          f"images {args.image_size}, BERT tokens {args.seq_len}{' (odd sequences padded by a quarter)' if args.padding else ''}",
          flush=True)
    columns = COLUMNS + (COMPILE_COLUMNS if args.compile and not args.skip_torch else [])
    print_line([c for c, _ in columns], columns)
    print("-" * (sum(w for _, w in columns) + 2 * (len(columns) - 1)), flush=True)
    errors = []
    for row in rows:
        t, t_err = (None, "skipped") if args.skip_torch else attempt(run_torch, row, args)
        f, f_err = (None, "no --frugal") if not args.frugal else attempt(run_frugal, row, args)
        fmt = lambda r, key, spec: format(r[key], spec) if r else "-"
        thru = f"{t['ms'] / f['ms']:.2f}" if t and f else "-"
        peak = (f"{f['peak_gib'] / t['peak_gib']:.2f}" if t and f and t["peak_gib"] == t["peak_gib"]
                and t["peak_gib"] > 0 else "-")
        cells = [row["name"], fmt(t, "ms", ".1f"), fmt(f, "ms", ".1f"), fmt(f, "host_ms", ".1f"), thru,
                 fmt(t, "peak_gib", ".2f"), fmt(f, "peak_gib", ".2f"), peak]
        c_err = None
        if len(columns) > len(COLUMNS):
            c, c_err = attempt(run_torch, dict(row, compile_budget=1.0), args)
            cells += [fmt(c, "ms", ".1f"), f"{c['ms'] / f['ms']:.2f}" if c and f else "-"]
        print_line(cells, columns)
        if t and f and t.get("phases") and f.get("phases"):
            show = lambda ph: " / ".join(f"{v:.1f}" for v in ph)
            print(f"    device ms forward / backward / optimizer: torch {show(t['phases'])}, "
                  f"frugal {show(f['phases'])}", flush=True)
        for who, err in (("torch", t_err), ("frugal", f_err), ("torch.compile", c_err)):
            if err and err not in ("skipped", "no --frugal"):
                print(f"    {who} error: {err}", flush=True)
                errors.append((row["name"], who))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
