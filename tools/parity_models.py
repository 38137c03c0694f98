#!/usr/bin/env python3
"""PyTorch parity for frugal's models: ResNet, BERT and ViT (run on the GPU machine, which has
torch, torchvision, transformers and safetensors).

For each model it builds the PyTorch original (torchvision ResNet / VisionTransformer, Hugging
Face BertForMaskedLM) with seeded random weights (every parameter and batch-norm statistic
drawn, so no zero-initialised head hides a gradient), dropout off, and writes into --out:
  <case>_config.json          the config run_model reads (--config-json)
  <case>_weights.safetensors  the model's state_dict (all of torch's keys, tied ones included)
  <case>_inputs.safetensors   pixel_values or input_ids/attention_mask/token_type_ids, and labels
  <case>_golden_<mode>.safetensors  logits, loss, grad.<parameter>, buffer.<name> (train mode)
The goldens are computed in float64 (on --device), from the float32 weights and inputs, so they
are the exact answer the float32 runs are measured against. Then it runs build/examples/run_model
on the same files (float32, and --amp on cuda; resnet in train and eval mode) and prints the
largest relative error of every output, max|frugal - torch| / max|torch| per tensor (for gradients
the denominator is at least the bound x the model's largest gradient), against the
bounds: float32 logits, loss and buffers 1e-4, gradients 1e-3 (against the float64 goldens); AMP
everything 1e-2 against PyTorch's own AMP run (write_torch_run; the rows "torch-amp" show how far
that run is from float64, for context; the rows "torch-fp32" do the same for PyTorch's own
float32 run). A tensor over its bound passes only if frugal is no further from float64 than
twice PyTorch's own run in that precision, or, under AMP, within PyTorch's worst tensor of its
kind while frugal is no less accurate over that kind as a whole (Note [Parity of
ill-conditioned outputs]). Exit 1
on a failure.

    python3 tools/parity_models.py --build /tmp/b --device cuda            # small configs
    python3 tools/parity_models.py --build /tmp/b --device cuda --full     # + resnet50, bert-base, vit_b_16
    python3 tools/parity_models.py --golden                                # write tests/golden/ only

Small configs: resnet18 at 64x64, batch 2; BERT 2 layers, hidden 64, 4 heads, vocab 512,
batch 2 x 16 tokens with padding; ViT 2 layers, hidden 64, 4 heads, 32x32 images, 8x8 patches.
--golden writes those into tests/golden/ (float64 goldens computed on the CPU) for
tests/cpu/test_models.cpp, small enough to commit (about 12 MB): weights stored as float16
(rounded before the goldens are computed, so these stay exact), and ResNet-18 replaced by
"resnet10" (ResNet(BasicBlock, [1, 1, 1, 1]), 32x32) with a selection of its gradients.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import torchvision
import transformers
from safetensors.torch import save_file

BOUNDS = {"fp32": {"logits": 1e-4, "loss": 1e-4, "grad": 1e-3, "buffer": 1e-4},
          "amp": {"logits": 1e-2, "loss": 1e-2, "grad": 1e-2, "buffer": 1e-2}}


# ---- models with random weights -------------------------------------------------------------

def randomize(model, gen):
    """Draws every parameter and batch-norm statistic: weights N(0, 1/fan_in), norm scales
    1 + N(0, 0.1^2), everything else N(0, 0.1^2); running_var U(0.5, 1.5)."""
    norms = (torch.nn.BatchNorm2d, torch.nn.LayerNorm)
    norm_params = {id(p) for m in model.modules() if isinstance(m, norms) for p in m.parameters(recurse=False)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if id(p) in norm_params and name.endswith("weight"):
                p.copy_(1 + 0.1 * r)
            elif p.dim() >= 2 and p.shape[0] > 1:
                p.copy_(r / (p[0].numel() ** 0.5))
            else:
                p.copy_(0.1 * r)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen, dtype=torch.float64))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen, dtype=torch.float64))
            elif name.endswith("num_batches_tracked"):
                b.fill_(3)


def make_resnet(depth, num_classes):
    return getattr(torchvision.models, f"resnet{depth}")(num_classes=num_classes), {"depth": depth, "num_classes": num_classes}


def make_resnet10(num_classes):
    model = torchvision.models.resnet.ResNet(torchvision.models.resnet.BasicBlock, [1, 1, 1, 1], num_classes=num_classes)
    return model, {"depth": 18, "blocks_per_layer": [1, 1, 1, 1], "num_classes": num_classes}


def make_vit(image_size, patch_size, num_layers, num_heads, hidden_dim, mlp_dim, num_classes):
    cfg = dict(image_size=image_size, patch_size=patch_size, num_layers=num_layers, num_heads=num_heads,
               hidden_dim=hidden_dim, mlp_dim=mlp_dim, num_classes=num_classes)
    return torchvision.models.VisionTransformer(**cfg), cfg


def make_bert(**kw):
    config = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     architectures=["BertForMaskedLM"], **kw)
    try:
        config._attn_implementation = "eager"  # the spelled-out softmax path (sdpa gives the same result)
    except Exception:
        pass
    model = transformers.BertForMaskedLM(config)
    return model, json.loads(config.to_json_string())


def image_inputs(gen, batch, channels, size, classes):
    return {"pixel_values": torch.randn(batch, channels, size, size, generator=gen),
            "labels": torch.randint(0, classes, (batch,), generator=gen)}


def text_inputs(gen, batch, seq, vocab):
    ids = torch.randint(1, vocab, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, seq * 3 // 4:] = 0  # the last sequence ends in padding
    ids[mask == 0] = 0
    types = torch.zeros(batch, seq, dtype=torch.int64)
    types[:, seq // 2:] = 1
    labels = torch.full((batch, seq), -100, dtype=torch.int64)
    pick = (torch.rand(batch, seq, generator=gen) < 0.3) & (mask == 1)
    pick[0, 1] = True
    labels[pick] = torch.randint(0, vocab, (int(pick.sum()),), generator=gen)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": labels}


def cases(full, golden=False):
    """(case, run_model --model, builder, inputs builder, modes)."""
    if golden:  # ResNet-18's 45 MB of weights are too much for the repository: one block per layer
        resnet = ("resnet10", "resnet18", lambda: make_resnet10(10), lambda g: image_inputs(g, 2, 3, 32, 10),
                  ["train", "eval"])
    else:
        resnet = ("resnet18", "resnet18", lambda: make_resnet(18, 10), lambda g: image_inputs(g, 2, 3, 64, 10),
                  ["train", "eval"])
    out = [
        resnet,
        ("bert", "bert", lambda: make_bert(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=256, max_position_embeddings=64),
         lambda g: text_inputs(g, 2, 16, 512), ["eval"]),
        ("vit", "vit", lambda: make_vit(32, 8, 2, 4, 64, 128, 10), lambda g: image_inputs(g, 2, 3, 32, 10), ["eval"]),
    ]
    if full:
        out += [
            ("resnet50_full", "resnet50", lambda: make_resnet(50, 1000), lambda g: image_inputs(g, 2, 3, 224, 1000),
             ["train", "eval"]),
            ("bert_base_full", "bert", lambda: make_bert(), lambda g: text_inputs(g, 2, 128, 30522), ["eval"]),
            ("vit_b16_full", "vit", lambda: make_vit(224, 16, 12, 12, 768, 3072, 1000),
             lambda g: image_inputs(g, 2, 3, 224, 1000), ["eval"]),
        ]
    return out


def forward_loss(model, inputs):
    if "pixel_values" in inputs:
        logits = model(inputs["pixel_values"])
        return logits, torch.nn.functional.cross_entropy(logits, inputs["labels"])
    out = model(**inputs)
    return out.logits, out.loss


def selected(names, all_grads):
    if all_grads or len(names) <= 12:
        return names
    mid = len(names) // 2
    return names[:4] + names[mid - 2:mid + 2] + names[-4:]


def write_case(out_dir, case, builder, inputs_builder, modes, device, seed, all_grads, half=False):
    """Writes config, weights, inputs and one float64 golden per mode; returns the file prefix.
    half: weights stored as float16 (values rounded first, so the goldens are exact for them)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model, config = builder()
    randomize(model, gen)
    if half:
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                if t.is_floating_point():
                    t.copy_(t.half().float())
    inputs = inputs_builder(gen)
    prefix = os.path.join(out_dir, case + "_")
    with open(prefix + "config.json", "w") as f:
        json.dump(config, f, indent=1)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file({k: v.half() if half and v.is_floating_point() else v for k, v in state.items()},
              prefix + "weights.safetensors")
    save_file({k: v.contiguous() for k, v in inputs.items()}, prefix + "inputs.safetensors")
    for mode in modes:
        m = builder()[0]  # a fresh copy per mode: train mode moves the statistics
        m.load_state_dict(state)
        m = m.to(device=device, dtype=torch.float64)
        m.train(mode == "train")
        x = {k: (v.to(device, torch.float64) if v.is_floating_point() else v.to(device)) for k, v in inputs.items()}
        logits, loss = forward_loss(m, x)
        loss.backward()
        golden = {"logits": logits.detach().float().cpu(), "loss": loss.detach().float().cpu()}
        names = [n for n, p in m.named_parameters() if p.grad is not None]
        grads = dict(m.named_parameters())
        for n in selected(names, all_grads):
            golden["grad." + n] = grads[n].grad.float().cpu()
        if mode == "train":
            for n, b in m.named_buffers():
                golden["buffer." + n] = (b.float() if b.is_floating_point() else b).cpu()
        save_file({k: v.contiguous() for k, v in golden.items()}, f"{prefix}golden_{mode}.safetensors")
    return prefix


