#!/usr/bin/env python3
"""PyTorch goldens for frugal's nn modules: numbers, parameter shapes and state_dict keys.

Writes tests/golden/modules_torch.safetensors, which tests/golden_replay/modules.cpp
reads. Users port models from PyTorch expecting a module built with the same settings to take
the same state_dict (same keys, same shapes) and give the same outputs and gradients; the op
goldens (tools/torch_golden_ops.py) check the functions underneath, these check the modules:
their defaults, how they pass their settings on, their train/eval behaviour, their buffers.

Each case builds one torch module from a spec (the module's name and its torch constructor
arguments; Sequential and ModuleList nest specs), gives every parameter and floating buffer
seeded random values, and stores, under keys "<id>.<what>":
  state.<key>   the module's state_dict (float32; num_batches_tracked int64), by torch's names.
  in<i>         the stored base of input i (float32, int64, int32 or bool); the metadata names
                the views that make the module's argument from it (transpose, permute, strided
                slice, select), as in tools/torch_golden_ops.py.
  gout<k>       the upstream gradient of output k (float32).
  out<k>        output k, computed by torch in float64 from the stored float32 values (the
                module converted with .double() after its state was stored).
  grad.in<i>    d(sum_k out_k * gout_k) / d(base of input i), float64, for inputs with a gradient.
  grad.<param>  the same for each parameter (torch's named_parameters() names).
  after.<key>   each buffer after the forward calls (running statistics), float64 / int64.
The case list is JSON in the file's __metadata__ ("cases"): per case its family, the spec, the
kind of call (unary: m(x); chain: a ModuleList applied in order; mha: MultiheadAttention's
forward with its masks and flags; bert_layer), train or eval, how many forward calls (the last
one is compared and differentiated), the dtype frugal runs the module in (float32, or float64:
module.to(float64), with float64 bounds), the state keys in torch's order with shapes and
dtypes, the parameter and buffer names in torch's order, the inputs' views and the outputs'
shapes.

Where torch 1.13 lacks a module or a semantics, the golden is computed as torch 2.x does it:
  RMSNorm (torch 2.4's nn.RMSNorm): x * rsqrt(mean(x^2) + eps) * weight over the trailing
    dims, eps=None meaning the machine epsilon of the input's dtype (float32's for the stored
    float32 cases, float64's for the float64 ones).
  MultiheadAttention with a float key_padding_mask together with an attn_mask, or with
    is_causal: torch 2.x turns each bool mask into -inf/0 and adds the masks (1.13 would
    or/masked_fill them); frugal's is_causal applies the causal mask itself. The golden passes
    torch that sum as one (B*H, L, S) float attn_mask, built differentiably from the stored
    masks so their gradients are torch's too.
Models with a torch peer are compared with it: frugal's BertLayer with nn.TransformerEncoderLayer
(post-norm, exact GELU, in_proj split into query/key/value under Hugging Face's names, the
(B, T) 0/1 attention mask as src_key_padding_mask) and the ViT EncoderBlock with
nn.TransformerEncoderLayer(norm_first=True) under torchvision's names (ln_1, self_attention,
ln_2, mlp.0, mlp.3); both key lists are written in those libraries' orders, and check_peers()
checks both renamings against those layers written out. frugal's ResNet BasicBlock and
Bottleneck are compared with torchvision's, written out here (torchvision is not installed),
in train mode with their downsample shortcut and through frugal's fused paths (the spec's
"frugal" member: fused bn+relu, fused conv+bn), which must give the same numbers.
Every float32 case is also run by torch in float32: the generator refuses a case where torch's
own float32 results use more than half of the C++ float32 bound (so a failure is frugal's, not
float32 rounding's), unless the case says its exact answer is one torch's float32 kernels miss.
Left out: dropout with 0 < p < 1 in training (not comparable across frameworks); an attention
row whose every key is masked (frugal documents zero weights, torch 1.13 gives NaN); and the
torch options frugal's modules lack (listed in the test file's header).

Regenerate (a dev-time tool: Debian's PyTorch, CPU only; never a dependency of frugal or CI):

    apt-get install -y python3-torch
    /usr/bin/python3 tools/torch_golden_modules.py       # writes tests/golden/modules_torch.safetensors
    /usr/bin/python3 tools/torch_golden_modules.py --out /tmp/modules.safetensors

The output is deterministic (seeded); the file stays under 1.5 MB.
"""
import argparse
import collections
import copy
import json
import os
import sys
import warnings

import torch
import torch.nn as nn

from golden_safetensors import DTYPE_NAME, apply_view, save_safetensors

SEED = 20240618
INF = float("inf")


class In:
    """One input: a stored base and the views that make the module's argument from it."""

    def __init__(self, base, view=(), grad=None, layout="contiguous"):
        self.base, self.view, self.layout = base, [list(s) for s in view], layout
        self.grad = base.is_floating_point() if grad is None else grad

    def shape(self):
        return tuple(apply_view(self.base, self.view).shape)


# ---- modules from specs ----------------------------------------------------------------------

class RMSNorm(nn.Module):
    """torch 2.x's nn.RMSNorm (absent from 1.13): same parameter name, same formula."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.eps_dtype = torch.float32  # the dtype frugal runs the case in (Gen.case sets it)
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        eps = self.eps if self.eps is not None else torch.finfo(self.eps_dtype).eps
        dims = list(range(-len(self.normalized_shape), 0))
        y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
        return y * self.weight if self.weight is not None else y


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock (torchvision is not a dependency), with the
    downsample _make_layer would pass it: same names, same registration order, same forward."""
    expansion = 1

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _downsample(inplanes, planes * self.expansion, stride)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (self.downsample(x) if self.downsample is not None else x))


class Bottleneck(nn.Module):
    """torchvision.models.resnet.Bottleneck (v1.5: the stride in conv2), as BasicBlock."""
    expansion = 4

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample = _downsample(inplanes, planes * self.expansion, stride)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (self.downsample(x) if self.downsample is not None else x))


def _downsample(inplanes, outplanes, stride):
    if stride == 1 and inplanes == outplanes:
        return None
    return nn.Sequential(nn.Conv2d(inplanes, outplanes, 1, stride, bias=False), nn.BatchNorm2d(outplanes))


