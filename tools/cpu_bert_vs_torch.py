#!/usr/bin/env python3
"""BERT training step time on the CPU: frugal's train_step --model bert_mlm against PyTorch.

The model is examples/bert_mlm's default BERT (4 layers, hidden 256, 4 heads, intermediate 1024,
vocab 8000, 128 positions, dropout 0.1 in the embeddings, the attention probabilities and after
each projection, LayerNorm eps 1e-12, exact GELU), trained as masked LM on a fixed random batch
(batch 8 x 128 tokens, round(15%) of each sequence's positions labelled, the others -100) with
AdamW (lr 1e-4, weight decay 0.01), float32, no attention mask. frugal runs
`build/bench/train_step --model bert_mlm --device cpu --optim adamw`; PyTorch runs the same model
written out in this file, layer for layer as Hugging Face's BertForMaskedLM (eager attention:
matmul, scale, softmax, dropout, matmul; the decoder tied to the word embeddings), each step
zero_grad(set_to_none=True), forward, loss, backward, AdamW step. Each run is a fresh process;
runs alternate (frugal, torch, frugal, torch, ...) so both see the same machine load; a run
prints the median of its --steps step times after --warmup steps; a side's figure is the median
over --rounds runs. Prints one line per run, then

    cpu_step_ratio_bert: <torch ms per step / frugal ms per step>   (>= 1: frugal is at least as fast)

--torch-head says which rows PyTorch's MLM head projects onto the vocabulary: `all` (Hugging
Face's BertForMaskedLM: logits for every token, cross entropy ignores the -100 rows) or
`labelled` (the labelled rows only, gathered first: the FLOPs frugal's linear_cross_entropy
spends, Note [Fused linear cross entropy]); `both` (the default) times each and prints a
ratio for each. Both sides get the same thread count (OMP_NUM_THREADS for frugal,
torch.set_num_threads for PyTorch). PyTorch is found (or installed) as tools/cpu_vs_torch.py does.

    python3 tools/cpu_bert_vs_torch.py [--build build] [--steps 20] [--warmup 3] [--rounds 3]
                                       [--batch 8] [--seq-len 128] [--threads N] [--torch-head all|labelled|both]
"""
import argparse
import math
import os
import statistics
import sys
import time

from cpu_vs_torch import step_ms, torch_python

# examples/bert_mlm's default model (bench/train_step.cpp: bert_mlm_config).
CONFIG = dict(vocab=8000, hidden=256, layers=4, heads=4, intermediate=1024, positions=128, type_vocab=2,
              dropout=0.1, eps=1e-12, init_std=0.02)