def write_torch_run(prefix, builder, modes, device, all_grads, amp):
    """PyTorch's own run from the float32 weights: with amp, autocast float16 on cuda and
    backward with GradScaler's dynamic scale (start at 2^16, halve while a gradient overflows,
    unscale), the reference frugal's --amp run is measured against (two float16 runs agree to
    1e-2 where either one's distance from the float64 answer can be larger: ReLU masks and
    batch statistics of a tiny batch flip under float16 rounding); without, plain float32
    (TF32 off), which only gives context: how far PyTorch's float32 is from float64."""
    from safetensors.torch import load_file
    state = load_file(prefix + "weights.safetensors")
    inputs = load_file(prefix + "inputs.safetensors")
    for mode in modes:
        m = builder()[0]
        m.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
        m = m.to(device).train(mode == "train")
        x = {k: v.to(device) for k, v in inputs.items()}
        with torch.autocast(device, dtype=torch.float16, enabled=amp):
            logits, loss = forward_loss(m, x)
        scale = 65536.0 if amp else 1.0
        while True:
            m.zero_grad(set_to_none=True)
            (loss.float() * scale).backward(retain_graph=True)
            finite = all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
            if finite or scale < 2:
                break
            scale /= 2
        golden = {"logits": logits.detach().float().cpu(), "loss": loss.detach().float().cpu()}
        names = [n for n, p in m.named_parameters() if p.grad is not None]
        params = dict(m.named_parameters())
        for n in selected(names, all_grads):
            golden["grad." + n] = (params[n].grad.float() / scale).cpu()
        if mode == "train":
            for n, b in m.named_buffers():
                golden["buffer." + n] = (b.float() if b.is_floating_point() else b).cpu()
        suffix = "golden_{}_amp" if amp else "torch_{}_fp32"
        save_file({k: v.contiguous() for k, v in golden.items()}, f"{prefix}{suffix.format(mode)}.safetensors")