ACTIVATIONS = {"ReLU": nn.ReLU, "GELU": nn.GELU, "Tanh": nn.Tanh, "SiLU": nn.SiLU, "Sigmoid": nn.Sigmoid,
               "LeakyReLU": nn.LeakyReLU, "ELU": nn.ELU, "Hardtanh": nn.Hardtanh, "ReLU6": nn.ReLU6,
               "Hardsigmoid": nn.Hardsigmoid, "Hardswish": nn.Hardswish, "Mish": nn.Mish, "Flatten": nn.Flatten,
               "Dropout": nn.Dropout}
SIMPLE = {"Linear": nn.Linear, "Conv2d": nn.Conv2d, "MaxPool2d": nn.MaxPool2d, "AvgPool2d": nn.AvgPool2d,
          "AdaptiveAvgPool2d": nn.AdaptiveAvgPool2d, "BatchNorm2d": nn.BatchNorm2d, "LayerNorm": nn.LayerNorm,
          "GroupNorm": nn.GroupNorm, "RMSNorm": RMSNorm, "Embedding": nn.Embedding,
          "MultiheadAttention": nn.MultiheadAttention, "BasicBlock": BasicBlock, "Bottleneck": Bottleneck,
          **ACTIVATIONS}


def _tel(d_model, nhead, ffn, dropout, attention_dropout, norm_first, eps):
    assert dropout == attention_dropout, "nn.TransformerEncoderLayer has one dropout probability"
    return nn.TransformerEncoderLayer(d_model, nhead, ffn, dropout=dropout, activation="gelu", layer_norm_eps=eps,
                                      batch_first=True, norm_first=norm_first)


def _bert_names(d):
    """nn.TransformerEncoderLayer's tensors (post-norm) under Hugging Face BertLayer's names, in its order."""
    r = collections.OrderedDict()
    w, b = d["self_attn.in_proj_weight"], d["self_attn.in_proj_bias"]
    for i, n in enumerate(("query", "key", "value")):
        r["attention.self.%s.weight" % n] = w.chunk(3, 0)[i]
        r["attention.self.%s.bias" % n] = b.chunk(3, 0)[i]
    for new, old in (("attention.output.dense", "self_attn.out_proj"), ("attention.output.LayerNorm", "norm1"),
                     ("intermediate.dense", "linear1"), ("output.dense", "linear2"), ("output.LayerNorm", "norm2")):
        r[new + ".weight"], r[new + ".bias"] = d[old + ".weight"], d[old + ".bias"]
    assert len(r) == len(d) + 4
    return r


def _vit_names(d):
    """nn.TransformerEncoderLayer's tensors (pre-norm) under torchvision EncoderBlock's names, in its order."""
    r = collections.OrderedDict()
    for new, old in (("ln_1", "norm1"), ("self_attention.in_proj", "self_attn.in_proj"),
                     ("self_attention.out_proj", "self_attn.out_proj"), ("ln_2", "norm2"), ("mlp.0", "linear1"),
                     ("mlp.3", "linear2")):
        for suffix in (("_weight", "_bias") if new.endswith("in_proj") else (".weight", ".bias")):
            r[new + suffix] = d[old + suffix]
    assert len(r) == len(d)
    return r


def build(spec):
    """The torch module of a spec, and the function that renames its tensors to frugal's keys."""
    name, c = spec["module"], spec.get("config", {})
    same = lambda d: collections.OrderedDict(d)  # noqa: E731
    if name in ("Sequential", "ModuleList"):
        layers = [build(s)[0] for s in spec["layers"]]
        return (nn.Sequential(*layers) if name == "Sequential" else nn.ModuleList(layers)), same
    if name == "BertLayer":  # Hugging Face's layer is nn.TransformerEncoderLayer, post-norm (BertConfig's names)
        return _tel(c["hidden_size"], c["num_attention_heads"], c["intermediate_size"], c["hidden_dropout_prob"],
                    c["attention_probs_dropout_prob"], False, c["layer_norm_eps"]), _bert_names
    if name == "EncoderBlock":  # torchvision's ViT block: pre-norm, LayerNorm eps 1e-6 (ViTConfig's names)
        return _tel(c["hidden_dim"], c["num_heads"], c["mlp_dim"], c["dropout"], c["attention_dropout"], True,
                    1e-6), _vit_names
    return SIMPLE[name](**c), same


# ---- the calls -------------------------------------------------------------------------------