def torch_bert(torch, c):
    """Hugging Face's BertForMaskedLM (no pooler), written out: parameter for parameter the same model."""
    from torch import nn
    F = nn.functional

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            H, I = c["hidden"], c["intermediate"]
            self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
            self.attn_out, self.attn_ln = nn.Linear(H, H), nn.LayerNorm(H, eps=c["eps"])
            self.inter, self.out, self.out_ln = nn.Linear(H, I), nn.Linear(I, H), nn.LayerNorm(H, eps=c["eps"])
            self.drop = nn.Dropout(c["dropout"])

        def heads(self, x):  # (B, T, H) -> (B, nh, T, D)
            B, T, H = x.shape
            return x.view(B, T, c["heads"], H // c["heads"]).permute(0, 2, 1, 3)

        def forward(self, h):
            q, k, v = self.heads(self.query(h)), self.heads(self.key(h)), self.heads(self.value(h))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            probs = self.drop(F.softmax(scores, dim=-1))
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(h.shape)
            a = self.attn_ln(self.drop(self.attn_out(ctx)) + h)
            return self.out_ln(self.drop(self.out(F.gelu(self.inter(a)))) + a)

    class BertMLM(nn.Module):
        def __init__(self):
            super().__init__()
            H = c["hidden"]
            self.word = nn.Embedding(c["vocab"], H, padding_idx=0)
            self.pos, self.token_type = nn.Embedding(c["positions"], H), nn.Embedding(c["type_vocab"], H)
            self.emb_ln, self.drop = nn.LayerNorm(H, eps=c["eps"]), nn.Dropout(c["dropout"])
            self.layers = nn.ModuleList([Layer() for _ in range(c["layers"])])
            self.transform, self.transform_ln = nn.Linear(H, H), nn.LayerNorm(H, eps=c["eps"])
            self.bias = nn.Parameter(torch.zeros(c["vocab"]))
            for m in self.modules():  # BertPreTrainedModel._init_weights
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    m.weight.data.normal_(0.0, c["init_std"])
                if isinstance(m, nn.Linear):
                    m.bias.data.zero_()
            self.word.weight.data[0].zero_()

        def forward(self, ids, labels, head):
            T = ids.shape[1]
            positions = torch.arange(T)
            h = self.word(ids) + self.token_type(torch.zeros_like(ids)) + self.pos(positions)
            h = self.drop(self.emb_ln(h))
            for layer in self.layers:
                h = layer(h)
            h, labels = h.reshape(-1, h.shape[-1]), labels.reshape(-1)
            if head == "labelled":
                keep = (labels != -100).nonzero().squeeze(1)
                h, labels = h.index_select(0, keep), labels.index_select(0, keep)
            t = self.transform_ln(F.gelu(self.transform(h)))
            logits = F.linear(t, self.word.weight, self.bias)  # the decoder, tied
            return F.cross_entropy(logits, labels, ignore_index=-100)

    return BertMLM()


def mlm_labels(torch, batch, tokens, vocab, gen):
    """round(15%) of each sequence's positions (at least one) labelled with a random token, the rest -100."""
    labels = torch.full((batch, tokens), -100, dtype=torch.long)
    labelled = max(1, (tokens * 15 + 50) // 100)
    for b in range(batch):
        pos = torch.randperm(tokens, generator=gen)[:labelled]
        labels[b, pos] = torch.randint(0, vocab, (labelled,), generator=gen)
    return labels


def torch_worker(args):
    """Runs in its own process: prints step_ms, the median step time, as train_step does."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    model = torch_bert(torch, CONFIG)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids = torch.randint(0, CONFIG["vocab"], (args.batch, args.seq_len), generator=gen)
    labels = mlm_labels(torch, args.batch, args.seq_len, CONFIG["vocab"], gen)
    times = []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(ids, labels, args.torch_worker)
        loss.backward()
        opt.step()
        if i >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    print(f"final_loss: {loss.item():.4f}")
    print(f"step_ms: {statistics.median(times):.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="frugal's build directory")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run (the median is taken)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--rounds", type=int, default=3, help="runs per framework, alternating")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="threads for both (default: the cores this process may use)")
    ap.add_argument("--torch-head", choices=["all", "labelled", "both"], default="both")
    ap.add_argument("--torch-worker", choices=["all", "labelled"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)

    python = torch_python()
    binary = os.path.join(args.build, "bench", "train_step")
    if not os.access(binary, os.X_OK):
        sys.exit(f"cpu_bert_vs_torch: {binary} not found; build it first (ninja -C {args.build} bench/train_step)")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--seq-len", str(args.seq_len)]
    heads = ["all", "labelled"] if args.torch_head == "both" else [args.torch_head]
    sides = {"frugal": [binary, "--model", "bert_mlm", "--device", "cpu", "--optim", "adamw", "--batch",
                        str(args.batch)] + common}
    for head in heads:
        sides[f"torch_{head}"] = [python, os.path.abspath(__file__), "--torch-worker", head, "--batch",
                                  str(args.batch), "--threads", str(args.threads)] + common
    ms = {side: [] for side in sides}
    for r in range(args.rounds):
        for side, cmd in sides.items():
            ms[side].append(step_ms(cmd, env, "cpu_bert_vs_torch"))
            print(f"bert round {r + 1}: {side:15s} {ms[side][-1]:9.3f} ms/step", flush=True)
    f = statistics.median(ms["frugal"])
    print(f"bert (batch {args.batch} x {args.seq_len}, {args.threads} threads): frugal {f:.3f} ms/step "
          f"(median of {args.rounds} runs of {args.steps} steps)")
    for head in heads:
        t = statistics.median(ms[f"torch_{head}"])
        print(f"  torch, head on {head} rows: {t:.3f} ms/step")
        suffix = "" if head == "labelled" else "_hf_head"
        print(f"cpu_step_ratio_bert{suffix}: {t / f:.3f}", flush=True)


if __name__ == "__main__":
    main()