# ---- comparing frugal's outputs --------------------------------------------------------------

def rel_error(a, b, floor=1e-30):
    a, b = a.double(), b.double()
    if a.shape != b.shape:
        return float("inf")
    return ((a - b).abs().max() / b.abs().max().clamp_min(floor)).item()


def errors_by_key(prefix, mode, result_file, bounds):
    """{key: max relative error of result_file's tensor against golden_<mode>'s}."""
    from safetensors.torch import load_file
    want = load_file(f"{prefix}golden_{mode}.safetensors")
    got = load_file(result_file)
    # A gradient that is zero in exact arithmetic (BERT's key bias: softmax ignores a shift
    # shared by every key) is measured against the model's gradient scale, not its own
    # rounding noise: the denominator is at least the gradient bound x the largest gradient.
    grad_scale = max((ref.double().abs().max().item() for k, ref in want.items() if k.startswith("grad.")), default=0)
    errors = {}
    for key, ref in want.items():
        floor = bounds["grad"] * grad_scale if kind_of(key) == "grad" else 1e-30
        errors[key] = rel_error(got[key], ref, floor) if key in got else float("inf")
    return errors


def kind_of(key):
    return key.split(".")[0] if "." in key else key


def worst_by_kind(errors, judged=None):
    """[(kind, err, key)] with the largest error of each kind (among `judged` keys if given)."""
    worst = {}
    for key, err in errors.items():
        if judged is not None and key not in judged:
            continue
        if err > worst.get(kind_of(key), (-1, ""))[0]:
            worst[kind_of(key)] = (err, key)
    return [(kind, err, key) for kind, (err, key) in worst.items()]