def additive(mask):
    """A bool mask as -inf where true, 0 elsewhere; a float mask as it is (torch 2.x's _canonical_mask)."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=torch.float64).masked_fill(mask, -INF)
    return mask


def mha_call(m, xs, call):
    """nn.MultiheadAttention's forward as the case's call says (input indices, masks, flags)."""
    q, k, v = xs[call["query"]], xs[call["key"]], xs[call["value"]]
    kpm = xs[call["key_padding_mask"]] if call.get("key_padding_mask") is not None else None
    am = xs[call["attn_mask"]] if call.get("attn_mask") is not None else None
    mixed = kpm is not None and am is not None and kpm.dtype != torch.bool
    if mixed or call.get("is_causal"):  # torch 2.x semantics as one float (B*H, L, S) mask
        bf = m.batch_first
        B, L, S, H = q.shape[0 if bf else 1], q.shape[1 if bf else 0], k.shape[1 if bf else 0], m.num_heads
        total = torch.zeros((B * H, L, S), dtype=torch.float64)
        if am is not None:
            total = total + additive(am)
        if kpm is not None:
            total = total + additive(kpm).view(B, 1, 1, S).expand(B, H, 1, S).reshape(B * H, 1, S)
        if call.get("is_causal"):
            total = total + additive(torch.ones((L, S), dtype=torch.bool).triu(1))
        kpm, am = None, total
    out, w = m(q, k, v, key_padding_mask=kpm, need_weights=call.get("need_weights", False), attn_mask=am,
               average_attn_weights=call.get("average_attn_weights", True))
    return [out, w] if call.get("need_weights", False) else [out]


def forward(kind, m, xs, call):
    if kind == "unary":
        return [m(xs[0])]
    if kind == "chain":
        h = xs[0]
        for layer in m:
            h = layer(h)
        return [h]
    if kind == "mha":
        return mha_call(m, xs, call)
    if kind == "bert_layer":
        return [m(xs[0], src_key_padding_mask=xs[1] == 0)]
    raise ValueError(kind)


# ---- the generator ---------------------------------------------------------------------------

class Gen:
    def __init__(self, seed):
        self.rng = torch.Generator().manual_seed(seed)
        self.tensors, self.cases = {}, []
        self.counts = {}

    def vals(self, shape, lo=-2.0, hi=2.0, special=()):
        t = torch.rand(shape, generator=self.rng, dtype=torch.float64) * (hi - lo) + lo
        flat = t.view(-1)
        for i, v in enumerate(special[:flat.numel()]):  # kinks, ties: spread over the tensor
            flat[(i * 7919) % flat.numel()] = v
        return t.to(torch.float32)

    def ints(self, shape, lo, hi):
        return torch.randint(lo, hi, shape, generator=self.rng, dtype=torch.int64)

    # -- inputs in each layout (shape is the module's argument's shape) ---------------------------
    def C(self, shape, grad=None, **kw):
        return In(self.vals(shape, **kw), grad=grad)

    def T(self, shape, a=-2, b=-1, grad=None, **kw):
        """A transposed view: the base holds dims a and b swapped."""
        s = list(shape)
        s[a], s[b] = s[b], s[a]
        return In(self.vals(s, **kw), [("transpose", a, b)], grad, "transposed")

    def S(self, shape, dim=-1, grad=None, **kw):
        """Every other element, from offset 1, of a base 2n + 1 long along dim."""
        s = list(shape)
        n = s[dim]
        s[dim] = 2 * n + 1
        return In(self.vals(s, **kw), [("slice", dim, 1, 2 * n + 1, 2)], grad, "strided")

    def CL(self, shape, grad=None, **kw):
        """A channels-last (N, C, H, W) view: the base is (N, H, W, C)."""
        n, c, h, w = shape
        return In(self.vals((n, h, w, c), **kw), [("permute", 0, 3, 1, 2)], grad, "channels-last")

    def Sel(self, shape, grad=None, **kw):
        """A slice of a base one dim longer: base.select(1, 1) (an offset, and a gap in the strides)."""
        s = list(shape[:1]) + [3] + list(shape[1:])
        return In(self.vals(s, **kw), [("select", 1, 1)], grad, "selected")

    def I(self, base, view=(), layout="contiguous"):
        """An index or mask input (no gradient)."""
        return In(base, view, False, layout)

    # -- parameters and buffers ----------------------------------------------------------------
    def randomize(self, m):
        """Seeded values for every parameter and floating buffer: weights within +-1/sqrt(fan_in),
        1-D weights (norm scales) in [0.5, 1.5), biases and running means in [-0.5, 0.5), running
        variances in [0.5, 2)."""
        with torch.no_grad():
            for name, p in list(m.named_parameters()) + list(m.named_buffers()):
                if not p.is_floating_point():
                    continue
                leaf = name.rsplit(".", 1)[-1]
                if p.dim() >= 2:
                    b = 1.0 / max(1, p[0].numel()) ** 0.5
                    p.copy_(self.vals(tuple(p.shape), -b, b))
                elif leaf == "running_var":
                    p.copy_(self.vals(tuple(p.shape), 0.5, 2.0))
                elif leaf.endswith("weight"):
                    p.copy_(self.vals(tuple(p.shape), 0.5, 1.5))
                else:
                    p.copy_(self.vals(tuple(p.shape), -0.5, 0.5))

    # -- one case --------------------------------------------------------------------------------
    def case(self, family, spec, inputs, name="", kind="unary", call=None, train=False, repeat=1,
             dtype=torch.float32, prep=None, f32_bound=True):
        """One case (see the module docstring). prep edits the module's state before it is stored;
        f32_bound=False exempts a case whose exact answer torch's own float32 kernels miss."""
        call = dict(call or {})
        cid = "m%03d" % len(self.cases)
        m, rename = build(spec)
        self.randomize(m)
        if prep:
            with torch.no_grad():
                prep(m)
        state = rename(m.state_dict())
        params = list(rename(collections.OrderedDict(m.named_parameters())).keys())
        buffer_names = set(state) - set(params)
        for k, t in state.items():
            self.tensors["%s.state.%s" % (cid, k)] = t.detach().clone().contiguous()

        # The golden: the module in float64 from the stored float32 values.
        m64, bases, outs = run(m, inputs, kind, call, train, repeat, torch.float64, dtype)
        gouts = [self.vals(tuple(o.shape), -1.0, 1.0) for o in outs]
        torch.autograd.backward(outs, [g.to(torch.float64) for g in gouts])
        if dtype == torch.float32 and f32_bound:
            # The C++ float32 bound must leave room for float32 rounding: torch's own uses at most half of it.
            m32, bases32, outs32 = run(m, inputs, kind, call, train, repeat, torch.float32, dtype)
            torch.autograd.backward(outs32, gouts)
            pairs = list(zip(outs32, outs))
            pairs += [(b32.grad, b.grad) for b32, b in zip(bases32, bases) if b.grad is not None]
            pairs += [(p32.grad, p.grad) for p32, p in zip(m32.parameters(), m64.parameters()) if p.grad is not None]
            pairs += [(b32, b) for b32, b in zip(m32.buffers(), m64.buffers()) if b.is_floating_point()]
            worst = max(bound_ratio(got, want) for got, want in pairs)
            assert worst <= 0.5, "%s %s: torch in float32 uses %.2f of the C++ bound" % (cid, describe(spec), worst)

        meta_in = []
        for i, (x, b) in enumerate(zip(inputs, bases)):
            self.tensors["%s.in%d" % (cid, i)] = x.base
            meta_in.append({"view": x.view, "grad": bool(x.grad), "layout": x.layout})
            if x.grad:
                g = b.grad if b.grad is not None else torch.zeros_like(b)
                self.tensors["%s.grad.in%d" % (cid, i)] = g.detach().to(torch.float64)
        meta_out = []
        for k, (o, g) in enumerate(zip(outs, gouts)):
            assert torch.isfinite(o).all(), (cid, "a non-finite output: a fully masked attention row?")
            self.tensors["%s.out%d" % (cid, k)] = o.detach().to(torch.float64)
            self.tensors["%s.gout%d" % (cid, k)] = g
            meta_out.append({"shape": list(o.shape)})
        grads = rename(collections.OrderedDict(
            (n, p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in m64.named_parameters()))
        for n, g in grads.items():
            self.tensors["%s.grad.%s" % (cid, n)] = g.detach().to(torch.float64).contiguous()
        after = rename(m64.state_dict())
        for n in buffer_names:
            t = after[n].detach()
            self.tensors["%s.after.%s" % (cid, n)] = t.to(torch.float64) if t.is_floating_point() else t.clone()

        shapes = " ".join("x%d%s" % (i, list(x.shape())) + ("" if x.layout == "contiguous" else "/" + x.layout)
                          for i, x in enumerate(inputs))
        full = "%s %s%s%s%s" % (describe(spec), shapes, " train" if train else " eval",
                                " x%d" % repeat if repeat > 1 else "", (" [" + name + "]") if name else "")
        c = {"id": cid, "family": family, "module": spec["module"], "name": full, "spec": spec, "kind": kind,
             "call": call, "train": train, "repeat": repeat, "dtype": DTYPE_NAME[dtype],
             "state": [[k, list(t.shape), DTYPE_NAME[t.dtype]] for k, t in state.items()],
             "params": params, "buffers": [k for k in state if k in buffer_names],
             "inputs": meta_in, "outputs": meta_out}
        self.cases.append(c)
        self.counts[family] = self.counts.get(family, 0) + 1


def run(m, inputs, kind, call, train, repeat, compute, dtype):
    """A copy of m in `compute` called `repeat` times on the inputs (leaves in `compute`): the copy,
    the leaves and the last outputs."""
    mc = copy.deepcopy(m).to(compute)
    for sub in mc.modules():
        if isinstance(sub, RMSNorm):
            sub.eps_dtype = dtype
    mc.train(train)
    bases, xs = [], []
    for x in inputs:
        b = x.base.clone()
        if b.is_floating_point():
            b = b.to(compute)
        if x.grad:
            b.requires_grad_(True)
        bases.append(b)
        xs.append(apply_view(b, x.view))
    for _ in range(repeat):
        outs = forward(kind, mc, xs, call)
    return mc, bases, outs


# The C++ bound for float32 results (tol_for in tests/golden_replay/modules.cpp).
RTOL32, ATOL32 = 1e-5, 2e-6


def bound_ratio(got, want):
    """max |got - want| / (ATOL32 max(1, max |want|) + RTOL32 |want|), as the C++ measures it."""
    got, want = got.detach().double(), want.detach().double()
    if want.numel() == 0:
        return 0.0
    scale = max(1.0, want.abs().max().item())
    return ((got - want).abs() / (ATOL32 * scale + RTOL32 * want.abs())).max().item()


def describe(spec):
    if "layers" in spec:
        return "%s(%s)" % (spec["module"], ", ".join(describe(s) for s in spec["layers"]))
    c = spec.get("config", {})
    return "%s(%s)" % (spec["module"], ", ".join("%s=%s" % (k, json.dumps(v)) for k, v in c.items()))


def M(module, **config):
    return {"module": module, "config": config}


def Seq(*layers):
    return {"module": "Sequential", "layers": list(layers)}


# ---- the cases -------------------------------------------------------------------------------

def linear_cases(g):
    g.case("linear", M("Linear", in_features=5, out_features=4), [g.C((3, 5))])
    g.case("linear", M("Linear", in_features=5, out_features=4, bias=False), [g.T((2, 3, 5))])
    g.case("linear", M("Linear", in_features=6, out_features=3), [g.S((6,))], "unbatched")
    g.case("linear", M("Linear", in_features=4, out_features=2), [g.Sel((2, 3, 2, 4))], "4-D")
    g.case("linear", M("Linear", in_features=1, out_features=3), [g.C((4, 1))], "one input feature")
    g.case("linear", M("Linear", in_features=5, out_features=2), [g.C((0, 5))], "empty batch")
    g.case("linear", M("Linear", in_features=5, out_features=3), [g.T((2, 5))], dtype=torch.float64)


def conv_cases(g):
    g.case("conv", M("Conv2d", in_channels=3, out_channels=4, kernel_size=3), [g.C((2, 3, 6, 5))])
    g.case("conv", M("Conv2d", in_channels=3, out_channels=4, kernel_size=3, stride=2, padding=1, bias=False),
           [g.CL((2, 3, 7, 6))])
    g.case("conv", M("Conv2d", in_channels=2, out_channels=3, kernel_size=[3, 2], dilation=2, padding=[2, 1]),
           [g.T((1, 2, 7, 6))], "non-square kernel")
    g.case("conv", M("Conv2d", in_channels=4, out_channels=6, kernel_size=3, groups=2, padding=1),
           [g.C((2, 4, 5, 5))])
    g.case("conv", M("Conv2d", in_channels=3, out_channels=6, kernel_size=3, groups=3, stride=[2, 1]),
           [g.S((1, 3, 6, 5))], "depthwise, channel multiplier 2")
    g.case("conv", M("Conv2d", in_channels=3, out_channels=2, kernel_size=2, padding=[0, 1]),
           [g.T((3, 5, 4))], "unbatched")
    g.case("conv", M("Conv2d", in_channels=2, out_channels=3, kernel_size=1, stride=3),
           [g.C((2, 2, 7, 7))], "1x1, stride > kernel")
    g.case("conv", M("Conv2d", in_channels=2, out_channels=2, kernel_size=3, padding=2, dilation=[1, 2], groups=2),
           [g.C((1, 2, 4, 5))], "padding > kernel / 2")
    g.case("conv", M("Conv2d", in_channels=3, out_channels=4, kernel_size=3, padding=1, stride=2),
           [g.CL((2, 3, 5, 5))], dtype=torch.float64)


def pool_cases(g):
    g.case("pool", M("MaxPool2d", kernel_size=3, stride=2, padding=1), [g.C((2, 3, 7, 6))])
    g.case("pool", M("MaxPool2d", kernel_size=2), [g.T((1, 2, 5, 6))], "stride defaults to kernel")
    g.case("pool", M("MaxPool2d", kernel_size=[3, 2], stride=[2, 1], dilation=2, ceil_mode=True),
           [g.S((1, 2, 8, 7))])
    ties = In(torch.randint(-2, 3, (1, 2, 6, 6), generator=g.rng).to(torch.float32) * 0.5)
    g.case("pool", M("MaxPool2d", kernel_size=3, stride=1, padding=1), [ties], "ties: the first maximum")
    g.case("pool", M("MaxPool2d", kernel_size=2, stride=2), [g.CL((2, 3, 4, 4))], dtype=torch.float64)
    g.case("pool", M("AvgPool2d", kernel_size=3, stride=2, padding=1, count_include_pad=False), [g.C((2, 2, 7, 6))])
    g.case("pool", M("AvgPool2d", kernel_size=3, stride=2, padding=1, ceil_mode=True), [g.T((1, 3, 6, 6))])
    g.case("pool", M("AvgPool2d", kernel_size=[2, 3]), [g.CL((2, 2, 5, 7))], "stride defaults to kernel")
    g.case("pool", M("AvgPool2d", kernel_size=2, stride=1), [g.Sel((2, 3, 3))], "unbatched")
    g.case("pool", M("AdaptiveAvgPool2d", output_size=[3, 2]), [g.C((2, 3, 7, 5))], "windows overlap")
    g.case("pool", M("AdaptiveAvgPool2d", output_size=1), [g.CL((2, 4, 3, 5))], "global")
    g.case("pool", M("AdaptiveAvgPool2d", output_size=[4, 4]), [g.T((1, 2, 3, 3))], "larger than the input")
    g.case("pool", M("AdaptiveAvgPool2d", output_size=2), [g.S((3, 5, 4))], "unbatched")


def norm_cases(g):
    bn = lambda c, **kw: M("BatchNorm2d", num_features=c, **kw)  # noqa: E731

    def tracked(n):
        def prep(m):
            m.num_batches_tracked.fill_(n)
        return prep

    g.case("batchnorm", bn(3), [g.C((4, 3, 2, 3))], train=True)
    g.case("batchnorm", bn(3, momentum=0.3, eps=1e-3), [g.CL((2, 3, 3, 4))], train=True)
    g.case("batchnorm", bn(2, momentum=None), [g.C((3, 2, 2, 2))], "cumulative average from 3 batches", train=True,
           prep=tracked(3))
    g.case("batchnorm", bn(2, momentum=None), [g.T((2, 2, 3, 3))], "cumulative average from 0", train=True,
           repeat=3)
    g.case("batchnorm", bn(3), [g.C((2, 3, 2, 2))], "momentum 0.1, twice", train=True, repeat=2, prep=tracked(5))
    g.case("batchnorm", bn(3), [g.C((2, 3, 3, 2))], "running statistics", prep=tracked(7))
    g.case("batchnorm", bn(3, affine=False), [g.S((2, 3, 2, 3))], "no affine", train=True)
    g.case("batchnorm", bn(3, affine=False), [g.C((2, 3, 2, 3))], "no affine")
    g.case("batchnorm", bn(2, track_running_stats=False), [g.C((3, 2, 2, 2))], "no running statistics",
           train=True)
    g.case("batchnorm", bn(2, track_running_stats=False), [g.T((3, 2, 2, 3))], "batch statistics in eval")
    g.case("batchnorm", bn(3, momentum=0.2), [g.C((1, 3, 1, 4))], "one sample", train=True)
    g.case("batchnorm", bn(2, momentum=0.0), [g.C((2, 2, 2, 2))], "momentum 0: statistics kept", train=True)
    g.case("batchnorm", bn(2, momentum=1.0), [g.C((2, 2, 2, 2))], "momentum 1: the batch's", train=True)
    flat = g.vals((2, 2, 2, 2))
    flat[:, 0] = 0.75  # 8 values per channel: their mean is exact in any order, their variance 0
    g.case("batchnorm", bn(2), [In(flat)], "a constant channel", train=True)
    g.case("batchnorm", bn(2, affine=False, track_running_stats=False), [g.C((2, 2, 3, 2))], "no state", train=True)
    g.case("batchnorm", bn(3), [g.CL((2, 3, 2, 3))], train=True, dtype=torch.float64)
    g.case("batchnorm", bn(3), [g.C((2, 3, 2, 3))], dtype=torch.float64)

    g.case("layernorm", M("LayerNorm", normalized_shape=5), [g.C((2, 3, 5))])
    g.case("layernorm", M("LayerNorm", normalized_shape=[3, 4], elementwise_affine=False), [g.T((2, 3, 4))])
    g.case("layernorm", M("LayerNorm", normalized_shape=6, eps=1e-3), [g.S((4, 6))])
    g.case("layernorm", M("LayerNorm", normalized_shape=[2, 3]), [g.Sel((2, 2, 3))], train=True)
    g.case("layernorm", M("LayerNorm", normalized_shape=4), [g.C((3, 4))], dtype=torch.float64)
    g.case("layernorm", M("LayerNorm", normalized_shape=1), [g.C((3, 1))], "one element: the bias",
           f32_bound=False)  # exact answers (y = bias, no x gradient) that torch's float32 kernel misses

    g.case("groupnorm", M("GroupNorm", num_groups=2, num_channels=4), [g.C((2, 4, 3, 3))])
    g.case("groupnorm", M("GroupNorm", num_groups=3, num_channels=6, eps=1e-3, affine=False), [g.T((2, 6, 5), 1, 2)],
           "(N, C, L)")
    g.case("groupnorm", M("GroupNorm", num_groups=1, num_channels=3), [g.CL((2, 3, 2, 3))], "one group", train=True)
    g.case("groupnorm", M("GroupNorm", num_groups=4, num_channels=4), [g.C((2, 4, 2, 2))], "a group per channel")
    g.case("groupnorm", M("GroupNorm", num_groups=2, num_channels=6), [g.C((1, 6, 2, 2))], dtype=torch.float64)
    g.case("groupnorm", M("GroupNorm", num_groups=2, num_channels=8), [g.T((3, 8))], "(N, C)")

    g.case("rmsnorm", M("RMSNorm", normalized_shape=5), [g.C((2, 3, 5))], "eps=None")
    g.case("rmsnorm", M("RMSNorm", normalized_shape=[3, 4], eps=1e-5), [g.T((2, 3, 4))])
    g.case("rmsnorm", M("RMSNorm", normalized_shape=6, elementwise_affine=False), [g.S((4, 6))])
    g.case("rmsnorm", M("RMSNorm", normalized_shape=4, eps=0.5), [g.C((3, 4), lo=-0.2, hi=0.2)], "eps dominates")
    g.case("rmsnorm", M("RMSNorm", normalized_shape=4), [g.C((3, 4), lo=-1e-3, hi=1e-3)], "eps=None, small x",
           dtype=torch.float64)


def embedding_cases(g):
    E = lambda n, d, **kw: M("Embedding", num_embeddings=n, embedding_dim=d, **kw)  # noqa: E731
    g.case("embedding", E(7, 4), [g.I(torch.tensor([[0, 3, 3, 6, 1], [2, 3, 5, 0, 0]]))], "repeated indices")
    g.case("embedding", E(7, 4, padding_idx=2), [g.I(torch.tensor([[2, 3, 2], [2, 6, 0]]))],
           "padding row: its value, no gradient")
    g.case("embedding", E(6, 3, padding_idx=-1), [g.I(torch.tensor([5, 1, 5, 4]))], "padding_idx=-1")
    g.case("embedding", E(5, 3), [g.I(torch.tensor([[1, 4, 4], [0, 2, 1]]), [("transpose", 0, 1)], "transposed")],
           "transposed indices")
    g.case("embedding", E(5, 2), [g.I(torch.tensor(3))], "0-d index")
    g.case("embedding", E(6, 3, padding_idx=0), [g.I(torch.tensor([[0, 1], [5, 0]]))], dtype=torch.float64)
    g.case("embedding", E(5, 3, padding_idx=4), [g.I(torch.tensor([[4, 1, 1], [0, 4, 2]], dtype=torch.int32))],
           "int32 indices")


def activation_cases(g):
    kinks = (0.0, -1.0, 1.0, 3.0, -3.0, 6.0, 2.5, -2.0)
    for spec in [M("ReLU"), M("GELU"), M("GELU", approximate="tanh"), M("Tanh"), M("SiLU"), M("Sigmoid"),
                 M("LeakyReLU", negative_slope=0.2), M("ELU", alpha=0.5), M("Hardtanh", min_val=-2.0, max_val=1.5),
                 M("ReLU6"), M("Hardsigmoid"), M("Hardswish"), M("Mish")]:
        g.case("activation", spec, [g.T((3, 7), lo=-7, hi=7)])
    g.case("activation", M("LeakyReLU", negative_slope=0.2), [g.C((2, 4), special=kinks)], "kinks",
           dtype=torch.float64)
    for spec in [M("GELU", approximate="tanh"), M("GELU"), M("SiLU"), M("ELU"), M("Hardswish"), M("Mish")]:
        g.case("activation", spec, [g.S((2, 5), lo=-7, hi=7)], dtype=torch.float64)
    g.case("activation", M("Flatten"), [g.T((2, 3, 2, 2))])
    g.case("activation", M("Flatten", start_dim=0, end_dim=1), [g.Sel((2, 3, 2))])
    g.case("activation", M("Flatten", start_dim=-2), [g.C((2, 2, 3, 2))])
    g.case("activation", M("Dropout", p=0.5), [g.C((3, 4))], "eval: identity")
    g.case("activation", M("Dropout", p=0.0), [g.S((3, 4))], "p=0: identity", train=True)
    g.case("activation", M("Dropout", p=1.0), [g.C((3, 4))], "p=1: zeros", train=True)


def attention_cases(g):
    def A(num_heads=2, **kw):
        return M("MultiheadAttention", embed_dim=8, num_heads=num_heads, **kw)

    B, L, S, E = 2, 3, 4, 8
    # bool masks that leave every query a key
    pad = torch.tensor([[False, False, True, False], [False, True, True, False]])
    am = torch.tensor([[False, True, False, False], [True, False, False, False], [False, False, True, False]])

    def call(q=0, k=None, v=None, **kw):
        k = q if k is None else k
        v = k if v is None else v
        return dict(query=q, key=k, value=v, **kw)

    mha = lambda spec, inputs, c, name="", **kw: g.case("attention", spec, inputs, name, "mha", c, **kw)  # noqa: E731
    mha(A(batch_first=True), [g.C((B, L, E))], call(), "self-attention")
    mha(A(batch_first=False), [g.C((L, B, E))], call(need_weights=True), "self-attention, (L, B, E), weights")
    mha(A(batch_first=True), [g.C((B, L, E)), g.C((B, S, E)), g.I(pad)],
        call(0, 1, key_padding_mask=2, need_weights=True, average_attn_weights=False),
        "key is value, bool key_padding_mask, per-head weights")
    mha(A(batch_first=False), [g.C((L, B, E)), g.C((S, B, E)), g.C((S, B, E)), g.I(am), g.I(pad)],
        call(0, 1, 2, attn_mask=3, key_padding_mask=4, need_weights=True),
        "separate q, k, v, bool attn_mask and key_padding_mask")
    mha(A(batch_first=True), [g.C((B, L, E)), g.C((B, S, E)), In(g.vals((L, S), -2, 0, special=(-INF,)))],
        call(0, 1, attn_mask=2, need_weights=True), "float attn_mask (L, S) with -inf, its gradient")
    mha(A(batch_first=True), [g.C((B, L, E)), g.C((B, S, E)), In(g.vals((B * 2, L, S), -2, 1))],
        call(0, 1, attn_mask=2), "float attn_mask (B*H, L, S)")
    mha(A(batch_first=True), [g.C((B, S, E)), In(g.vals((B, S), -2, 1))],
        call(0, key_padding_mask=1, need_weights=True), "float key_padding_mask")
    mha(A(batch_first=False), [g.C((L, B, E)), g.C((S, B, E)), In(g.vals((L, S), -1, 1)), g.I(pad)],
        call(0, 1, attn_mask=2, key_padding_mask=3), "float attn_mask, bool key_padding_mask")
    mha(A(batch_first=True), [g.C((B, L, E)), g.C((B, S, E)), g.I(am), In(g.vals((B, S), -1, 1))],
        call(0, 1, attn_mask=2, key_padding_mask=3, need_weights=True),
        "bool attn_mask, float key_padding_mask: added (torch 2.x)")
    mha(A(batch_first=True, kdim=5, vdim=6), [g.C((B, L, E)), g.C((B, S, 5)), g.C((B, S, 6)), g.I(pad)],
        call(0, 1, 2, key_padding_mask=3, need_weights=True), "kdim, vdim")
    mha(A(batch_first=True, bias=False), [g.C((B, L, E))], call(need_weights=True), "no bias")
    mha(A(batch_first=True, num_heads=4), [g.C((L, E)), g.C((S, E)), g.I(pad[1])],
        call(0, 1, key_padding_mask=2, need_weights=True, average_attn_weights=False), "unbatched")
    mha(A(batch_first=True, dropout=0.5), [g.C((B, L, E))], call(need_weights=True), "eval: no dropout")
    mha(A(batch_first=True), [g.C((B, S, E))], call(is_causal=True), "is_causal (golden: a causal mask)")
    mha(A(batch_first=False), [g.C((S, B, E)), g.I(pad)], call(key_padding_mask=1, is_causal=True, need_weights=True),
        "is_causal and key_padding_mask")
    mha(A(batch_first=True), [g.T((B, L, E)), g.S((B, S, E)), g.Sel((B, S, E))], call(0, 1, 2, need_weights=True),
        "non-contiguous q, k, v")
    mha(A(batch_first=True), [g.C((B, L, E))], call(need_weights=True), "train, dropout 0", train=True)
    mha(A(batch_first=True, dropout=1.0), [g.C((B, L, E))], call(), "train, dropout 1: out_proj.bias", train=True)
    mha(A(batch_first=False, dropout=1.0), [g.C((L, B, E)), g.C((S, B, E))], call(0, 1, need_weights=True),
        "train, dropout 1: zero weights", train=True)
    mha(A(batch_first=False), [g.C((L, B, E)), g.C((S, B, E)), g.I(am.repeat(B * 2, 1, 1) & ~am[0])],
        call(0, 1, attn_mask=2, need_weights=True, average_attn_weights=False), "bool attn_mask (B*H, L, S)")
    mha(A(batch_first=True), [g.C((B, L, E)), g.C((B, S, E)), In(g.vals((B * 2, L, S), -1, 1)),
                              In(g.vals((B, S), -1, 1))],
        call(0, 1, attn_mask=2, key_padding_mask=3), "float attn_mask (B*H, L, S) + float key_padding_mask")
    mha(A(batch_first=False, kdim=5, vdim=5, bias=False), [g.C((L, B, E)), g.C((S, B, 5))],
        call(0, 1, need_weights=True), "kdim = vdim, key is value, no bias")
    mha(A(batch_first=True, kdim=8, vdim=8), [g.C((B, L, E)), g.C((B, L, E))], call(0, 0, 1),
        "kdim = vdim = embed_dim: in_proj_weight; query is key, value differs")
    mha(A(batch_first=False), [g.C((L, E)), g.C((S, E)), g.I(am)], call(0, 1, attn_mask=2, need_weights=True),
        "unbatched, (L, E) whatever batch_first")
    mha(A(batch_first=True), [g.C((B, L, E)), g.C((B, S, E))], call(0, 1, is_causal=True, need_weights=True),
        "is_causal, L < S: key s <= query l")
    # the fused path (no weights) with bool masks, and is_causal with a mask
    mha(A(batch_first=False), [g.C((L, B, E)), g.C((S, B, E)), g.C((S, B, E)), g.I(am), g.I(pad)],
        call(0, 1, 2, attn_mask=3, key_padding_mask=4), "bool attn_mask and key_padding_mask, no weights")
    mha(A(batch_first=True), [g.C((B, S, E)), g.I(pad)], call(key_padding_mask=1, is_causal=True),
        "is_causal and key_padding_mask, no weights")
    mha(A(batch_first=True), [g.C((L, E)), g.I(am[:, :L].clone())], call(attn_mask=1),
        "unbatched self-attention, no weights")
    mha(A(batch_first=False), [g.C((L, B, E)), g.C((S, B, E)), g.I(am), g.I(pad)],
        call(0, 1, attn_mask=2, key_padding_mask=3, need_weights=True), dtype=torch.float64)


def container_cases(g):
    mlp = Seq(M("Linear", in_features=4, out_features=6), M("ReLU"), M("Dropout", p=0.5),
              M("Linear", in_features=6, out_features=3))
    g.case("container", mlp, [g.C((3, 4))], "keys 0.*, 3.*")
    convnet = Seq(Seq(M("Conv2d", in_channels=3, out_channels=4, kernel_size=3, padding=1, bias=False),
                      M("BatchNorm2d", num_features=4), M("ReLU")),
                  M("MaxPool2d", kernel_size=2), M("Flatten"), M("Linear", in_features=16, out_features=3))
    g.case("container", convnet, [g.C((2, 3, 4, 4))], "nested: keys 0.1.running_mean", train=True)
    g.case("container", convnet, [g.CL((2, 3, 4, 4))], "nested")
    chain = {"module": "ModuleList", "layers": [M("Linear", in_features=4, out_features=5),
                                                M("Linear", in_features=5, out_features=2, bias=False)]}
    g.case("container", chain, [g.T((3, 4))], "applied in order", kind="chain")


def model_cases(g):
    bert = M("BertLayer", hidden_size=8, num_attention_heads=2, intermediate_size=16, layer_norm_eps=1e-12,
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    g.case("model", bert, [g.C((2, 5, 8)), g.I(mask)], "vs nn.TransformerEncoderLayer, post-norm",
           kind="bert_layer")
    g.case("model", dict(bert, config=dict(bert["config"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
           [g.T((2, 4, 8), 0, 1), g.I(torch.ones((2, 4), dtype=torch.int64))], "no padding", kind="bert_layer",
           train=True)
    g.case("model", bert, [g.C((2, 5, 8)), g.I(mask)], kind="bert_layer", dtype=torch.float64)
    vit = M("EncoderBlock", hidden_dim=8, num_heads=2, mlp_dim=16, dropout=0.1, attention_dropout=0.1)
    g.case("model", vit, [g.C((2, 5, 8))], "vs nn.TransformerEncoderLayer, norm_first")
    g.case("model", dict(vit, config=dict(vit["config"], dropout=0.0, attention_dropout=0.0)), [g.S((2, 3, 8))],
           train=True)
    g.case("model", vit, [g.C((1, 4, 8))], dtype=torch.float64)

    # torchvision's ResNet blocks; "frugal" picks frugal's fused paths (same keys, same numbers)
    def block(kind, inplanes, planes, stride, fusion="none"):
        return {"module": kind, "config": {"inplanes": inplanes, "planes": planes, "stride": stride},
                "frugal": {"fusion": fusion}}

    g.case("model", block("BasicBlock", 4, 8, 2), [g.C((2, 4, 6, 6))], "downsample", train=True)
    g.case("model", block("BasicBlock", 4, 4, 1, "bn_relu"), [g.CL((2, 4, 5, 5))], "identity shortcut, fused bn+relu",
           train=True)
    g.case("model", block("BasicBlock", 4, 8, 2, "conv_bn"), [g.C((2, 4, 6, 6))], "downsample, fused conv+bn",
           train=True)
    g.case("model", block("BasicBlock", 4, 8, 2, "conv_bn"), [g.T((2, 4, 6, 6))], "fused conv+bn")
    g.case("model", block("Bottleneck", 8, 2, 1), [g.C((2, 8, 5, 5))], "identity shortcut", train=True)
    g.case("model", block("Bottleneck", 4, 2, 2, "bn_relu"), [g.C((2, 4, 6, 6))], "downsample, fused bn+relu",
           train=True)
    g.case("model", block("Bottleneck", 4, 2, 2, "conv_bn"), [g.CL((2, 4, 6, 6))], "downsample, fused conv+bn",
           train=True)
    g.case("model", block("Bottleneck", 8, 2, 1, "conv_bn"), [g.C((2, 8, 4, 4))], "fused conv+bn")
    g.case("model", block("Bottleneck", 4, 2, 2), [g.C((2, 4, 4, 4))], "downsample")


def check_peers():
    """The renamings above, checked: torchvision's and Hugging Face's layers written out in torch
    give what nn.TransformerEncoderLayer gives under the renamed tensors."""
    torch.manual_seed(1)
    E, H, F_ = 8, 2, 16
    x = torch.randn(2, 5, E, dtype=torch.float64)
    am = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    for norm_first, names in ((False, _bert_names), (True, _vit_names)):
        tel = nn.TransformerEncoderLayer(E, H, F_, 0.0, "gelu", 1e-6, True, norm_first).double().eval()
        with torch.no_grad():
            for p in tel.parameters():
                p.normal_()
        d = names(tel.state_dict())
        lin = lambda h, n: h @ d[n + ".weight"].T + d[n + ".bias"]  # noqa: E731
        ln = lambda h, n: nn.functional.layer_norm(h, (E,), d[n + ".weight"], d[n + ".bias"], 1e-6)  # noqa: E731

        def attention(h, q, k, v, o, mask):
            heads = lambda t: t.view(2, 5, H, E // H).transpose(1, 2)  # noqa: E731
            s = heads(q(h)) @ heads(k(h)).transpose(-1, -2) / (E // H) ** 0.5 + mask
            return o((s.softmax(-1) @ heads(v(h))).transpose(1, 2).reshape(2, 5, E))

        if not norm_first:  # Hugging Face BertLayer: additive finfo.min mask
            mask = ((1 - am).double() * torch.finfo(torch.float64).min).view(2, 1, 1, 5)
            a = ln(attention(x, *(lambda h, n=n: lin(h, "attention.self." + n) for n in ("query", "key", "value")),
                             lambda h: lin(h, "attention.output.dense"), mask) + x, "attention.output.LayerNorm")
            want = ln(lin(nn.functional.gelu(lin(a, "intermediate.dense")), "output.dense") + a, "output.LayerNorm")
            got = tel(x, src_key_padding_mask=am == 0)
        else:  # torchvision EncoderBlock
            w, b = d["self_attention.in_proj_weight"], d["self_attention.in_proj_bias"]
            proj = [lambda h, i=i: h @ w.chunk(3)[i].T + b.chunk(3)[i] for i in range(3)]
            h = ln(x, "ln_1")
            y = attention(h, *proj, lambda t: lin(t, "self_attention.out_proj"), 0.0) + x
            want = y + lin(nn.functional.gelu(lin(ln(y, "ln_2"), "mlp.0")), "mlp.3")
            got = tel(x)
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), (norm_first, (got - want).abs().max())


def build_all(seed=SEED):
    g = Gen(seed)
    for f in (linear_cases, conv_cases, pool_cases, norm_cases, embedding_cases, activation_cases, attention_cases,
              container_cases, model_cases):
        f(g)
    return g


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "golden", "modules_torch.safetensors"))
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.use_deterministic_algorithms(True)
    check_peers()
    torch.manual_seed(SEED)  # the modules' own initialization, overwritten by Gen.randomize
    g = build_all()
    meta = {"cases": json.dumps(g.cases, separators=(",", ":"), allow_nan=False),
            "generator": "tools/torch_golden_modules.py", "torch": torch.__version__, "seed": str(SEED),
            "count": str(len(g.cases))}
    save_safetensors(os.path.normpath(args.out), g.tensors, meta)
    size = os.path.getsize(args.out)
    print("%d cases, %d tensors, %d bytes -> %s" % (len(g.cases), len(g.tensors), size, os.path.normpath(args.out)))
    for fam, n in g.counts.items():
        print("  %-10s %d" % (fam, n))
    if size > 1_500_000:
        sys.exit("the golden file is over 1.5 MB: shrink the cases")


if __name__ == "__main__":
    main()