# Note [Parity of ill-conditioned outputs]
# Some outputs are ill-conditioned at the test point: in train mode a convolution's weight
# gradient behind a batch norm is a difference of nearly equal terms (the norm's backward
# subtracts the batch mean and the projection on x-hat), so float32 rounding alone moves it
# by percents. PyTorch's own float32 run is then as far from the float64 answer as frugal's
# (ResNet-50 train mode: 5.2e-2 against frugal's 5.3e-2 on layer3.0.conv3.weight), and under
# AMP two float16 runs disagree by more than either one's distance from float64 suggests
# (ReLU masks flip). An output over its bound still passes when frugal's distance from the
# float64 answer is at most twice PyTorch's own in the same precision, tensor by tensor: no
# less accurate than the reference implementation. Such rows say "(<= 2x torch)" and give
# both distances, so the table never hides the raw error.
#
# Under AMP even that tensor-by-tensor comparison is a lottery at the small configs: a
# layer4 batch norm of ResNet-18 at 64x64, batch 2, sums 8 values per channel, so one ReLU
# mask flipped by float16 rounding moves a bias gradient by tens of percents, in whichever
# run it happens to flip. Over seeds 0-5 each implementation had such outliers in different
# tensors (frugal up to 3.4x PyTorch's distance on some, PyTorch up to 7x frugal's on
# others), and the geometric mean below was 0.48-1.13 over the 12 ResNet-18 runs. So an
# AMP output of a kind (say, gradients) also passes when its distance from float64 is
# within PyTorch's worst distance over that kind, provided frugal is not less accurate over
# the kind as a whole: the geometric mean over its tensors of frugal's distance / PyTorch's
# is at most POPULATION_RATIO. Every AMP run prints that mean ("accuracy" rows).
TORCH_ALLOWANCE = 2.0
POPULATION_RATIO = 1.25


def accuracy_by_kind(frugal_f64, torch_f64):
    """{kind: (geometric mean of frugal/torch distances from float64, tensors, torch's worst)}."""
    import math
    logs, worst = {}, {}
    for key, theirs in torch_f64.items():
        ours = frugal_f64.get(key, float("inf"))
        if theirs < float("inf"):  # one overflow of PyTorch's must not excuse the whole kind
            worst[kind_of(key)] = max(worst.get(kind_of(key), 0.0), theirs)
        if 0 < theirs < float("inf") and 0 < ours < float("inf"):
            logs.setdefault(kind_of(key), []).append(math.log(ours / theirs))
    return {kind: (math.exp(sum(v) / len(v)), len(v), worst.get(kind, 0.0)) for kind, v in logs.items()}


def judge(prefix, mode, precision, frugal_file, torch_file):
    """Rows (kind, err, bound, note) for frugal's run, whether all pass, and PyTorch's run's
    errors against float64 ({key: err}, the table's context rows)."""
    bounds = BOUNDS[precision]
    golden_mode = mode if precision == "fp32" else mode + "_amp"
    against_ref = errors_by_key(prefix, golden_mode, frugal_file, bounds)
    frugal_f64 = errors_by_key(prefix, mode, frugal_file, bounds)
    torch_f64 = errors_by_key(prefix, mode, torch_file, bounds)
    over = {k for k, e in against_ref.items() if not e <= bounds[kind_of(k)]}
    accuracy = accuracy_by_kind(frugal_f64, torch_f64) if precision == "amp" else {}

    def excused_by(k):
        if frugal_f64[k] <= TORCH_ALLOWANCE * torch_f64[k]:
            return "<= 2x torch"
        ratio, _, torch_worst = accuracy.get(kind_of(k), (float("inf"), 0, 0.0))
        if ratio <= POPULATION_RATIO and frugal_f64[k] <= torch_worst:
            return f"<= torch's worst {kind_of(k)} {torch_worst:.2e}"
        return None
    excused = {k for k in over if excused_by(k)}
    rows = []
    for kind, err, key in worst_by_kind(against_ref, set(against_ref) - excused):
        if key in over:  # say how far each one is from float64, as for the excused rows
            key = f"{key} (vs float64: frugal {frugal_f64[key]:.2e}, torch {torch_f64[key]:.2e})"
        rows.append((kind, err, bounds[kind], key))
    by_twice = {k for k in excused if excused_by(k) == "<= 2x torch"}
    for group in (by_twice, excused - by_twice):  # the worst excused by each rule, so neither hides
        for kind, err, key in worst_by_kind(against_ref, group):
            note = (f"{key} ({excused_by(key)}: vs float64 frugal {frugal_f64[key]:.2e}, "
                    f"torch {torch_f64[key]:.2e})")
            rows.append((kind, err, float("inf"), note))
    for kind, (ratio, count, torch_worst) in sorted(accuracy.items()):
        rows.append(("accuracy", ratio, float("inf"),
                     f"{kind}: frugal/torch distance from float64, geometric mean over {count} "
                     f"(<= {POPULATION_RATIO} for the population rule)"))
    return rows, not (over - excused), torch_f64


def explain(prefix, mode, frugal_file, torch_file, key, label, count=8):
    """The `count` elements of `key` where frugal and PyTorch differ most, beside float64."""
    from safetensors.torch import load_file
    exact = load_file(f"{prefix}golden_{mode}.safetensors")
    ours, theirs = load_file(frugal_file), load_file(torch_file)
    if key not in exact or key not in ours or key not in theirs:
        return
    x, a, b = (t[key].double().flatten() for t in (exact, ours, theirs))
    print(f"{label}: {key} {tuple(exact[key].shape)}, max |float64| {x.abs().max().item():.3e}")
    print(f"  {'index':>8} {'float64':>12} {'torch':>12} {'frugal':>12} {'frugal-torch':>13}")
    for i in (a - b).abs().argsort(descending=True)[:count].tolist():
        print(f"  {i:>8} {x[i].item():>12.4e} {b[i].item():>12.4e} {a[i].item():>12.4e} {(a[i] - b[i]).item():>13.3e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="/tmp/frugal_parity_models")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--full", action="store_true", help="also resnet50 at 224, bert-base, vit_b_16")
    ap.add_argument("--golden", action="store_true", help="only write the small goldens into tests/golden/")
    ap.add_argument("--only", default="", help="comma-separated cases to run (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--explain", default="", help="a tensor name (e.g. grad.layer3.1.bn2.bias): print its elements "
                                                  "where frugal and PyTorch differ most, with the float64 answer")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    if args.golden:
        out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden")
        os.makedirs(out, exist_ok=True)
        for case, _, builder, inputs_builder, modes in cases(False, golden=True):
            write_case(out, case, builder, inputs_builder, modes, "cpu", args.seed,
                       all_grads=not case.startswith("resnet"), half=True)
            print(f"wrote {os.path.normpath(out)}/{case}_*")
        return 0

    os.makedirs(args.out, exist_ok=True)
    run_model = os.path.join(args.build, "examples", "run_model")
    only = set(filter(None, args.only.split(",")))
    table, failed = [], False
    for case, model_name, builder, inputs_builder, modes in cases(args.full):
        if only and case not in only:
            continue
        prefix = write_case(args.out, case, builder, inputs_builder, modes, args.device, args.seed,
                            all_grads=not case.endswith("_full"))
        write_torch_run(prefix, builder, modes, args.device, all_grads=not case.endswith("_full"), amp=False)
        if args.device == "cuda":
            write_torch_run(prefix, builder, modes, args.device, all_grads=not case.endswith("_full"), amp=True)
        for mode in modes:
            precisions = ["fp32"] + (["amp"] if args.device == "cuda" else [])
            for precision in precisions:
                result = f"{prefix}frugal_{mode}_{precision}.safetensors"
                cmd = [run_model, "--model", model_name, "--config-json", prefix + "config.json",
                       "--weights", prefix + "weights.safetensors", "--inputs", prefix + "inputs.safetensors",
                       "--out", result, "--device", args.device, "--backward"]
                if mode == "train":
                    cmd.append("--train-mode")
                if precision == "amp":
                    cmd.append("--amp")
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0 and "autocast not available" in proc.stderr:
                    table.append((case, mode, precision, "skipped", 0.0, 0.0, "autocast not in this build"))
                    continue
                if proc.returncode != 0:
                    table.append((case, mode, precision, "run_model", float("inf"), 0.0, proc.stderr.strip()[-200:]))
                    failed = True
                    continue
                torch_run = f"{prefix}golden_{mode}_amp.safetensors" if precision == "amp" else \
                    f"{prefix}torch_{mode}_fp32.safetensors"
                if args.explain:
                    explain(prefix, mode, result, torch_run, args.explain, f"{case} {mode} {precision}")
                rows, ok, torch_f64 = judge(prefix, mode, precision, result, torch_run)
                for kind, err, bound, key in rows:
                    table.append((case, mode, precision, kind, err, bound, key))
                failed |= not ok
                # context: how far PyTorch's own run in this precision is from float64
                for kind, err, key in worst_by_kind(torch_f64):
                    table.append((case, mode, "torch-" + precision, kind, err, float("inf"), "vs float64: " + key))

    print(f"{'case':<16}{'mode':<7}{'prec':<6}{'output':<10}{'max rel err':>12}{'bound':>9}  worst tensor")
    for case, mode, precision, kind, err, bound, key in table:
        flag = "" if err <= bound else "  FAIL"
        shown = "-" if bound == float("inf") else f"{bound:.0e}"
        print(f"{case:<16}{mode:<7}{precision:<6}{kind:<10}{err:>12.3e}{shown:>9}  {key}{flag}")
    print("parity_models:", "FAILED" if failed else "all within bounds")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
