#!/usr/bin/env python3
"""PyTorch goldens for frugal's ops, on the inputs users pass: views, broadcasts, odd sizes.

Writes tests/golden/ops_torch.safetensors, which tests/golden_replay/ops.cpp replays (on the CPU and on CUDA). The
existing op tests compare frugal with float64 loops written by frugal's authors; these goldens
come from PyTorch itself, so a misreading of PyTorch's contract (a gradient at a kink, a
reduction's divisor, a broadcast rule, a default) shows up as a failure.

Each case stores, under keys "<id>.<what>":
  in<i>    the stored base of input i (float32, float16, bfloat16, int64 or bool). The case's
           metadata names the views to apply to it (transpose, permute, strided slice, expand,
           unsqueeze, select), so the op sees a genuinely non-contiguous tensor; the gradient
           compared is the base's, so the views' backward is checked too.
  gout<k>  the upstream gradient of differentiable output k, in that output's dtype.
  out<k>   output k computed by PyTorch in float64 from the stored (already rounded) inputs:
           the exact answer (int64 for indices).
  grad<i>  d(sum_k out_k * gout_k) / d(base of input i), float64.
The case list is JSON in the file's __metadata__ ("cases"): per case its family, op, args (the
op's keyword arguments, under the names the C++ reads), the inputs' views, which inputs require
a gradient, and each output's shape, dtype (as PyTorch computes it in the stored dtypes; where
1.13 has no 16-bit CPU kernel, as it does in bfloat16 or float32) and whether it is
differentiable.

PyTorch 1.13 lacks rms_norm and scaled_dot_product_attention; their goldens are torch 2.x's
formulas: rms_norm x * rsqrt(mean(x^2) + eps) * w, with eps defaulting to the machine epsilon of
float32 (the opmath type of float32 and 16-bit inputs); attention as its documentation writes it
out (_sdpa). frugal's fused and functional ops (attention, masked_softmax, gelu_mlp,
linear_cross_entropy, batch_norm_relu, batch_norm_add_relu) answer to PyTorch's composition of the
unfused ops. The in-place ops write a clone of a view (v = x.clone(); v.add_(other)).

Left out: dropout (not comparable across frameworks); the inputs where frugal documents
a deliberate deviation (kl_div's target gradient at t = 0, an all -inf logsumexp slice,
binary_cross_entropy's target gradient at x = 0 or 1, hardtanh min > max, an integral C++ double
scalar counting as an integer); and the inputs where PyTorch 1.13 is not self-consistent or
fails: the gradients of elu, hardtanh, relu6 and hardswish at NaN (they depend on the kernel
path), abs's at NaN (sign(NaN) = 0, pytorch/pytorch#41245), var's with N - correction = 0 on a
0-d input, and scatter_add with a src larger than its index (1.13's backward cannot take it).
Also left out: an in-place write through a view of a tensor with a history
(y = base.clone(); y.t().add_(other)), which frugal refuses (it has no CopySlices:
Note [In-place ops and autograd] in autograd/ops/inplace.h); attention rows whose every key is
masked out (frugal documents zero weights there, the documented formula NaN; masked_softmax's own
cases do check its zeros, which torch 2.5's _safe_softmax also gives); float-to-integer
conversions of NaN, +-inf and values past the integer type's range (undefined behaviour in
PyTorch; frugal saturates: Note [Float to integer conversion] in tensor/ops/copy_math.h); and
conversions to uint8 (storage only in frugal: a cast into it is refused).
A deliberate difference kept in the cases: a float16/bfloat16 linear_cross_entropy returns its
loss in float32 (the fused loss keeps its float32 sum; the unfused pair rounds it to 16 bits), so
its golden upcasts the 16-bit logits before cross_entropy.

Regenerate (a dev-time tool: Debian's PyTorch, CPU only; never a dependency of frugal or CI):

    apt-get install -y python3-torch
    /usr/bin/python3 tools/torch_golden_ops.py          # writes tests/golden/ops_torch.safetensors
    /usr/bin/python3 tools/torch_golden_ops.py --out /tmp/ops.safetensors

The output is deterministic (seeded); the file stays under 2 MB.
"""
import argparse
import json
import math
import os
import sys
import warnings

import torch
import torch.nn.functional as F

from golden_safetensors import DTYPE_NAME, apply_view, save_safetensors

SEED = 20240613


class In:
    """One input: a stored base and the views that make the op's argument from it."""

    def __init__(self, base, view=(), grad=None, layout="contiguous"):
        self.base, self.view, self.layout = base, [list(s) for s in view], layout
        self.grad = base.is_floating_point() if grad is None else grad

    def shape(self):
        return tuple(apply_view(self.base, self.view).shape)


class Gen:
    def __init__(self, seed):
        self.rng = torch.Generator().manual_seed(seed)
        self.tensors, self.cases = {}, []
        self.counts = {}

    # -- values --------------------------------------------------------------------------------
    def vals(self, shape, lo=-2.0, hi=2.0, dtype=torch.float32, special=()):
        t = torch.rand(shape, generator=self.rng, dtype=torch.float64) * (hi - lo) + lo
        flat = t.view(-1)
        for i, v in enumerate(special[:flat.numel()]):  # kinks, ties: spread over the tensor
            flat[(i * 7919) % flat.numel()] = v
        return t.to(dtype)

    def ints(self, shape, lo, hi):
        return torch.randint(lo, hi, shape, generator=self.rng, dtype=torch.int64)

    # -- inputs in each layout (shape is the op's argument's shape) -------------------------------
    def C(self, shape, **kw):
        g = kw.pop("grad", None)
        return In(self.vals(shape, **kw), grad=g)

    def T(self, shape, a=-2, b=-1, **kw):
        """A transposed view: the base holds dims a and b swapped."""
        g = kw.pop("grad", None)
        s = list(shape)
        s[a], s[b] = s[b], s[a]
        return In(self.vals(s, **kw), [("transpose", a, b)], g, "transposed")

    def S(self, shape, dim=-1, **kw):
        """Every other element, from offset 1, of a base 2n + 1 long along dim."""
        g = kw.pop("grad", None)
        s = list(shape)
        n = s[dim]
        s[dim] = 2 * n + 1
        return In(self.vals(s, **kw), [("slice", dim, 1, 2 * n + 1, 2)], g, "strided")

    def P(self, shape, perm, **kw):
        """A permuted view: base.permute(perm) has `shape`."""
        g = kw.pop("grad", None)
        s = [0] * len(shape)
        for i, p in enumerate(perm):
            s[p] = shape[i]
        return In(self.vals(s, **kw), [("permute",) + tuple(perm)], g, "permuted")

    def E(self, shape, src, **kw):
        """An expanded (broadcast, stride-0) view of a base of shape src."""
        g = kw.pop("grad", None)
        return In(self.vals(src, **kw), [("expand",) + tuple(shape)], g, "expanded")

    def Sel(self, shape, **kw):
        """A slice of a base one dim longer: base.select(1, 1) (an offset, and a gap in the strides)."""
        g = kw.pop("grad", None)
        s = list(shape[:1]) + [3] + list(shape[1:]) if len(shape) else [3]
        return In(self.vals(s, **kw), [("select", 1 if len(shape) else 0, 1)], g, "selected")

    def L(self, layout, shape, **kw):
        """The input of `shape` in a named layout (for loops over layouts)."""
        if layout == "contiguous" or len(shape) == 0:
            return self.C(shape, **kw)
        if layout == "transposed":
            return self.T(shape, **kw) if len(shape) >= 2 else self.S(shape, **kw)
        if layout == "strided":
            return self.S(shape, **kw)
        if layout == "permuted":
            perm = list(reversed(range(len(shape))))
            return self.P(shape, perm, **kw)
        if layout == "expanded":
            src = [1 if i % 2 == 0 else n for i, n in enumerate(shape)]
            return self.E(shape, src, **kw)
        if layout == "selected":
            return self.Sel(shape, **kw)
        raise ValueError(layout)

    def I(self, base, view=(), layout="contiguous"):
        """An index/target/mask input (no gradient)."""
        return In(base, view, False, layout)

    # -- one case --------------------------------------------------------------------------------
    def case(self, family, op, inputs, args=None, name="", tol=None, diff=None):
        args = dict(args or {})
        fn = OPS[op]
        cid = "c%04d" % len(self.cases)

        # Output dtypes as PyTorch gives them in the stored dtypes. Where 1.13 has no float16 CPU
        # kernel, the same call in bfloat16 says which outputs take the 16-bit dtype; where it has
        # neither, the call in float32 does (a float32 output of 16-bit inputs is taken as theirs).
        def run(to, grad):
            bases, xs = [], []
            for x in inputs:
                if x is None:
                    bases.append(None)
                    xs.append(None)
                    continue
                b = x.base.clone()
                if b.dtype in to:
                    b = b.to(to[b.dtype])
                if grad and x.grad:
                    b.requires_grad_(True)
                bases.append(b)
                xs.append(apply_view(b, x.view))
            out = fn(*xs, **args)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            return bases, outs

        with torch.no_grad():
            try:
                _, native = run({}, False)
                out_dtypes = [o.dtype for o in native]
            except RuntimeError:
                try:
                    _, probe = run({torch.float16: torch.bfloat16}, False)
                    out_dtypes = [torch.float16 if o.dtype == torch.bfloat16 else o.dtype for o in probe]
                except RuntimeError:
                    low = {x.base.dtype for x in inputs if x is not None and x.base.is_floating_point()}
                    assert len(low) == 1 and low <= {torch.float16, torch.bfloat16}, (op, low)
                    _, probe = run({low_dt: torch.float32 for low_dt in low}, False)
                    out_dtypes = [low.copy().pop() if o.dtype == torch.float32 else o.dtype for o in probe]

        bases, outs = run({dt: torch.float64 for dt in (torch.float32, torch.float16, torch.bfloat16)}, True)
        if diff is None:
            diff = [o.is_floating_point() and o.requires_grad for o in outs]
        gouts = []
        for k, (o, d) in enumerate(zip(outs, diff)):
            if d:
                g = self.vals(tuple(o.shape), -1.0, 1.0, out_dtypes[k])
                self.tensors["%s.gout%d" % (cid, k)] = g
                gouts.append((o, g.to(torch.float64)))
        if gouts:
            torch.autograd.backward([o for o, _ in gouts], [g for _, g in gouts])
        meta_in = []
        for i, (x, b) in enumerate(zip(inputs, bases)):
            if x is None:
                meta_in.append({"none": True})
                continue
            self.tensors["%s.in%d" % (cid, i)] = x.base
            m = {"view": x.view, "grad": bool(x.grad), "layout": x.layout}
            if x.grad:
                g = b.grad if b.grad is not None else torch.zeros_like(b)
                self.tensors["%s.grad%d" % (cid, i)] = g.detach().to(torch.float64)
            meta_in.append(m)
        meta_out = []
        for k, o in enumerate(outs):
            o = o.detach()
            self.tensors["%s.out%d" % (cid, k)] = o.to(torch.float64) if o.is_floating_point() else o.to(torch.int64)
            meta_out.append({"shape": list(o.shape), "dtype": DTYPE_NAME[out_dtypes[k]], "diff": bool(diff[k])})
        plain = (torch.float32, torch.int64, torch.bool)
        shapes = " ".join("x%d%s" % (i, list(x.shape())) + ("" if x.layout == "contiguous" else "/" + x.layout)
                          + ("" if x.base.dtype in plain else "/" + DTYPE_NAME[x.base.dtype])
                          for i, x in enumerate(inputs) if x is not None)
        full = "%s(%s) %s%s" % (op, ", ".join("%s=%s" % (k, json.dumps(v)) for k, v in args.items()), shapes,
                                (" [" + name + "]") if name else "")
        c = {"id": cid, "family": family, "op": op, "name": full, "args": args, "inputs": meta_in, "outputs": meta_out}
        if tol:
            c["tol"] = tol
        self.cases.append(c)
        self.counts[family] = self.counts.get(family, 0) + 1


# ---- the ops, as PyTorch computes them (keyword names = the metadata's args) ------------------

def _ord(o):
    """A vector_norm order as the case stores it: JSON has no infinities, so "inf"/"-inf"."""
    return {"inf": float("inf"), "-inf": float("-inf")}.get(o, o)


DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16}


def _all_dims(x, dims):
    return list(range(x.dim())) if len(dims) == 0 else dims


def _prod(x, dims, keepdim=False):
    """torch.prod over a list of dims (empty: every dim), one dim at a time: torch.prod takes one."""
    if x.dim() == 0:
        return torch.prod(x)
    reduced = sorted({d % x.dim() for d in _all_dims(x, dims)}, reverse=True)
    out = x
    for d in reduced:
        out = torch.prod(out, d, keepdim=True)
    return out if keepdim else out.reshape([n for d, n in enumerate(x.shape) if d not in reduced])


# torch 2.x's rms_norm eps default: the machine epsilon of the opmath type (float32 for float32,
# float16 and bfloat16 inputs, the only ones the cases use).
RMS_NORM_EPS = float(torch.finfo(torch.float32).eps)


def _rms_norm(x, w, normalized_shape, eps=None):
    e = eps if eps is not None else RMS_NORM_EPS
    dims = list(range(-len(normalized_shape), 0))
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + e)
    return y * w if w is not None else y


def _batch_norm(x, rm, rv, w, b, training, momentum=0.1, eps=1e-5):
    y = F.batch_norm(x, rm, rv, w, b, training, momentum, eps)
    return (y,) + tuple(t.clone() for t in (rm, rv) if t is not None)


def _max_dim(x, dim, keepdim=False):
    r = torch.max(x, dim, keepdim)
    return r.values, r.indices


def _min_dim(x, dim, keepdim=False):
    r = torch.min(x, dim, keepdim)
    return r.values, r.indices


def _sdpa(q, k, v, mask, is_causal, scale):
    """torch 2.x's scaled_dot_product_attention as its documentation writes it out (dropout 0):
    softmax(q k^T * scale + bias) v, scale 1 / sqrt(E) by default; bias -inf where a bool mask is
    False or, with is_causal, above the top-left aligned diagonal (tril of ones(L, S)); a floating
    mask is added."""
    L, S = q.size(-2), k.size(-2)
    w = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.size(-1)) if scale is None else scale)
    if is_causal:
        w = w.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -math.inf)
    if mask is not None:
        w = w.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else w + mask
    return F.softmax(w, -1) @ v


def _masked_softmax(x, mask, is_causal, scale):
    """frugal's masked_softmax (Note [Masked softmax]): softmax(scale * x + mask) along the last dim,
    masked as _sdpa's; a row with no key left gives zeros (and no gradient), as torch 2.5's
    _safe_softmax does on the math attention path."""
    z = x * scale
    if is_causal:
        z = z.masked_fill(~torch.ones(z.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    if mask is not None:
        z = z.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else z + mask
    empty = torch.isneginf(z).all(-1, keepdim=True)
    return F.softmax(z.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)


def _linear_cross_entropy(x, w, b, t, ignore_index=-100, label_smoothing=0.0, reduction="mean", chunk_rows=0):
    """cross_entropy(linear(x, w, b), t) over the rows of x (..., H); chunk_rows is frugal's
    memory knob, the same loss for every value."""
    logits = F.linear(x, w, b).reshape(-1, w.size(0))
    if logits.dtype in (torch.float16, torch.bfloat16):  # frugal's fused loss stays float32 (its header)
        logits = logits.float()
    return F.cross_entropy(logits, t.reshape(-1).long(), ignore_index=ignore_index, label_smoothing=label_smoothing,
                           reduction=reduction)


def _bn_relu(x, z, rm, rv, w, b, training, momentum, eps):
    """relu(batch_norm(x) [+ z]) and the running statistics after the call."""
    y = F.batch_norm(x, rm, rv, w, b, training, momentum, eps)
    y = torch.relu(y if z is None else y + z)
    return (y,) + tuple(t.clone() for t in (rm, rv) if t is not None)


CONVERT_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                  "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


class _RoundTo(torch.autograd.Function):
    """t's values as dtype dt holds them (still in t's dtype), the gradient passed through: the
    float64 reference of a copy into a narrower floating tensor."""

    @staticmethod
    def forward(ctx, t, dt):
        return t.to(dt).to(t.dtype)

    @staticmethod
    def backward(ctx, g):
        return g, None


def _rounded_to(t, dt):
    return _RoundTo.apply(t, dt) if dt.is_floating_point and t.is_floating_point() and t.dtype != dt else t


OPS = {
    # unary
    "neg": lambda x: torch.neg(x), "exp": lambda x: torch.exp(x), "log": lambda x: torch.log(x),
    "sqrt": lambda x: torch.sqrt(x), "rsqrt": lambda x: torch.rsqrt(x), "tanh": lambda x: torch.tanh(x),
    "sigmoid": lambda x: torch.sigmoid(x), "relu": lambda x: torch.relu(x),
    "gelu": lambda x, approximate="none": F.gelu(x, approximate=approximate),
    "silu": lambda x: F.silu(x), "log1p": lambda x: torch.log1p(x),
    "softplus": lambda x, beta=1.0, threshold=20.0: F.softplus(x, beta, threshold),
    "abs": lambda x: torch.abs(x), "square": lambda x: torch.square(x),
    "reciprocal": lambda x: torch.reciprocal(x), "sin": lambda x: torch.sin(x), "cos": lambda x: torch.cos(x),
    "pow_scalar": lambda x, exponent: torch.pow(x, exponent),
    "clamp": lambda x, lo, hi: torch.clamp(x, lo, hi),
    "leaky_relu": lambda x, negative_slope=0.01: F.leaky_relu(x, negative_slope),
    "elu": lambda x, alpha=1.0: F.elu(x, alpha),
    "hardtanh": lambda x, min_val=-1.0, max_val=1.0: F.hardtanh(x, min_val, max_val),
    "relu6": lambda x: F.relu6(x), "hardsigmoid": lambda x: F.hardsigmoid(x),
    "hardswish": lambda x: F.hardswish(x), "mish": lambda x: F.mish(x),
    "tan": torch.tan, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "erf": torch.erf,
    "erfc": torch.erfc, "expm1": torch.expm1, "exp2": torch.exp2, "log2": torch.log2, "log10": torch.log10,
    "selu": F.selu, "celu": lambda x, alpha=1.0: F.celu(x, alpha), "softsign": F.softsign,
    "tanhshrink": F.tanhshrink, "hardshrink": lambda x, lambd=0.5: F.hardshrink(x, lambd),
    "softshrink": lambda x, lambd=0.5: F.softshrink(x, lambd),
    "threshold": lambda x, threshold, value: F.threshold(x, threshold, value),
    "glu": lambda x, dim=-1: F.glu(x, dim), "prelu": F.prelu,
    "logsigmoid": F.logsigmoid, "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc,
    "round": torch.round, "sign": torch.sign,
    "normalize": lambda x, p=2.0, dim=1, eps=1e-12: F.normalize(x, _ord(p), dim, eps),
    "cosine_similarity": lambda a, b, dim=1, eps=1e-8: F.cosine_similarity(a, b, dim, eps),
    "pairwise_distance": lambda a, b, p=2.0, eps=1e-6, keepdim=False: F.pairwise_distance(a, b, _ord(p), eps,
                                                                                             keepdim),
    "triplet_margin_loss": lambda a, pos, neg, margin=1.0, p=2.0, eps=1e-6, swap=False, reduction="mean":
        F.triplet_margin_loss(a, pos, neg, margin, p, eps, swap, reduction=reduction),
    "cosine_embedding_loss": lambda a, b, y, margin=0.0, reduction="mean":
        F.cosine_embedding_loss(a, b, y, margin, reduction=reduction),
    # binary
    "add": lambda a, b, alpha=1.0: torch.add(a, b, alpha=alpha),
    "sub": lambda a, b, alpha=1.0: torch.sub(a, b, alpha=alpha),
    "mul": lambda a, b: torch.mul(a, b), "div": lambda a, b: torch.div(a, b),
    "maximum": lambda a, b: torch.maximum(a, b), "minimum": lambda a, b: torch.minimum(a, b),
    "pow": lambda a, b: torch.pow(a, b),
    "add_scalar": lambda x, s: x + s, "sub_scalar": lambda x, s: x - s, "mul_scalar": lambda x, s: x * s,
    "div_scalar": lambda x, s: x / s, "rsub_scalar": lambda x, s: s - x, "rdiv_scalar": lambda x, s: s / x,
    "where": lambda c, a, b: torch.where(c, a, b),
    "masked_fill": lambda x, m, value: x.masked_fill(m, value),
    "atan2": torch.atan2, "hypot": torch.hypot, "logaddexp": torch.logaddexp, "remainder": torch.remainder,
    "fmod": torch.fmod, "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder_scalar": lambda x, s: torch.remainder(x, s), "fmod_scalar": lambda x, s: torch.fmod(x, s),
    # torch.floor_divide has no backward in 1.13; div's floor mode is the same values with zero gradients
    "floor_divide_scalar": lambda x, s: torch.div(x, s, rounding_mode="floor"),
    # reductions
    "sum": lambda x, dims, keepdim=False: torch.sum(x, _all_dims(x, dims), keepdim) if x.dim() else torch.sum(x),
    "mean": lambda x, dims, keepdim=False: torch.mean(x, _all_dims(x, dims), keepdim) if x.dim() else torch.mean(x),
    "var": lambda x, dims, correction=1, keepdim=False: torch.var(x, _all_dims(x, dims) if x.dim() else None,
                                                                   correction=correction, keepdim=keepdim),
    "std": lambda x, dims, correction=1, keepdim=False: torch.std(x, _all_dims(x, dims) if x.dim() else None,
                                                                   correction=correction, keepdim=keepdim),
    "vector_norm": lambda x, dims, ord=2.0, keepdim=False: torch.linalg.vector_norm(
        x, _ord(ord), _all_dims(x, dims) if x.dim() else None, keepdim),
    "amax": lambda x, dims, keepdim=False: torch.amax(x, _all_dims(x, dims), keepdim),
    "amin": lambda x, dims, keepdim=False: torch.amin(x, _all_dims(x, dims), keepdim),
    "max_dim": _max_dim, "min_dim": _min_dim,
    "argmax": lambda x, dim, keepdim=False: torch.argmax(x, dim, keepdim),
    "argmin": lambda x, dim, keepdim=False: torch.argmin(x, dim, keepdim),
    "logsumexp": lambda x, dims, keepdim=False: torch.logsumexp(x, _all_dims(x, dims), keepdim),
    "softmax": lambda x, dim: F.softmax(x, dim), "log_softmax": lambda x, dim: F.log_softmax(x, dim),
    "cumsum": lambda x, dim, dtype=None: torch.cumsum(x, dim, dtype=None if dtype is None else DTYPES[dtype]),
    "prod": _prod,
    "diagonal": lambda x, offset=0, dim1=0, dim2=1: torch.diagonal(x, offset, dim1, dim2),
    "diag_embed": lambda x, offset=0, dim1=-2, dim2=-1: torch.diag_embed(x, offset, dim1, dim2),
    "diag": lambda x, offset=0: torch.diag(x, offset),
    "trace": torch.trace,
    "outer": torch.outer,
    "kron": torch.kron,
    "tensordot": lambda a, b, dims_a, dims_b: torch.tensordot(a, b, (dims_a, dims_b)),
    "cross": lambda a, b, dim=-1: torch.linalg.cross(a, b, dim=dim),
    "cdist": lambda a, b, p=2.0: torch.cdist(a, b, p),
    "cummax": lambda x, dim: tuple(torch.cummax(x, dim)),
    "cummin": lambda x, dim: tuple(torch.cummin(x, dim)),
    "logcumsumexp": lambda x, dim: torch.logcumsumexp(x, dim),
    "kthvalue": lambda x, k, dim=-1, keepdim=False: tuple(torch.kthvalue(x, k, dim, keepdim)),
    "median_dim": lambda x, dim, keepdim=False: tuple(torch.median(x, dim, keepdim)),
    "nanmedian_dim": lambda x, dim, keepdim=False: tuple(torch.nanmedian(x, dim, keepdim)),
    "median": torch.median, "nanmedian": torch.nanmedian,
    "quantile": lambda x, q, dim=None, keepdim=False, interpolation="linear": torch.quantile(
        x, q, dim, keepdim, interpolation=interpolation),
    "nanquantile": lambda x, q, dim=None, keepdim=False, interpolation="linear": torch.nanquantile(
        x, q, dim, keepdim, interpolation=interpolation),
    "nansum": lambda x, dims, keepdim=False: torch.nansum(x, _all_dims(x, dims), keepdim),
    "nanmean": lambda x, dims, keepdim=False: torch.nanmean(x, _all_dims(x, dims), keepdim),
    "any": lambda x, dim=None, keepdim=False: torch.any(x) if dim is None else torch.any(x, dim, keepdim),
    "all": lambda x, dim=None, keepdim=False: torch.all(x) if dim is None else torch.all(x, dim, keepdim),
    "count_nonzero": lambda x, dims: torch.count_nonzero(x, dims),
    "cumprod": lambda x, dim, dtype=None: torch.cumprod(x, dim, dtype=None if dtype is None else DTYPES[dtype]),
    # shape and join
    "roll": lambda x, shifts, dims=(): torch.roll(x, shifts, dims),
    "einsum": lambda *xs, equation: torch.einsum(equation, *xs),
    "movedim": lambda x, source, destination: torch.movedim(x, source, destination),
    "pixel_shuffle": lambda x, factor: F.pixel_shuffle(x, factor),
    "pixel_unshuffle": lambda x, factor: F.pixel_unshuffle(x, factor),
    "flip": lambda x, dims: torch.flip(x, dims), "repeat": lambda x, repeats: x.repeat(*repeats),
    "tril": lambda x, diagonal=0: torch.tril(x, diagonal), "triu": lambda x, diagonal=0: torch.triu(x, diagonal),
    "pad": lambda x, pad, mode="constant", value=0.0: F.pad(x, pad, mode, value) if mode == "constant"
    else F.pad(x, pad, mode),
    "cat": lambda *xs, dim=0: torch.cat(xs, dim), "stack": lambda *xs, dim=0: torch.stack(xs, dim),
    "chunk": lambda x, chunks, dim=0: torch.chunk(x, chunks, dim),
    "split_with_sizes": lambda x, sizes, dim=0: torch.split(x, sizes, dim),
    # indexing
    "gather": lambda x, index, dim: torch.gather(x, dim, index),
    "scatter_add": lambda s, index, src, dim: torch.scatter_add(s, dim, index, src),
    "index_select": lambda x, index, dim: torch.index_select(x, dim, index),
    "index_add": lambda s, index, src, dim: torch.index_add(s, dim, index, src),
    "embedding": lambda w, idx, padding_idx=None: F.embedding(idx, w, padding_idx),
    "one_hot": lambda idx, num_classes=-1: F.one_hot(idx, num_classes),
    # losses
    "cross_entropy": lambda x, t, w, ignore_index=-100, label_smoothing=0.0, reduction="mean":
        F.cross_entropy(x, t, w, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction),
    "nll_loss": lambda x, t, w, ignore_index=-100, reduction="mean":
        F.nll_loss(x, t, w, ignore_index=ignore_index, reduction=reduction),
    "mse_loss": lambda x, t, reduction="mean": F.mse_loss(x, t, reduction=reduction),
    "l1_loss": lambda x, t, reduction="mean": F.l1_loss(x, t, reduction=reduction),
    "smooth_l1_loss": lambda x, t, reduction="mean", beta=1.0: F.smooth_l1_loss(x, t, reduction=reduction, beta=beta),
    "huber_loss": lambda x, t, reduction="mean", delta=1.0: F.huber_loss(x, t, reduction=reduction, delta=delta),
    "binary_cross_entropy": lambda x, t, w, reduction="mean": F.binary_cross_entropy(x, t, w, reduction=reduction),
    "bce_with_logits": lambda x, t, w, pw, reduction="mean":
        F.binary_cross_entropy_with_logits(x, t, w, reduction=reduction, pos_weight=pw),
    "kl_div": lambda x, t, reduction="mean", log_target=False:
        F.kl_div(x, t, reduction=reduction, log_target=log_target),
    # normalization
    "layer_norm": lambda x, w, b, normalized_shape, eps=1e-5: F.layer_norm(x, normalized_shape, w, b, eps),
    "group_norm": lambda x, w, b, num_groups, eps=1e-5: F.group_norm(x, num_groups, w, b, eps),
    "rms_norm": _rms_norm,
    "batch_norm": _batch_norm,
    # convolution, pooling, products
    "conv2d": lambda x, w, b, stride=1, padding=0, dilation=1, groups=1:
        F.conv2d(x, w, b, stride, padding, dilation, groups),
    "conv_transpose2d": lambda x, w, b, stride=1, padding=0, output_padding=0, groups=1, dilation=1:
        F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation),
    "conv1d": lambda x, w, b, stride=1, padding=0, dilation=1, groups=1:
        F.conv1d(x, w, b, stride, padding, dilation, groups),
    "conv_transpose1d": lambda x, w, b, stride=1, padding=0, output_padding=0, groups=1, dilation=1:
        F.conv_transpose1d(x, w, b, stride, padding, output_padding, groups, dilation),
    "sort": lambda x, dim=-1, descending=False: torch.sort(x, dim=dim, descending=descending, stable=True),
    "argsort": lambda x, dim=-1, descending=False: torch.sort(x, dim=dim, descending=descending, stable=True)[1],
    "topk": lambda x, k, dim=-1, largest=True: torch.topk(x, k, dim, largest, sorted=True),
    "max_pool1d": lambda x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False:
        F.max_pool1d(x, kernel, stride, padding, dilation, ceil_mode),
    "avg_pool1d": lambda x, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True:
        F.avg_pool1d(x, kernel, stride, padding, ceil_mode, count_include_pad),
    "adaptive_avg_pool1d": lambda x, output_size: F.adaptive_avg_pool1d(x, output_size),
    "max_pool2d": lambda x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False:
        F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode),
    "avg_pool2d": lambda x, kernel, stride=None, padding=0, ceil_mode=False, count_include_pad=True:
        F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad),
    "adaptive_avg_pool2d": lambda x, output_size: F.adaptive_avg_pool2d(x, output_size),
    "matmul": lambda a, b: torch.matmul(a, b),
    "linear": lambda x, w, b: F.linear(x, w, b),
    # fused and functional ops, against PyTorch's composition of the unfused ones
    "sdpa": lambda q, k, v, mask, is_causal=False, scale=None: _sdpa(q, k, v, mask, is_causal, scale),
    "masked_softmax": lambda x, mask, is_causal=False, scale=1.0: _masked_softmax(x, mask, is_causal, scale),
    "gelu_mlp": lambda x, w1, b1, w2, b2: F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2),
    "linear_cross_entropy": _linear_cross_entropy,
    "batch_norm_relu": lambda x, rm, rv, w, b, training, momentum=0.1, eps=1e-5:
        _bn_relu(x, None, rm, rv, w, b, training, momentum, eps),
    "batch_norm_add_relu": lambda x, z, rm, rv, w, b, training, momentum=0.1, eps=1e-5:
        _bn_relu(x, z, rm, rv, w, b, training, momentum, eps),
    # in place, on a clone of the (non-contiguous) argument: see inplace_cases
    "add_": lambda x, o, alpha=1.0: x.clone().add_(o, alpha=alpha),
    "sub_": lambda x, o, alpha=1.0: x.clone().sub_(o, alpha=alpha),
    "mul_": lambda x, o: x.clone().mul_(o), "div_": lambda x, o: x.clone().div_(o),
    "add_scalar_": lambda x, s: x.clone().add_(s), "sub_scalar_": lambda x, s: x.clone().sub_(s),
    "mul_scalar_": lambda x, s: x.clone().mul_(s), "div_scalar_": lambda x, s: x.clone().div_(s),
    "masked_fill_": lambda x, m, value: x.clone().masked_fill_(m, value),
    # conversions
    "to": lambda x, dtype: x.to(CONVERT_DTYPES[dtype]),
    "copy_": lambda dst, src, dtype: dst.clone().copy_(_rounded_to(src, CONVERT_DTYPES[dtype])),
}


# ---- the cases --------------------------------------------------------------------------------

LAYOUTS = ["contiguous", "transposed", "strided", "permuted", "expanded", "selected"]


def unary_cases(g):
    # (op, args, value range, kinks to plant)
    table = [
        ("neg", {}, (-2, 2), ()), ("exp", {}, (-3, 3), ()), ("log", {}, (0.05, 4), ()),
        ("sqrt", {}, (0.05, 4), ()), ("rsqrt", {}, (0.1, 4), ()), ("tanh", {}, (-3, 3), ()),
        ("sigmoid", {}, (-5, 5), ()), ("relu", {}, (-2, 2), (0.0,)),
        ("gelu", {"approximate": "none"}, (-4, 4), (0.0,)), ("gelu", {"approximate": "tanh"}, (-4, 4), (0.0,)),
        ("silu", {}, (-5, 5), ()), ("log1p", {}, (-0.9, 3), (0.0,)),
        ("softplus", {}, (-5, 5), (0.0,)), ("softplus", {"beta": 2.0, "threshold": 3.0}, (-3, 3), (1.5, 0.0)),
        ("abs", {}, (-2, 2), (0.0,)), ("square", {}, (-2, 2), ()), ("reciprocal", {}, (0.2, 3), ()),
        ("sin", {}, (-4, 4), ()), ("cos", {}, (-4, 4), ()),
        ("pow_scalar", {"exponent": 3.0}, (-2, 2), (0.0,)), ("pow_scalar", {"exponent": 0.5}, (0.1, 3), ()),
        ("pow_scalar", {"exponent": -1.5}, (0.2, 3), ()), ("pow_scalar", {"exponent": 2.0}, (-2, 2), (0.0,)),
        ("pow_scalar", {"exponent": 0.0}, (-2, 2), (0.0,)),
        ("clamp", {"lo": -0.5, "hi": 0.75}, (-2, 2), (-0.5, 0.75)),
        ("leaky_relu", {}, (-2, 2), (0.0,)), ("leaky_relu", {"negative_slope": 0.2}, (-2, 2), (0.0,)),
        ("elu", {}, (-3, 2), (0.0,)), ("elu", {"alpha": 0.5}, (-3, 2), (0.0,)),
        ("hardtanh", {}, (-2, 2), (-1.0, 1.0)), ("hardtanh", {"min_val": -0.25, "max_val": 2.0}, (-3, 3), (-0.25, 2.0)),
        ("relu6", {}, (-2, 8), (0.0, 6.0)), ("hardsigmoid", {}, (-5, 5), (-3.0, 3.0)),
        ("hardswish", {}, (-5, 5), (-3.0, 3.0, 0.0)), ("mish", {}, (-5, 5), ()),
    ]
    shapes = [(3, 5), (2, 3, 4), (7,)]
    for i, (op, args, (lo, hi), special) in enumerate(table):
        for j in range(3):  # three layouts per op, rotating through them
            layout = LAYOUTS[(i + j) % len(LAYOUTS)]
            shape = shapes[(i + j) % len(shapes)]
            g.case("unary", op, [g.L(layout, shape, lo=lo, hi=hi, special=special)], args)
    # 0-d and size-0 inputs
    for op, args, lo, hi in [("exp", {}, -1, 1), ("gelu", {"approximate": "tanh"}, -2, 2), ("hardswish", {}, -2, 2),
                             ("softplus", {}, -2, 2), ("sqrt", {}, 0.5, 2)]:
        g.case("unary", op, [g.C((), lo=lo, hi=hi)], args, "0-d")
        g.case("unary", op, [g.T((0, 3), lo=lo, hi=hi)], args, "size 0")
    # softplus past the threshold, on both sides; float16 and bfloat16
    g.case("unary", "softplus", [g.C((4, 5), lo=-30, hi=30, special=(20.0, 21.0, -21.0))], {})
    for dt in (torch.float16, torch.bfloat16):
        for op, args, lo, hi, sp in [("exp", {}, -3, 3, ()), ("tanh", {}, -3, 3, ()), ("sigmoid", {}, -5, 5, ()),
                                     ("gelu", {"approximate": "none"}, -4, 4, ()), ("silu", {}, -4, 4, ()),
                                     ("hardswish", {}, -5, 5, (-3.0, 3.0)), ("log", {}, 0.1, 4, ()),
                                     ("leaky_relu", {"negative_slope": 0.2}, -2, 2, (0.0,))]:
            g.case("unary", op, [g.T((3, 6), lo=lo, hi=hi, dtype=dt, special=sp)], args)


def binary_cases(g):
    ops = [("add", {}), ("add", {"alpha": -0.5}), ("sub", {}), ("sub", {"alpha": 2.0}), ("mul", {}), ("div", {}),
           ("maximum", {}), ("minimum", {}), ("pow", {})]
    pairs = [  # (a, b) input makers for one broadcast/layout situation
        ("same shape", lambda lo, hi: (g.C((3, 4), lo=lo, hi=hi), g.C((3, 4), lo=lo, hi=hi))),
        ("broadcast (3,1,4)x(2,4)", lambda lo, hi: (g.C((3, 1, 4), lo=lo, hi=hi), g.C((2, 4), lo=lo, hi=hi))),
        ("transposed x strided", lambda lo, hi: (g.T((4, 5), lo=lo, hi=hi), g.S((4, 5), lo=lo, hi=hi))),
        ("expanded x (5)", lambda lo, hi: (g.E((3, 5), (1, 5), lo=lo, hi=hi), g.S((5,), lo=lo, hi=hi))),
        ("0-d operand", lambda lo, hi: (g.P((2, 3, 4), (2, 0, 1), lo=lo, hi=hi), g.C((), lo=lo, hi=hi))),
        ("0-d x vector", lambda lo, hi: (g.C((), lo=lo, hi=hi), g.C((6,), lo=lo, hi=hi))),
        ("size 0", lambda lo, hi: (g.C((0, 3), lo=lo, hi=hi), g.C((1, 3), lo=lo, hi=hi))),
    ]
    for op, args in ops:
        lo, hi = (0.3, 2.0) if op == "pow" else (-2.0, 2.0)
        for name, make in pairs:
            a, b = make(lo, hi)
            if op == "div":
                b.base = torch.where(b.base.abs() < 0.25, torch.full_like(b.base, 0.5), b.base)
            g.case("binary", op, [a, b], args, name)
    # ties of maximum/minimum: equal entries share the gradient
    for op in ("maximum", "minimum"):
        a = g.C((4, 5), lo=-2, hi=2)
        b = In(a.base.clone(), grad=True)
        b.base.view(-1)[::3] += 0.5
        g.case("binary", op, [a, b], {}, "ties")
        a2 = g.C((3, 4), lo=-2, hi=2)
        g.case("binary", op, [a2, In(a2.base[1:2].clone())], {}, "ties, broadcast")
    # pow: zero base, negative base with integer exponents, tensor exponent broadcast
    base = g.vals((3, 4), 0.2, 2.0, special=(0.0, 0.0, 0.0))
    expo = g.vals((3, 4), 0.5, 3.0, special=(0.0, 2.0, 1.0))
    g.case("binary", "pow", [In(base), In(expo)], {}, "zero base")
    neg = g.vals((2, 5), -2.0, 2.0)
    g.case("binary", "pow", [In(neg), In(torch.tensor([1.0, 2.0, 3.0, 0.0, -2.0]), grad=False)], {},
           "negative base, integer exponents")
    g.case("binary", "pow", [In(torch.tensor(2.0)), g.T((3, 2), lo=-1, hi=2)], {}, "0-d base")
    # mixed dtypes: a 0-d float64 with float32 stays float32; float16 with float32 is float32
    g.case("binary", "mul", [g.T((3, 4)), In(torch.tensor(1.5, dtype=torch.float64))], {}, "0-d float64")
    g.case("binary", "add", [g.C((3, 4), dtype=torch.float16), g.C((4,))], {}, "float16 + float32")
    g.case("binary", "mul", [g.T((3, 4), dtype=torch.bfloat16), g.S((3, 4), dtype=torch.bfloat16)], {}, "bfloat16")
    g.case("binary", "div", [g.C((2, 3), dtype=torch.float16), g.C((2, 1), lo=0.5, hi=2, dtype=torch.float16)], {},
           "float16 broadcast")
    # scalar operands
    for op, s in [("add_scalar", 1.25), ("sub_scalar", -0.5), ("mul_scalar", -3.0), ("div_scalar", 4.0),
                  ("rsub_scalar", 2.0), ("rdiv_scalar", 1.5)]:
        lo, hi = (0.3, 2.0) if op == "rdiv_scalar" else (-2.0, 2.0)
        g.case("binary", op, [g.T((3, 4), lo=lo, hi=hi)], {"s": s})
        g.case("binary", op, [g.C((), lo=lo, hi=hi)], {"s": s}, "0-d")
    g.case("binary", "mul_scalar", [g.C((2, 3), dtype=torch.float16)], {"s": 0.1}, "float16")
    # where (cond broadcast three ways) and masked_fill
    cond = g.I(torch.rand((3, 1, 4), generator=g.rng) > 0.5)
    g.case("binary", "where", [cond, g.C((2, 4)), g.C((3, 2, 1))], {}, "3-way broadcast")
    condT = torch.rand((5, 4), generator=g.rng) > 0.4
    g.case("binary", "where", [g.I(condT, [("transpose", 0, 1)], "transposed"), g.T((4, 5)), g.C(())], {}, "0-d other")
    g.case("binary", "masked_fill", [g.T((3, 4)), g.I(torch.rand((4,), generator=g.rng) > 0.5)], {"value": -2.5})
    g.case("binary", "masked_fill", [g.S((2, 3, 4)), g.I(torch.rand((3, 1), generator=g.rng) > 0.5)], {"value": 7.0})


def reduce_cases(g):
    x3 = lambda lay: g.L(lay, (3, 4, 5))  # noqa: E731
    dims_list = [[], [0], [-1], [1], [0, 2], [-1, -3], [2, 0, 1]]
    for op in ("sum", "mean", "amax", "amin", "logsumexp"):
        for i, dims in enumerate(dims_list):
            if op == "logsumexp" and dims == []:
                dims = [0, 1]
            lay = LAYOUTS[i % len(LAYOUTS)]
            g.case("reduce", op, [x3(lay)], {"dims": dims, "keepdim": i % 2 == 1})
    for corr in (0, 1, 2):
        for i, dims in enumerate([[], [1], [0, 2], [-1]]):
            g.case("reduce", "var", [x3(LAYOUTS[(i + corr) % len(LAYOUTS)])],
                   {"dims": dims, "correction": corr, "keepdim": i % 2 == 0})
    for corr in (0, 1):
        for i, dims in enumerate([[], [1], [0, 2], [-1]]):
            g.case("reduce", "std", [x3(LAYOUTS[(i + corr + 1) % len(LAYOUTS)])],
                   {"dims": dims, "correction": corr, "keepdim": i % 2 == 1})
    for i, o in enumerate([2.0, 1.0, 3.0, 1.5, 0.5, -1.0, "inf", "-inf"]):  # ord 0: no gradient in frugal
        dims = [[1], [], [0, 2], [-1]][i % 4]
        g.case("reduce", "vector_norm", [x3(LAYOUTS[i % len(LAYOUTS)])], {"dims": dims, "ord": o, "keepdim": i % 2 == 0})
    zeros_row = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 2.0], [0.0, 3.0, -4.0]])
    for o in (2.0, 3.0, 1.5):
        g.case("reduce", "vector_norm", [In(zeros_row.clone())], {"dims": [1], "ord": o}, "a zero norm, a zero entry")
    g.case("reduce", "vector_norm", [g.T((4, 6), dtype=torch.float16)], {"dims": [1], "ord": 2.0})
    # ties: amax/amin share the gradient; max/min along a dim give it to the first index
    tie = torch.tensor([[1.0, 3.0, 3.0, -1.0], [2.0, 2.0, 2.0, 2.0], [-5.0, 0.5, -5.0, 0.25]])
    for op in ("amax", "amin"):
        g.case("reduce", op, [In(tie.clone())], {"dims": [1], "keepdim": False}, "ties")
        g.case("reduce", op, [In(tie.clone())], {"dims": [], "keepdim": False}, "ties")
    for op in ("max_dim", "min_dim"):
        for i, (dim, keep) in enumerate([(0, False), (-1, True), (1, False), (2, True)]):
            g.case("reduce", op, [x3(LAYOUTS[i % len(LAYOUTS)])], {"dim": dim, "keepdim": keep})
        g.case("reduce", op, [In(tie.clone())], {"dim": 1, "keepdim": False}, "ties")
        g.case("reduce", op, [In(tie.clone(), [("transpose", 0, 1)], layout="transposed")],
               {"dim": 0, "keepdim": True}, "ties")
        g.case("reduce", op, [g.C(())], {"dim": 0, "keepdim": False}, "0-d")
    for op in ("argmax", "argmin"):
        for i, (dim, keep) in enumerate([(0, False), (-1, True), (1, False)]):
            g.case("reduce", op, [x3(LAYOUTS[(i + 1) % len(LAYOUTS)])], {"dim": dim, "keepdim": keep})
        g.case("reduce", op, [In(tie.clone(), grad=False)], {"dim": 1, "keepdim": False}, "ties")
    # 0-d and size-0
    for op in ("sum", "mean", "amax", "logsumexp"):
        g.case("reduce", op, [g.C(())], {"dims": [] if op != "logsumexp" else [0], "keepdim": False}, "0-d")
    g.case("reduce", "sum", [g.C(())], {"dims": [-1], "keepdim": True}, "0-d, dim -1")
    g.case("reduce", "var", [g.C((5,))], {"dims": [], "correction": 1, "keepdim": False}, "1-D")
    g.case("reduce", "sum", [g.T((0, 3))], {"dims": [0], "keepdim": False}, "size 0 reduced")
    g.case("reduce", "sum", [g.C((0, 3))], {"dims": [1], "keepdim": True}, "size 0 kept")
    g.case("reduce", "mean", [g.C((0, 3))], {"dims": [0], "keepdim": False}, "size 0 reduced: NaN")
    g.case("reduce", "amax", [g.C((0, 3))], {"dims": [1], "keepdim": False}, "size 0 kept")
    g.case("reduce", "logsumexp", [g.C((2, 0))], {"dims": [1], "keepdim": False}, "size 0 reduced: -inf")
    g.case("reduce", "var", [g.C((1, 4))], {"dims": [0], "correction": 1, "keepdim": False}, "N - correction = 0")
    # 16-bit
    for dt in (torch.float16, torch.bfloat16):
        for op, args in [("sum", {"dims": [1]}), ("mean", {"dims": [0, 2]}), ("var", {"dims": [-1], "correction": 1}),
                         ("amax", {"dims": [1]}), ("logsumexp", {"dims": [2]})]:
            g.case("reduce", op, [g.T((3, 4, 5), dtype=dt)], dict(args, keepdim=False))


def softmax_cases(g):
    for op in ("softmax", "log_softmax"):
        for i, (shape, dim) in enumerate([((3, 4, 5), -1), ((3, 4, 5), 0), ((3, 4, 5), 1), ((6,), 0), ((2, 7), 1)]):
            g.case("softmax", op, [g.L(LAYOUTS[i % len(LAYOUTS)], shape, lo=-4, hi=4)], {"dim": dim})
        g.case("softmax", op, [g.C(())], {"dim": 0}, "0-d")
        g.case("softmax", op, [g.C((0, 4))], {"dim": 1}, "size 0")
        g.case("softmax", op, [g.C((3, 4), lo=-80, hi=80)], {"dim": 1}, "large logits")
        for dt in (torch.float16, torch.bfloat16):
            g.case("softmax", op, [g.T((4, 6), lo=-4, hi=4, dtype=dt)], {"dim": -1})
    for i, (shape, dim) in enumerate([((3, 4, 5), -1), ((3, 4, 5), 0), ((3, 4, 5), 1), ((7,), 0)]):
        g.case("softmax", "cumsum", [g.L(LAYOUTS[(i + 1) % len(LAYOUTS)], shape)], {"dim": dim})
    g.case("softmax", "cumsum", [g.C(())], {"dim": 0}, "0-d")
    g.case("softmax", "cumsum", [g.C((0, 3))], {"dim": 1}, "size 0")
    g.case("softmax", "cumsum", [g.T((4, 5), dtype=torch.float16)], {"dim": 0})
    g.case("softmax", "cumsum", [g.T((4, 5), dtype=torch.float16)], {"dim": 1, "dtype": "float32"}, "dtype")
    g.case("softmax", "cumsum", [g.S((2, 1100))], {"dim": 1}, "long rows: chunks")


def shape_cases(g):
    g.case("shape", "flip", [g.T((3, 4, 2))], {"dims": [0, -1]})
    g.case("shape", "flip", [g.S((5, 3))], {"dims": [1]})
    g.case("shape", "flip", [g.E((2, 3, 4), (1, 3, 1))], {"dims": [0, 1, 2]})
    g.case("shape", "flip", [g.C(())], {"dims": []}, "0-d")
    g.case("shape", "repeat", [g.T((2, 3))], {"repeats": [2, 1, 3]})
    g.case("shape", "repeat", [g.S((3,))], {"repeats": [2, 2]})
    g.case("shape", "repeat", [g.C((2, 2))], {"repeats": [0, 2]}, "zero repeat")
    g.case("shape", "repeat", [g.C(())], {"repeats": [3]}, "0-d")
    for op in ("tril", "triu"):
        for i, (shape, diag) in enumerate([((4, 4), 0), ((3, 5), 1), ((5, 3), -1), ((2, 3, 4), 2), ((3, 4), -5)]):
            g.case("shape", op, [g.L(LAYOUTS[i % 4], shape)], {"diagonal": diag})
    pads = [
        ((3, 4), [1, 2], "constant", 0.0), ((3, 4), [1, 0, 2, 1], "constant", -1.5),
        ((3, 5), [-1, 2], "constant", 0.5), ((2, 3, 5), [-2, -1, 1, -1], "constant", 0.0),
        ((2, 3, 4), [0, 0, 0, 0, 1, 2], "constant", 3.0),
        ((2, 5), [2, 3], "reflect", 0.0), ((2, 3, 6), [1, 4], "reflect", 0.0),
        ((1, 2, 4, 5), [1, 2, 3, 0], "reflect", 0.0), ((3, 4, 5), [2, 1, 1, 3], "reflect", 0.0),
        ((2, 4), [3, 1], "replicate", 0.0), ((2, 3, 4), [2, 2], "replicate", 0.0),
        ((2, 3, 4, 5), [1, 3, 2, 0], "replicate", 0.0), ((3, 2, 3), [4, 1, 2, 2], "replicate", 0.0),
        ((1, 2, 2, 3, 3), [1, 1, 0, 2, 1, 0], "replicate", 0.0),
        ((2, 3, 5), [2, 1], "circular", 0.0), ((1, 2, 4, 5), [1, 2, 3, 0], "circular", 0.0),
        ((2, 3, 4), [4, 4], "circular", 0.0), ((1, 1, 2, 3, 2), [1, 0, 2, 2, 1, 1], "circular", 0.0),
    ]
    for i, (shape, p, mode, v) in enumerate(pads):
        args = {"pad": p, "mode": mode}
        if mode == "constant":
            args["value"] = v
        g.case("shape", "pad", [g.L(["contiguous", "transposed", "strided", "permuted"][i % 4], shape)], args)
    # joins
    g.case("shape", "cat", [g.T((3, 2)), g.C((3, 4)), g.S((3, 1))], {"dim": 1})
    g.case("shape", "cat", [g.C((2, 3)), g.C((0, 3)), g.E((4, 3), (1, 3))], {"dim": 0}, "size-0 piece")
    g.case("shape", "cat", [g.P((2, 3, 4), (1, 2, 0)), g.C((2, 3, 1))], {"dim": -1})
    g.case("shape", "cat", [g.C((4,)), g.S((3,))], {"dim": 0})
    g.case("shape", "cat", [g.C((2, 3), dtype=torch.float16), g.T((1, 3), dtype=torch.float16)], {"dim": 0})
    g.case("shape", "stack", [g.T((3, 4)), g.S((3, 4)), g.C((3, 4))], {"dim": -1})
    g.case("shape", "stack", [g.C(()), g.C(())], {"dim": 0}, "0-d")
    g.case("shape", "stack", [g.E((2, 3), (2, 1)), g.C((2, 3))], {"dim": 1})
    g.case("shape", "chunk", [g.T((7, 3))], {"chunks": 3, "dim": 0})
    g.case("shape", "chunk", [g.S((2, 5))], {"chunks": 2, "dim": -1})
    g.case("shape", "split_with_sizes", [g.P((3, 6), (1, 0))], {"sizes": [1, 0, 3, 2], "dim": 1})


def index_cases(g):
    x = g.T((4, 5))
    g.case("index", "gather", [x, g.I(g.ints((4, 3), 0, 5))], {"dim": 1})
    g.case("index", "gather", [g.S((4, 5)), g.I(g.ints((6, 5), 0, 4))], {"dim": 0}, "repeated rows")
    idxT = g.ints((3, 2), 0, 4)  # its transpose is the (2, 3) index
    g.case("index", "gather", [g.C((3, 4)), g.I(idxT, [("transpose", 0, 1)], "transposed")], {"dim": 1},
           "index transposed")
    g.case("index", "gather", [g.P((2, 4, 3), (0, 2, 1)), g.I(g.ints((2, 5, 3), 0, 4))], {"dim": -2})
    g.case("index", "gather", [g.C(()), g.I(torch.tensor(0))], {"dim": 0}, "0-d")
    g.case("index", "scatter_add", [g.T((3, 5)), g.I(g.ints((3, 4), 0, 5)), g.C((3, 4))], {"dim": 1})
    # (torch 1.13's backward cannot take a src larger than the index: its grad_src has the index's shape)
    g.case("index", "scatter_add", [g.C((4, 3)), g.I(g.ints((5, 2), 0, 4)), g.S((5, 2))], {"dim": 0},
           "index narrower than self")
    g.case("index", "scatter_add", [g.C((4, 3)), g.I(g.ints((2, 3), 0, 3)), g.C((2, 3))], {"dim": -1})
    g.case("index", "index_select", [g.T((4, 5)), g.I(torch.tensor([3, 0, 3, 1]))], {"dim": 0})
    g.case("index", "index_select", [g.P((2, 3, 4), (2, 1, 0)), g.I(torch.tensor([2, 2, 0]))], {"dim": -1})
    g.case("index", "index_select", [g.S((4, 3)), g.I(torch.tensor(2))], {"dim": 0}, "0-d index")
    g.case("index", "index_select", [g.C((3, 4)), g.I(torch.zeros(0, dtype=torch.int64))], {"dim": 1}, "empty index")
    g.case("index", "index_add", [g.T((5, 3)), g.I(torch.tensor([0, 4, 0, 2])), g.C((4, 3))], {"dim": 0})
    g.case("index", "index_add", [g.C((2, 4)), g.I(torch.tensor([3, 3])), g.T((2, 2))], {"dim": 1})
    w = lambda: g.C((6, 4))  # noqa: E731
    g.case("index", "embedding", [w(), g.I(torch.tensor([[1, 5, 1], [0, 2, 5]]))], {})
    g.case("index", "embedding", [w(), g.I(torch.tensor([1, 3, 3, 0]))], {"padding_idx": 3})
    g.case("index", "embedding", [g.T((6, 4)), g.I(torch.tensor([[5, 1], [5, 4]]))], {"padding_idx": -1},
           "negative padding_idx")
    g.case("index", "embedding", [w(), g.I(torch.tensor(4))], {}, "0-d indices")
    g.case("index", "embedding", [w(), g.I(torch.tensor([[0, 1, 2], [3, 4, 5]]), [("transpose", 0, 1)], "transposed")],
           {}, "transposed indices")
    g.case("index", "one_hot", [g.I(torch.tensor([[0, 3], [2, 2]]))], {"num_classes": 5})
    g.case("index", "one_hot", [g.I(torch.tensor([1, 0, 3]))], {}, "inferred classes")


def loss_cases(g):
    reds = ["none", "mean", "sum"]
    # cross entropy: class indices
    def ce(x, t, w, **kw):
        for r in reds:
            g.case("loss", "cross_entropy", [x(), g.I(t), w() if w else None], dict(kw, reduction=r))
    N, Cn = 5, 4
    t = torch.tensor([0, 3, 1, 3, 2])
    ce(lambda: g.C((N, Cn), lo=-3, hi=3), t, None)
    ce(lambda: g.T((N, Cn), lo=-3, hi=3), t, lambda: In(g.vals((Cn,), 0.2, 2.0), grad=False))
    ce(lambda: g.C((N, Cn), lo=-3, hi=3), torch.tensor([0, -100, 1, 3, -100]), None)
    weight = lambda: In(g.vals((Cn,), 0.2, 2.0), grad=False)  # noqa: E731
    ce(lambda: g.C((N, Cn), lo=-3, hi=3), torch.tensor([0, 2, 1, 3, 2]), weight, ignore_index=2)
    ce(lambda: g.S((N, Cn), lo=-3, hi=3), t, None, label_smoothing=0.2)
    ce(lambda: g.C((N, Cn), lo=-3, hi=3), torch.tensor([0, -100, 1, 3, 2]), weight, label_smoothing=0.1)
    ce(lambda: g.P((2, 3, 4), (0, 2, 1), lo=-3, hi=3), torch.tensor([[0, 2, 1, 1], [2, -100, 0, 1]]), None)
    ce(lambda: g.C((Cn,), lo=-3, hi=3), torch.tensor(2), None)  # unbatched
    g.case("loss", "cross_entropy", [g.C((2, 3), lo=-3, hi=3), g.I(torch.tensor([-100, -100])), None],
           {"reduction": "mean"}, "all ignored: NaN")
    g.case("loss", "cross_entropy", [g.C((0, 3)), g.I(torch.zeros(0, dtype=torch.int64)), None], {"reduction": "sum"},
           "empty batch")
    # cross entropy: class probabilities
    def probs(shape, dim=1):
        return F.softmax(g.vals(shape, -2, 2, torch.float64), dim).to(torch.float32)
    for r in reds:
        g.case("loss", "cross_entropy", [g.T((N, Cn), lo=-3, hi=3), In(probs((N, Cn))), None], {"reduction": r},
               "probabilities")
        g.case("loss", "cross_entropy", [g.C((N, Cn), lo=-3, hi=3), In(probs((N, Cn))),
                                         In(g.vals((Cn,), 0.2, 2.0), grad=False)],
               {"reduction": r, "label_smoothing": 0.15}, "probabilities")
    g.case("loss", "cross_entropy", [g.C((2, 3, 2), lo=-3, hi=3), In(probs((2, 3, 2))), None], {"reduction": "mean"},
           "probabilities (N, C, d)")
    # nll_loss
    for r in reds:
        g.case("loss", "nll_loss", [g.T((N, Cn)), g.I(t), None], {"reduction": r})
        g.case("loss", "nll_loss", [g.C((N, Cn)), g.I(torch.tensor([0, -100, 1, 3, 1])),
                                    In(g.vals((Cn,), 0.2, 2.0), grad=False)], {"reduction": r})
        g.case("loss", "nll_loss", [g.P((2, 3, 4), (0, 2, 1)), g.I(torch.tensor([[0, 2, 1, 1], [2, 1, 0, 1]])),
                                    In(g.vals((3,), 0.2, 2.0), grad=False)], {"reduction": r, "ignore_index": 1})
    g.case("loss", "nll_loss", [g.C((Cn,)), g.I(torch.tensor(1)), None], {"reduction": "mean"}, "unbatched")
    # pointwise regression losses
    for op, extra in [("mse_loss", {}), ("l1_loss", {}), ("smooth_l1_loss", {}), ("smooth_l1_loss", {"beta": 0.5}),
                      ("smooth_l1_loss", {"beta": 0.0}), ("huber_loss", {}), ("huber_loss", {"delta": 0.3})]:
        for i, r in enumerate(reds):
            a = g.L(LAYOUTS[i], (3, 4), lo=-2, hi=2)
            b = g.L(LAYOUTS[(i + 1) % 3], (3, 4), lo=-2, hi=2)
            g.case("loss", op, [a, b], dict(extra, reduction=r))
    base = g.vals((3, 4))
    tgt = base.clone()
    tgt.view(-1)[::4] += torch.tensor([1.0, -0.5, 0.3])  # d = 0 on most entries, |d| = beta/delta on some
    for op in ("l1_loss", "smooth_l1_loss", "huber_loss"):
        g.case("loss", op, [In(base.clone()), In(tgt.clone())], {"reduction": "sum"}, "kinks")
    g.case("loss", "mse_loss", [g.C((4,)), g.C((3, 4))], {"reduction": "mean"}, "broadcast target")
    g.case("loss", "l1_loss", [g.C((2, 4), dtype=torch.float16), g.C((2, 4), dtype=torch.float16)],
           {"reduction": "mean"})
    # binary cross entropy (probabilities in (0, 1), away from the documented x = 0/1 convention)
    for r in reds:
        g.case("loss", "binary_cross_entropy", [g.T((3, 4), lo=0.05, hi=0.95), g.C((3, 4), lo=0, hi=1), None],
               {"reduction": r})
        g.case("loss", "binary_cross_entropy", [g.C((3, 4), lo=0.05, hi=0.95),
                                                In(torch.randint(0, 2, (3, 4), generator=g.rng).float()),
                                                In(g.vals((4,), 0.2, 2), grad=False)], {"reduction": r}, "hard targets")
    for r in reds:
        g.case("loss", "bce_with_logits", [g.S((3, 4), lo=-4, hi=4), g.C((3, 4), lo=0, hi=1), None, None],
               {"reduction": r})
        g.case("loss", "bce_with_logits", [g.C((3, 4), lo=-4, hi=4), g.T((3, 4), lo=0, hi=1),
                                           In(g.vals((3, 1), 0.2, 2), grad=False),
                                           In(g.vals((4,), 0.2, 3), grad=False)],
               {"reduction": r}, "weight and pos_weight")
    g.case("loss", "bce_with_logits", [g.C((2, 3, 4), lo=-30, hi=30), g.C((2, 3, 4), lo=0, hi=1), None,
                                       In(g.vals((4,), 0.2, 3), grad=False)], {"reduction": "sum"}, "large logits")
    # kl_div: targets strictly positive (frugal's documented t = 0 target gradient differs)
    for lt in (False, True):
        for r in ("none", "mean", "sum", "batchmean"):
            x = g.T((3, 5), lo=-3, hi=0)
            t = g.C((3, 5), lo=-3, hi=0) if lt else g.C((3, 5), lo=0.05, hi=1)
            g.case("loss", "kl_div", [x, t], {"reduction": r, "log_target": lt})
    tz = g.vals((3, 4), 0.05, 1.0, special=(0.0, 0.0, 0.0))
    g.case("loss", "kl_div", [g.C((3, 4), lo=-3, hi=0), In(tz, grad=False)], {"reduction": "sum"},
           "t = 0, input grad only")
    g.case("loss", "kl_div", [g.C((4,), lo=-3, hi=0), g.C((2, 4), lo=0.1, hi=1)], {"reduction": "batchmean"},
           "broadcast input")


def norm_cases(g):
    opt = lambda shape, lo=0.5, hi=1.5: In(g.vals(shape, lo, hi))  # noqa: E731
    # layer_norm
    g.case("norm", "layer_norm", [g.C((3, 5)), opt((5,)), opt((5,), -0.5, 0.5)], {"normalized_shape": [5]})
    g.case("norm", "layer_norm", [g.T((2, 4, 3)), opt((4, 3)), opt((4, 3), -0.5, 0.5)],
           {"normalized_shape": [4, 3], "eps": 1e-3})
    g.case("norm", "layer_norm", [g.S((3, 6)), None, None], {"normalized_shape": [6]})
    g.case("norm", "layer_norm", [g.P((2, 3, 4), (2, 0, 1)), opt((4,)), None], {"normalized_shape": [4]})
    g.case("norm", "layer_norm", [g.E((3, 4), (1, 4)), None, opt((4,))], {"normalized_shape": [4]}, "expanded rows")
    g.case("norm", "layer_norm", [g.C((0, 4)), opt((4,)), opt((4,))], {"normalized_shape": [4]}, "size 0")
    g.case("norm", "layer_norm", [g.C((3, 1)), opt((1,)), opt((1,))], {"normalized_shape": [1]}, "one element")
    for dt in (torch.float16, torch.bfloat16):
        g.case("norm", "layer_norm", [g.T((4, 6), dtype=dt), In(g.vals((6,), 0.5, 1.5, dt)),
                                      In(g.vals((6,), -0.5, 0.5, dt))], {"normalized_shape": [6]})
    # group_norm
    g.case("norm", "group_norm", [g.C((2, 6, 3)), opt((6,)), opt((6,), -0.5, 0.5)], {"num_groups": 3})
    g.case("norm", "group_norm", [g.P((2, 4, 3, 3), (0, 3, 1, 2)), opt((4,)), opt((4,), -0.5, 0.5)],
           {"num_groups": 2, "eps": 1e-3}, "channels-last view")
    g.case("norm", "group_norm", [g.T((3, 4, 5)), None, None], {"num_groups": 1})
    g.case("norm", "group_norm", [g.C((2, 4)), opt((4,)), None], {"num_groups": 4}, "(N, C)")
    g.case("norm", "group_norm", [g.C((1, 6, 2, 2), dtype=torch.float16), None, None], {"num_groups": 2})
    # rms_norm (torch 2.x's formula; eps default = float32's machine epsilon)
    g.case("norm", "rms_norm", [g.C((3, 5)), opt((5,))], {"normalized_shape": [5]})
    g.case("norm", "rms_norm", [g.T((2, 4, 3)), opt((4, 3))], {"normalized_shape": [4, 3], "eps": 1e-3})
    g.case("norm", "rms_norm", [g.S((4, 6)), None], {"normalized_shape": [6]})
    g.case("norm", "rms_norm", [g.C((3, 4), lo=-1e-3, hi=1e-3), opt((4,))], {"normalized_shape": [4]},
           "tiny values: eps matters")
    g.case("norm", "rms_norm", [g.P((2, 3, 4), (1, 2, 0)), None], {"normalized_shape": [4]})
    for dt in (torch.float16, torch.bfloat16):
        g.case("norm", "rms_norm", [g.T((3, 8), dtype=dt), In(g.vals((8,), 0.5, 1.5, dt))],
               {"normalized_shape": [8]})
    # batch_norm: training (batch statistics, running stats updated), eval (running stats)
    def stats(C):
        return In(g.vals((C,), -0.5, 0.5), grad=False), In(g.vals((C,), 0.5, 2.0), grad=False)
    rm, rv = stats(3)
    g.case("norm", "batch_norm", [g.C((4, 3, 2, 2)), rm, rv, opt((3,)), opt((3,), -0.5, 0.5)],
           {"training": True, "momentum": 0.1, "eps": 1e-5})
    rm, rv = stats(3)
    g.case("norm", "batch_norm", [g.P((2, 3, 3, 2), (0, 3, 1, 2)), rm, rv, opt((3,)), opt((3,), -0.5, 0.5)],
           {"training": True, "momentum": 0.3, "eps": 1e-3}, "channels-last view")
    rm, rv = stats(4)
    g.case("norm", "batch_norm", [g.T((5, 4)), rm, rv, None, None], {"training": True, "momentum": 0.5, "eps": 1e-5},
           "(N, C)")
    g.case("norm", "batch_norm", [g.C((3, 2, 4)), None, None, opt((2,)), None], {"training": True, "momentum": 0.1,
                                                                              "eps": 1e-5}, "no running stats")
    rm, rv = stats(3)
    g.case("norm", "batch_norm", [g.S((2, 3, 4)), rm, rv, opt((3,)), opt((3,), -0.5, 0.5)],
           {"training": False, "momentum": 0.1, "eps": 1e-5}, "eval")
    rm, rv = stats(3)
    g.case("norm", "batch_norm", [g.P((2, 3, 2, 2), (0, 2, 3, 1)), rm, rv, None, opt((3,))],
           {"training": False, "momentum": 0.1, "eps": 1e-2}, "eval")
    rm, rv = stats(2)
    g.case("norm", "batch_norm", [g.C((1, 2, 3)), rm, rv, opt((2,)), opt((2,))],
           {"training": True, "momentum": 0.1, "eps": 1e-5}, "batch 1, spatial 3")


def conv_cases(g):
    w = lambda shape: g.C(shape, lo=-0.5, hi=0.5)  # noqa: E731
    b = lambda k: g.C((k,), lo=-0.5, hi=0.5)  # noqa: E731
    g.case("conv", "conv2d", [g.C((2, 3, 6, 5)), w((4, 3, 3, 3)), b(4)], {})
    g.case("conv", "conv2d", [g.P((2, 3, 7, 6), (0, 3, 1, 2)), w((4, 3, 3, 2)), b(4)],
           {"stride": [2, 1], "padding": [1, 2]}, "channels-last view")
    g.case("conv", "conv2d", [g.T((1, 2, 8, 7)), w((3, 2, 3, 3)), None], {"dilation": [2, 1], "padding": [2, 1]})
    g.case("conv", "conv2d", [g.C((2, 4, 5, 5)), w((6, 2, 3, 3)), b(6)], {"groups": 2, "stride": 2, "padding": 1})
    g.case("conv", "conv2d", [g.S((1, 4, 5, 4)), w((4, 1, 3, 3)), b(4)], {"groups": 4, "padding": 1}, "depthwise")
    g.case("conv", "conv2d", [g.C((3, 6, 5)), w((2, 3, 1, 1)), b(2)], {}, "unbatched (C, H, W)")
    g.case("conv", "conv2d", [g.C((1, 2, 4, 4)), g.P((3, 2, 2, 2), (0, 2, 3, 1), lo=-0.5, hi=0.5), b(3)],
           {"stride": [1, 2], "dilation": [1, 2], "padding": [0, 1]}, "permuted weight")
    g.case("conv", "conv2d", [g.C((2, 6, 9, 9)), w((6, 2, 3, 3)), None],
           {"stride": 3, "padding": 1, "dilation": 2, "groups": 3})
    g.case("conv", "conv2d", [g.C((0, 2, 4, 4)), w((3, 2, 3, 3)), b(3)], {}, "size-0 batch")
    g.case("conv", "conv2d", [g.C((1, 2, 5, 5), dtype=torch.float16),
                              In(g.vals((3, 2, 3, 3), -0.5, 0.5, torch.float16)),
                              In(g.vals((3,), -0.5, 0.5, torch.float16))], {"padding": 1})
    g.case("conv", "conv2d", [g.C((1, 2, 5, 5), dtype=torch.bfloat16),
                              In(g.vals((3, 2, 3, 3), -0.5, 0.5, torch.bfloat16)), None], {"stride": 2})
    # max pooling (ties planted: the first largest value in the window wins)
    tie = torch.tensor([[[[1.0, 3.0, 3.0, 0.0], [3.0, 2.0, 1.0, 3.0], [0.0, 0.0, -1.0, -1.0], [0.5, 0.5, 0.5, 0.5]]]])
    g.case("pool", "max_pool2d", [In(tie.clone())], {"kernel": [2, 2]}, "ties")
    g.case("pool", "max_pool2d", [In(tie.clone())], {"kernel": [3, 3], "stride": [1, 1], "padding": [1, 1]},
           "ties, overlapping windows")
    pools = [
        ((2, 3, 6, 7), {"kernel": [2, 2]}), ((1, 2, 7, 7), {"kernel": [3, 3], "stride": [2, 2], "ceil_mode": True}),
        ((2, 2, 6, 5), {"kernel": [3, 2], "stride": [2, 1], "padding": [1, 1]}),
        ((1, 3, 8, 8), {"kernel": [2, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [2, 1]}),
        ((1, 2, 5, 5), {"kernel": [2, 2], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True}),
        ((3, 5, 6), {"kernel": [2, 2], "stride": [1, 2]}),
    ]
    for i, (shape, args) in enumerate(pools):
        lay = ["contiguous", "permuted", "transposed", "strided"][i % 4]
        x = g.P(shape, (0, 2, 3, 1)) if lay == "permuted" and len(shape) == 4 else g.L(lay, shape)
        g.case("pool", "max_pool2d", [x], args)
    avg = [
        ((2, 3, 6, 7), {"kernel": [2, 2]}),
        ((1, 2, 7, 7), {"kernel": [3, 3], "stride": [2, 2], "ceil_mode": True}),
        ((1, 2, 7, 7), {"kernel": [3, 3], "stride": [2, 2], "ceil_mode": True, "padding": [1, 1]}),
        ((1, 2, 7, 7), {"kernel": [3, 3], "stride": [2, 2], "ceil_mode": True, "padding": [1, 1],
                        "count_include_pad": False}),
        ((2, 2, 6, 5), {"kernel": [3, 2], "stride": [2, 1], "padding": [1, 1]}),
        ((2, 2, 6, 5), {"kernel": [3, 2], "stride": [2, 1], "padding": [1, 1], "count_include_pad": False}),
        ((1, 2, 5, 5), {"kernel": [2, 2], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True,
                        "count_include_pad": True}),
        ((3, 5, 6), {"kernel": [2, 3], "stride": [1, 2], "padding": [1, 1], "count_include_pad": False}),
    ]
    for i, (shape, args) in enumerate(avg):
        lay = ["contiguous", "permuted", "transposed", "strided"][i % 4]
        x = g.P(shape, (0, 2, 3, 1)) if lay == "permuted" and len(shape) == 4 else g.L(lay, shape)
        g.case("pool", "avg_pool2d", [x], args)
    for i, (shape, out) in enumerate([((2, 3, 7, 5), [3, 2]), ((1, 2, 6, 6), [1, 1]), ((1, 2, 5, 7), [4, 3]),
                                      ((3, 4, 5), [2, 3]), ((1, 1, 3, 3), [5, 4])]):
        lay = ["contiguous", "permuted", "transposed", "strided", "contiguous"][i]
        x = g.P(shape, (0, 2, 3, 1)) if lay == "permuted" else g.L(lay, shape)
        g.case("pool", "adaptive_avg_pool2d", [x], {"output_size": out})
    g.case("pool", "max_pool2d", [g.T((1, 2, 4, 6), dtype=torch.float16)], {"kernel": [2, 2]})
    g.case("pool", "avg_pool2d", [g.C((1, 2, 4, 6), dtype=torch.bfloat16)], {"kernel": [2, 3]})


def matmul_cases(g):
    mm = [
        ("1-D . 1-D", g.C((5,)), g.S((5,))),
        ("2-D @ 1-D", g.T((3, 4)), g.C((4,))),
        ("1-D @ 2-D", g.C((4,)), g.T((4, 3))),
        ("2-D @ 2-D transposed", g.T((3, 5)), g.T((5, 2))),
        ("batch broadcast", g.C((2, 1, 3, 4)), g.C((3, 4, 2))),
        ("batch broadcast, expanded", g.E((2, 3, 4), (1, 3, 4)), g.P((2, 4, 3), (1, 2, 0))),
        ("3-D @ 1-D", g.T((2, 3, 4)), g.C((4,))),
        ("1-D @ 3-D", g.C((3,)), g.S((2, 3, 4))),
        ("K = 0", g.C((3, 0)), g.C((0, 4))),
        ("M = 0", g.C((2, 0, 3)), g.C((3, 4))),
        ("strided", g.S((4, 3), dim=0), g.S((3, 5))),
    ]
    for name, a, b in mm:
        g.case("matmul", "matmul", [a, b], {}, name)
    for dt in (torch.float16, torch.bfloat16):
        g.case("matmul", "matmul", [g.T((4, 8), dtype=dt), g.C((2, 8, 3), dtype=dt)], {}, "batch broadcast")
    g.case("matmul", "linear", [g.C((3, 4)), g.C((5, 4)), g.C((5,))], {})
    g.case("matmul", "linear", [g.P((2, 3, 4), (1, 0, 2)), g.T((5, 4)), None], {}, "no bias")
    g.case("matmul", "linear", [g.C((4,)), g.C((3, 4)), g.C((3,))], {}, "1-D input")
    g.case("matmul", "linear", [g.S((2, 2, 3)), g.C((2, 3)), g.E((2,), (1,))], {}, "expanded bias")
    g.case("matmul", "linear", [g.C((0, 3)), g.C((2, 3)), g.C((2,))], {}, "size-0 batch")
    g.case("matmul", "linear", [g.C((3, 4), dtype=torch.bfloat16), g.C((2, 4), dtype=torch.bfloat16),
                                g.C((2,), dtype=torch.bfloat16)], {})


INF, NAN = float("inf"), float("nan")


def edge_cases(g):
    """Inputs at the edges of the ops' contracts: NaN, poles, infinities, integer and bool operands,
    mixed dtypes, high ranks, size-0 pieces; and grids over the pools' options."""
    # unary: NaN, poles, odd parameters, high rank. At a NaN input PyTorch 1.13's gradients of elu,
    # hardtanh, relu6 and hardswish depend on the kernel path (vectorized: 0 or NaN; scalar: g),
    # and abs's is sign(NaN) = 0, which frugal does not follow (NaN stays NaN:
    # tensor/ops/unary_math.h) and PyTorch counts as a bug of its own (pytorch/pytorch#41245):
    # those five are checked on values only there.
    for op, args in [("relu", {}), ("leaky_relu", {"negative_slope": 0.2}), ("elu", {}), ("hardtanh", {}),
                     ("relu6", {}), ("hardsigmoid", {}), ("hardswish", {}), ("clamp", {"lo": -0.5, "hi": 0.5}),
                     ("gelu", {"approximate": "none"}), ("silu", {}), ("softplus", {}), ("mish", {}), ("abs", {}),
                     ("tanh", {}), ("sigmoid", {})]:
        grad = op not in ("elu", "hardtanh", "relu6", "hardswish", "abs")
        g.case("unary", op, [g.C((2, 4), special=(NAN, 0.0, NAN), grad=grad)], args, "NaN")
    for op, sp in [("log", (0.0,)), ("sqrt", (0.0,)), ("rsqrt", (0.0,)), ("reciprocal", (0.0, -0.0)),
                   ("log1p", (-1.0,))]:
        g.case("unary", op, [g.C((2, 3), lo=0.1, hi=2, special=sp)], {}, "pole")
    g.case("unary", "pow_scalar", [g.C((2, 3), special=(0.0,))], {"exponent": 0.5}, "negative base: NaN")
    g.case("unary", "pow_scalar", [g.C((2, 3), special=(0.0,))], {"exponent": -2.0}, "0 ^ -2")
    g.case("unary", "leaky_relu", [g.T((3, 4), special=(0.0,))], {"negative_slope": -0.5})
    g.case("unary", "leaky_relu", [g.Sel((3, 4), special=(0.0,))], {"negative_slope": 2.0})
    g.case("unary", "clamp", [g.C((3, 4), special=(0.5, 0.5))], {"lo": 0.5, "hi": 0.5}, "lo = hi")
    g.case("unary", "hardtanh", [g.C((3, 4), special=(0.5,))], {"min_val": 0.5, "max_val": 0.5}, "min = max")
    g.case("unary", "exp", [g.C((2, 3), special=(-INF, INF))], {}, "infinities")
    g.case("unary", "gelu", [g.P((2, 1, 3, 1, 2, 2), (5, 4, 3, 2, 1, 0))], {"approximate": "tanh"}, "6-D")
    g.case("unary", "sigmoid", [g.Sel((4, 3))], {})

    # binary: division by zero, NaN, integer/bool operands and promotion, high rank
    a, b = g.vals((2, 4), special=(0.0, 1.0, -1.0)), g.vals((2, 4), special=(0.0, 0.0, 0.0))
    g.case("binary", "div", [In(a), In(b)], {}, "x / 0")
    g.case("binary", "maximum", [g.C((2, 4), special=(NAN,)), g.C((2, 4), special=(0.0, NAN))], {}, "NaN")
    g.case("binary", "minimum", [g.C((2, 4), special=(NAN,)), g.C((2, 4), special=(0.0, NAN))], {}, "NaN")
    g.case("binary", "add", [g.I(g.ints((3,), -5, 5)), g.C((2, 3))], {}, "int64 + float32")
    g.case("binary", "div", [g.I(g.ints((2, 3), -5, 5)), g.I(g.ints((2, 3), 1, 4))], {}, "int64 / int64")
    g.case("binary", "mul_scalar", [g.I(g.ints((2, 3), -5, 5))], {"s": 2.5}, "int64 * 2.5")
    # (an integral C++ double counts as an integer scalar: Note [Binary type promotion] in tensor/ops/binary.h)
    g.case("binary", "add_scalar", [g.I(g.ints((2, 3), -5, 5))], {"s": 3}, "int64 + 3")
    g.case("binary", "mul", [g.I(torch.rand((2, 3), generator=g.rng) > 0.5), g.C((3,))], {}, "bool * float32")
    g.case("binary", "where", [g.I(torch.rand((2, 3), generator=g.rng) > 0.5), g.C((2, 3)),
                               In(torch.tensor(2.0, dtype=torch.float64))], {}, "0-d float64 other")
    g.case("binary", "pow", [g.C((2, 3), lo=0.5, hi=2), g.I(torch.tensor([1, 2, 3]))], {}, "int64 exponent")
    g.case("binary", "sub", [g.P((2, 1, 3, 1, 4), (4, 3, 2, 1, 0)), g.C((5, 1, 1, 4))], {"alpha": 1.5}, "5-D broadcast")
    g.case("binary", "mul", [g.Sel((3, 4)), g.Sel((4,))], {}, "selected views")

    # reductions: NaN, integer and bool inputs, corrections past N, high ranks, infinities, all ties
    g.case("reduce", "amax", [In(g.vals((3, 4), special=(NAN,)), grad=False)], {"dims": [1], "keepdim": False}, "NaN")
    g.case("reduce", "max_dim", [In(g.vals((3, 4), special=(NAN,)), grad=False)], {"dim": 1, "keepdim": False}, "NaN")
    g.case("reduce", "argmin", [g.I(g.vals((3, 4), special=(NAN,)))], {"dim": 1, "keepdim": False}, "NaN")
    g.case("reduce", "sum", [g.I(g.ints((3, 4), -5, 5))], {"dims": [1], "keepdim": False}, "int64")
    g.case("reduce", "sum", [g.I(torch.rand((3, 4), generator=g.rng) > 0.5)], {"dims": [0], "keepdim": True}, "bool")
    g.case("reduce", "var", [g.C((1, 3))], {"dims": [0], "correction": 2, "keepdim": False}, "N - correction < 0")
    # (not a 0-d input with correction 1: PyTorch 1.13's gradient there is inf, or an error for a (1,) input)
    g.case("reduce", "var", [g.C(())], {"dims": [], "correction": 0, "keepdim": False}, "0-d, correction 0")
    g.case("reduce", "mean", [g.P((2, 3, 1, 2, 2, 3), (5, 0, 4, 1, 3, 2))], {"dims": [0, 2, -1], "keepdim": True},
           "6-D")
    g.case("reduce", "sum", [g.C((2, 1, 2, 1, 2, 1, 2, 3))], {"dims": [1, 3, 5, 7], "keepdim": False}, "8-D")
    g.case("reduce", "var", [g.Sel((3, 5))], {"dims": [1], "correction": 1, "keepdim": False})
    g.case("reduce", "logsumexp", [g.C((3, 4), special=(-INF, -INF))], {"dims": [1], "keepdim": False}, "some -inf")
    g.case("reduce", "logsumexp", [g.C((3, 4), lo=-200, hi=200)], {"dims": [0], "keepdim": False}, "large")
    g.case("reduce", "max_dim", [g.E((3, 4), (1, 4))], {"dim": 0, "keepdim": False}, "expanded: all tied")
    g.case("reduce", "amax", [g.E((3, 4), (3, 1))], {"dims": [1], "keepdim": False}, "expanded: all tied")
    g.case("reduce", "argmax", [g.I(g.vals((1, 4)), [("expand", 3, 4)], "expanded")], {"dim": 1, "keepdim": True},
           "expanded")

    # softmax: masked (-inf) entries, size-1 dims, high rank; cumsum of integers and bools
    m = g.vals((3, 5), -3, 3)
    m[0, 1] = m[0, 3] = m[2, 0] = -INF
    for op in ("softmax", "log_softmax"):
        g.case("softmax", op, [In(m.clone())], {"dim": 1}, "-inf entries")
        g.case("softmax", op, [In(m.t().contiguous(), [("transpose", 0, 1)], layout="transposed")], {"dim": 1},
               "-inf entries")
    g.case("softmax", "softmax", [g.C((4, 1))], {"dim": 1}, "size-1 dim")
    g.case("softmax", "log_softmax", [g.P((2, 3, 2, 2, 3), (4, 3, 2, 1, 0))], {"dim": 2}, "5-D")
    g.case("softmax", "softmax", [g.Sel((3, 4))], {"dim": 0})
    g.case("softmax", "cumsum", [g.I(torch.rand((3, 4), generator=g.rng) > 0.5)], {"dim": 1}, "bool")
    g.case("softmax", "cumsum", [g.I(g.ints((3, 4), -5, 5))], {"dim": 0}, "int64")
    g.case("softmax", "cumsum", [g.T((4, 5), dtype=torch.bfloat16)], {"dim": 1})

    # shape: widest reflect pad, crops to size 0, size-0 inputs, expanded inputs, mixed-dtype cat
    g.case("shape", "pad", [g.C((2, 6))], {"pad": [5, 5], "mode": "reflect"}, "pad = size - 1")
    g.case("shape", "pad", [g.C((3, 4))], {"pad": [-2, -2], "mode": "constant", "value": 0.0}, "cropped to size 0")
    g.case("shape", "pad", [g.C((0, 4))], {"pad": [1, 1], "mode": "constant", "value": 2.0}, "size-0 input")
    g.case("shape", "pad", [g.S((2, 3, 2))], {"pad": [3, 3, 2, 4], "mode": "replicate"}, "wider than the input")
    g.case("shape", "pad", [g.E((2, 3, 4), (2, 1, 4))], {"pad": [1, 1, 2, 2], "mode": "reflect"}, "expanded")
    g.case("shape", "flip", [g.C((0, 3))], {"dims": [0, 1]}, "size 0")
    g.case("shape", "tril", [g.C((0, 3))], {"diagonal": 0}, "size 0")
    g.case("shape", "triu", [g.E((2, 3, 3), (1, 3, 3))], {"diagonal": -1}, "expanded batch")
    g.case("shape", "repeat", [g.E((2, 3), (1, 3))], {"repeats": [1, 2, 2]}, "expanded")
    g.case("shape", "repeat", [g.C(())], {"repeats": [2, 3]}, "0-d")
    g.case("shape", "cat", [g.C((2, 0)), g.C((2, 0))], {"dim": 1}, "all size 0")
    g.case("shape", "stack", [g.C((0, 2)), g.T((0, 2))], {"dim": 1}, "size 0")
    g.case("shape", "cat", [g.C((2, 3)), In(g.vals((1, 3), dtype=torch.float64))], {"dim": 0}, "float32 and float64")
    g.case("shape", "cat", [g.Sel((2, 3)), g.Sel((2, 2))], {"dim": -1})

    # index: empty and 0-d indices, expanded self and src
    g.case("index", "gather", [g.C((3, 4)), g.I(torch.zeros((0, 4), dtype=torch.int64))], {"dim": 0}, "empty index")
    g.case("index", "index_select", [g.C(()), g.I(torch.tensor([0]))], {"dim": 0}, "0-d x")
    g.case("index", "embedding", [g.C((5, 3)), g.I(torch.zeros((2, 0), dtype=torch.int64))], {}, "no indices")
    g.case("index", "scatter_add", [g.E((3, 4), (1, 4)), g.I(g.ints((3, 2), 0, 4)), g.C((3, 2))], {"dim": 1},
           "expanded self")
    g.case("index", "index_add", [g.C((4, 3)), g.I(torch.tensor([1, 1, 1])), g.E((3, 3), (1, 3))], {"dim": 0},
           "expanded src, repeated index")
    g.case("index", "one_hot", [g.I(torch.tensor(2))], {"num_classes": 4}, "0-d")
    g.case("index", "gather", [g.Sel((3, 4)), g.I(g.ints((3, 4), 0, 4))], {"dim": -1})

    # losses: spatial targets with weights, 16-bit logits, 0-d and size-0 inputs
    for r in ("none", "mean", "sum"):
        g.case("loss", "cross_entropy", [g.P((2, 3, 2, 2), (0, 2, 3, 1), lo=-3, hi=3),
                                         g.I(torch.tensor([[[0, 2], [1, -100]], [[2, 2], [0, 1]]])),
                                         In(g.vals((3,), 0.2, 2.0), grad=False)],
               {"reduction": r, "label_smoothing": 0.1}, "(N, C, d1, d2), weights")
    g.case("loss", "cross_entropy", [g.T((4, 5), lo=-3, hi=3, dtype=torch.bfloat16), g.I(torch.tensor([0, 4, 2, 2])),
                                     None], {"reduction": "mean"})
    g.case("loss", "cross_entropy", [g.C((4, 5), lo=-3, hi=3, dtype=torch.float16), g.I(torch.tensor([0, 4, 2, 2])),
                                     None], {"reduction": "sum", "label_smoothing": 0.2})
    g.case("loss", "nll_loss", [g.C((3, 4)), g.I(torch.tensor([1, 1, 2])),
                                In(torch.tensor([1.0, 0.0, 0.0, 2.0]), grad=False)],
           {"reduction": "mean"}, "zero total weight: NaN")
    g.case("loss", "mse_loss", [g.C(()), g.C(())], {"reduction": "mean"}, "0-d")
    g.case("loss", "mse_loss", [g.C((0, 3)), g.C((0, 3))], {"reduction": "mean"}, "size 0: NaN")
    g.case("loss", "huber_loss", [g.C((0, 3)), g.C((0, 3))], {"reduction": "sum"}, "size 0")
    g.case("loss", "kl_div", [g.C((), lo=-3, hi=0), g.C((), lo=0.1, hi=1)], {"reduction": "batchmean"}, "0-d")
    g.case("loss", "binary_cross_entropy", [g.C((), lo=0.1, hi=0.9), g.C((), lo=0, hi=1), None], {"reduction": "mean"},
           "0-d")
    g.case("loss", "smooth_l1_loss", [g.Sel((3, 4)), g.C((3, 4))], {"reduction": "mean", "beta": 2.0})
    g.case("loss", "bce_with_logits", [g.C((2, 3), lo=-3, hi=3, dtype=torch.bfloat16),
                                       g.C((2, 3), lo=0, hi=1, dtype=torch.bfloat16), None, None],
           {"reduction": "mean"})

    # norms: 1-D inputs, every dim normalized, 16-bit x with float32 statistics, (N, C, L) views
    g.case("norm", "layer_norm", [g.S((5,)), g.C((5,)), g.C((5,))], {"normalized_shape": [5]}, "1-D")
    g.case("norm", "layer_norm", [g.P((2, 3, 4), (1, 2, 0)), None, None], {"normalized_shape": [2, 3, 4]}, "every dim")
    g.case("norm", "rms_norm", [g.C((5,)), None], {"normalized_shape": [5]}, "1-D")
    g.case("norm", "rms_norm", [g.C((0, 3)), g.C((3,))], {"normalized_shape": [3]}, "size 0")
    g.case("norm", "group_norm", [g.T((2, 4, 5), a=1, b=2), g.C((4,)), g.C((4,))], {"num_groups": 2}, "(N, C, L) view")
    g.case("norm", "group_norm", [g.C((2, 3, 2, 2)), g.C((3,)), None], {"num_groups": 3})
    g.case("norm", "batch_norm", [g.T((3, 2, 4), a=1, b=2), In(g.vals((2,)), grad=False),
                                  In(g.vals((2,), 0.5, 2), grad=False), g.C((2,)), g.C((2,))],
           {"training": True, "momentum": 0.2, "eps": 1e-5}, "(N, C, L) view")
    for dt in (torch.float16, torch.bfloat16):
        g.case("norm", "batch_norm", [g.C((4, 3, 2), dtype=dt), In(g.vals((3,)), grad=False),
                                      In(g.vals((3,), 0.5, 2), grad=False), g.C((3,)), g.C((3,))],
               {"training": True, "momentum": 0.1, "eps": 1e-5}, "float32 statistics")
        g.case("norm", "batch_norm", [g.C((4, 3, 2), dtype=dt), In(g.vals((3,)), grad=False),
                                      In(g.vals((3,), 0.5, 2), grad=False), g.C((3,)), g.C((3,))],
               {"training": False, "momentum": 0.1, "eps": 1e-5}, "float32 statistics, eval")

    # conv: padding past the kernel, stride past the kernel, a channel multiplier
    w = lambda shape: g.C(shape, lo=-0.5, hi=0.5)  # noqa: E731
    g.case("conv", "conv2d", [g.C((1, 2, 4, 4)), w((3, 2, 2, 2)), g.C((3,))], {"padding": 3}, "padding > kernel")
    g.case("conv", "conv2d", [g.T((1, 2, 8, 7)), w((3, 2, 2, 2)), None], {"stride": 3}, "stride > kernel")
    g.case("conv", "conv2d", [g.C((1, 3, 5, 5)), w((6, 1, 3, 3)), g.C((6,))], {"groups": 3, "padding": [0, 1]},
           "channel multiplier 2")
    g.case("conv", "conv2d", [g.C((1, 2, 2, 2)), w((2, 2, 3, 3)), None], {"padding": 1, "stride": 2}, "1x1 output")
    g.case("conv", "conv2d", [g.Sel((2, 5, 4)), w((2, 2, 3, 2)), None], {}, "selected unbatched input")

    # pooling: every combination of ceil_mode, padding and count_include_pad / dilation
    i = 0
    for ceil in (False, True):
        for pad in (0, 1):
            for cip in (True, False):
                x = g.L(["contiguous", "transposed", "strided", "selected"][i % 4], (1, 2, 7, 6))
                g.case("pool", "avg_pool2d", [x], {"kernel": [3, 3], "stride": [2, 2], "padding": [pad, pad],
                                                   "ceil_mode": ceil, "count_include_pad": cip})
                i += 1
            for dil in (1, 2):
                x = g.L(["contiguous", "transposed", "strided", "selected"][i % 4], (1, 2, 7, 6))
                g.case("pool", "max_pool2d", [x], {"kernel": [3, 2], "stride": [2, 2], "padding": [pad, pad],
                                                   "dilation": [dil, dil], "ceil_mode": ceil})
                i += 1
    g.case("pool", "adaptive_avg_pool2d", [g.C((1, 1, 1, 1))], {"output_size": [2, 3]}, "1x1 input")
    g.case("pool", "max_pool2d", [g.C((1, 1, 4, 4), special=(NAN,))], {"kernel": [2, 2]}, "NaN")

    # matmul: both operands broadcast, K = 0 dot product, 4-D @ transposed 2-D
    g.case("matmul", "matmul", [g.C((2, 1, 3, 4)), g.C((1, 5, 4, 2))], {}, "both broadcast")
    g.case("matmul", "matmul", [g.C((0,)), g.C((0,))], {}, "empty dot")
    g.case("matmul", "matmul", [g.P((2, 2, 3, 4), (3, 2, 1, 0)), g.T((4, 3))], {}, "4-D @ transposed")
    g.case("matmul", "matmul", [g.Sel((3, 4)), g.Sel((4, 2))], {}, "selected views")
    g.case("matmul", "linear", [g.C((2, 3), dtype=torch.float16), g.T((4, 3), dtype=torch.float16), None], {})


def view_cases(g):
    """Stride-0 and permuted operands where ops read along the odd stride, views of the targets,
    weights and indices, and 16-bit inputs of more ops."""
    # stride 0 along the dim an op reduces, scans or contracts
    g.case("softmax", "softmax", [g.E((3, 4), (3, 1))], {"dim": 1}, "expanded along dim")
    g.case("softmax", "log_softmax", [g.E((3, 4), (1, 4))], {"dim": 0}, "expanded along dim")
    g.case("softmax", "cumsum", [g.E((4, 3), (1, 3))], {"dim": 0}, "expanded along dim")
    g.case("matmul", "matmul", [g.E((3, 4), (3, 1)), g.C((4, 2))], {}, "expanded along K")
    g.case("matmul", "matmul", [g.C((2, 3)), g.E((3, 4), (1, 4))], {}, "expanded along K")
    g.case("index", "gather", [g.T((3, 5)), g.I(g.ints((1, 4), 0, 5), [("expand", 3, 4)], "expanded")], {"dim": 1},
           "expanded index")
    g.case("index", "scatter_add", [g.C((3, 5)), g.I(g.ints((4, 3), 0, 5), [("transpose", 0, 1)], "transposed"),
                                    g.T((3, 4))], {"dim": 1}, "transposed index and src")
    g.case("binary", "where", [g.I(torch.rand((1, 4), generator=g.rng) > 0.5, [("expand", 3, 4)], "expanded"),
                               g.Sel((3, 4)), g.T((3, 4))], {}, "expanded cond")
    g.case("binary", "masked_fill", [g.C(()), g.I(torch.tensor(True))], {"value": 3.5}, "0-d")
    g.case("reduce", "argmax", [g.C(())], {"dim": 0, "keepdim": False}, "0-d")
    g.case("reduce", "mean", [g.Sel((1, 1))], {"dims": [0, 1], "keepdim": True}, "one element")
    # weights, biases, targets and indices as views
    g.case("loss", "cross_entropy", [g.C((3, 4, 2), lo=-3, hi=3), g.I(torch.tensor([[0, 3, 1], [2, 2, -100]]),
                                                                   [("transpose", 0, 1)], "transposed"), None],
           {"reduction": "mean"}, "transposed target (N, d)")
    g.case("loss", "cross_entropy", [g.C((4,), lo=-3, hi=3),
                                     In(F.softmax(g.vals((4,), dtype=torch.float64), 0).float()), None],
           {"reduction": "sum"}, "unbatched probabilities")
    # every target ignored: the loss is NaN (0 / 0), the gradient 0 (ignored targets take no part)
    g.case("loss", "nll_loss", [g.C((4,)), g.I(torch.tensor(-100)), In(g.vals((4,), 0.2, 2), grad=False)],
           {"reduction": "mean"}, "unbatched, ignored: NaN")
    g.case("loss", "nll_loss", [g.T((3, 4)), g.I(torch.tensor([-100, -100, -100])), None], {"reduction": "mean"},
           "all ignored: NaN")
    g.case("loss", "cross_entropy", [g.C((2, 3), lo=-3, hi=3), g.I(torch.tensor([1, 1])),
                                     In(torch.tensor([1.0, 2.0, 3.0]), grad=False)],
           {"reduction": "mean", "ignore_index": 1}, "weights, all ignored: NaN")
    g.case("loss", "cross_entropy", [g.C((2, 3), lo=-3, hi=3), g.I(torch.tensor([-100, -100])),
                                     In(torch.tensor([1.0, 2.0, 3.0]), grad=False)],
           {"reduction": "mean", "label_smoothing": 0.1}, "weights, smoothing, all ignored: NaN")
    g.case("loss", "bce_with_logits", [g.C((3, 4), lo=-3, hi=3), g.C((3, 4), lo=0, hi=1), None,
                                       In(g.vals((3, 1), 0.2, 3), grad=False)], {"reduction": "mean"},
           "pos_weight (3, 1)")
    g.case("loss", "binary_cross_entropy", [g.S((3, 4), lo=0.05, hi=0.95), g.T((3, 4), lo=0, hi=1),
                                            In(g.vals((3, 1), 0.2, 2), grad=False)], {"reduction": "sum"},
           "weight (3, 1)")
    g.case("loss", "kl_div", [g.S((2, 4), lo=-3, hi=0), g.E((2, 4), (1, 4), lo=-3, hi=0)],
           {"reduction": "sum", "log_target": True}, "expanded target")
    g.case("loss", "huber_loss", [g.C((3, 4)), g.T((3, 4))], {"reduction": "mean", "delta": 5.0})
    g.case("loss", "smooth_l1_loss", [g.C((3, 4)), g.T((3, 4))], {"reduction": "sum", "beta": 1e-3})
    g.case("norm", "layer_norm", [g.C((2, 4, 3)), g.T((4, 3), lo=0.5, hi=1.5), g.S((4, 3), lo=-0.5, hi=0.5)],
           {"normalized_shape": [4, 3]}, "transposed weight, strided bias")
    g.case("norm", "rms_norm", [g.C((2, 4, 3)), g.T((4, 3), lo=0.5, hi=1.5)],
           {"normalized_shape": [4, 3]}, "transposed weight")
    g.case("conv", "conv2d", [g.P((1, 3, 5, 6), (0, 2, 3, 1)), g.P((4, 3, 3, 3), (0, 2, 3, 1), lo=-0.5, hi=0.5),
                              g.S((4,))], {"padding": 1}, "channels-last input and weight, strided bias")
    g.case("matmul", "linear", [g.C((3, 4)), g.S((5, 4)), g.S((5,))], {}, "strided weight and bias")
    g.case("index", "embedding", [g.S((6, 3)), g.I(torch.tensor([[1, 4], [4, 0]]))], {}, "strided weight")
    # joins and shapes on odd layouts
    g.case("shape", "chunk", [g.C((2, 3))], {"chunks": 5, "dim": 0}, "more chunks than rows")
    g.case("shape", "split_with_sizes", [g.T((4, 5))], {"sizes": [2, 3], "dim": -1})
    g.case("shape", "stack", [g.E((2, 3), (1, 3)), g.Sel((2, 3))], {"dim": 2})
    g.case("shape", "flip", [g.P((2, 3, 4), (2, 0, 1))], {"dims": [-1, 0]})
    g.case("shape", "tril", [g.P((2, 3, 4), (1, 2, 0))], {"diagonal": 1}, "batched, permuted")
    # 16-bit inputs of more ops
    for dt in (torch.float16, torch.bfloat16):
        for op, args, lo, hi in [("gelu", {"approximate": "tanh"}, -4, 4), ("mish", {}, -4, 4), ("softplus", {}, -4, 4),
                                 ("elu", {}, -3, 2), ("sqrt", {}, 0.1, 4), ("rsqrt", {}, 0.1, 4)]:
            g.case("unary", op, [g.S((3, 5), lo=lo, hi=hi, dtype=dt)], args)
        g.case("loss", "mse_loss", [g.C((3, 4), dtype=dt), g.T((3, 4), dtype=dt)], {"reduction": "mean"})
        g.case("norm", "group_norm", [g.C((2, 4, 3), dtype=dt), In(g.vals((4,), 0.5, 1.5, dt)), None],
               {"num_groups": 2})
        g.case("pool", "adaptive_avg_pool2d", [g.T((1, 2, 5, 6), dtype=dt)], {"output_size": [2, 4]})
        g.case("index", "embedding", [g.C((5, 3), dtype=dt), g.I(torch.tensor([0, 2, 2, 4]))], {})
        g.case("index", "index_add", [g.C((3, 2), dtype=dt), g.I(torch.tensor([0, 0, 0, 2, 0])), g.C((5, 2), dtype=dt)],
               {"dim": 0}, "repeated index")
        g.case("index", "gather", [g.T((3, 4), dtype=dt), g.I(g.ints((3, 2), 0, 4))], {"dim": 1})
        g.case("reduce", "sum", [g.C((4, 64), lo=0.5, hi=1.5, dtype=dt)], {"dims": [1], "keepdim": False}, "long rows")
        g.case("softmax", "cumsum", [g.C((2, 64), lo=0.5, hi=1.5, dtype=dt)], {"dim": 1}, "long rows")
        g.case("binary", "where", [g.I(torch.rand((2, 3), generator=g.rng) > 0.5), g.C((2, 3), dtype=dt), g.C((3,))],
               {}, "16-bit and float32")


def fused_cases(g):
    """The fused and functional ops against PyTorch's composition of the unfused ones: attention
    and masked_softmax (family softmax), gelu_mlp and linear_cross_entropy (matmul),
    batch_norm_relu and batch_norm_add_relu (norm)."""
    def bool_mask(shape, p=0.4):  # no row without a key: frugal's zeros there are not PyTorch's NaN
        m = torch.rand(shape, generator=g.rng) > p
        m[..., 0] |= ~m.any(-1)
        return m

    def float_mask(shape, grad=True):  # added; -inf at keys 1, 4, ... of every row, never all of a row
        m = g.vals(shape, -1.0, 1.0)
        m[..., 1::3] = -INF
        return In(m, grad=grad)

    # scaled_dot_product_attention: (B, H, L, E) with L != S, heads split from (B, L, H, E), masks
    B, H, L, S, E = 2, 2, 3, 5, 4
    qkv = lambda lay, L=L, S=S, E=E, Ev=E, B=B, H=H, **kw: [g.L(lay, (B, H, L, E), **kw),  # noqa: E731
                                                             g.L(lay, (B, H, S, E), **kw),
                                                             g.L(lay, (B, H, S, Ev), **kw)]
    heads = lambda shape, **kw: g.T(shape, a=1, b=2, **kw)  # noqa: E731  (B, L, H, E) stored
    g.case("softmax", "sdpa", qkv("contiguous") + [None], {}, "L != S")
    g.case("softmax", "sdpa", [heads((B, H, L, E)), heads((B, H, S, E)), heads((B, H, S, E)), None], {},
           "heads split from (B, L, H, E)")
    g.case("softmax", "sdpa", qkv("contiguous") + [g.I(bool_mask((L, S)))], {}, "bool mask (L, S)")
    g.case("softmax", "sdpa", [heads((B, H, L, E)), heads((B, H, S, E)), heads((B, H, S, E)),
                               g.I(bool_mask((B, 1, L, S)))], {}, "bool mask (B, 1, L, S)")
    g.case("softmax", "sdpa", qkv("strided") + [g.I(bool_mask((L, S)).t().contiguous(), [("transpose", 0, 1)],
                                                    "transposed")], {}, "transposed bool mask")
    g.case("softmax", "sdpa", qkv("permuted") + [float_mask((L, S))], {}, "float mask (L, S), -inf keys")
    fm = g.vals((B, 1, L, S), -1.0, 1.0)
    g.case("softmax", "sdpa", qkv("contiguous") + [In(fm, [("expand", B, H, L, S)], True, "expanded")], {},
           "float mask (B, 1, L, S) expanded over heads")
    g.case("softmax", "sdpa", qkv("contiguous") + [None], {"is_causal": True}, "causal, L < S")
    g.case("softmax", "sdpa", qkv("transposed", L=5, S=3) + [None], {"is_causal": True}, "causal, L > S")
    g.case("softmax", "sdpa", [heads((B, H, 4, E)), heads((B, H, 4, E)), heads((B, H, 4, E)), None],
           {"is_causal": True, "scale": 0.5}, "causal, L = S, heads split")
    g.case("softmax", "sdpa", qkv("selected", Ev=6) + [None], {"scale": 0.3}, "scale, Ev != E")
    g.case("softmax", "sdpa", [g.C((2, 3, 4)), g.S((2, 5, 4)), g.T((2, 5, 3)), g.I(bool_mask((3, 5)))], {},
           "3-D (N, L, E)")
    g.case("softmax", "sdpa", [g.C((3, 4)), g.C((5, 4)), g.C((5, 2)), None], {"is_causal": True}, "2-D, causal")
    g.case("softmax", "sdpa", qkv("contiguous", L=0, B=1) + [None], {}, "L = 0")
    g.case("softmax", "sdpa", qkv("contiguous", S=0, B=1, Ev=3) + [None], {}, "S = 0: zeros")
    for dt in (torch.float16, torch.bfloat16):  # E = 8: CUDA's fused kernels take these
        q, k, v = (heads((1, 2, n, 8), dtype=dt, lo=-1, hi=1) for n in (4, 6, 6))
        g.case("softmax", "sdpa", [q, k, v, None], {"is_causal": True}, "causal, heads split")
        q, k, v = (g.C((1, 2, n, 8), dtype=dt, lo=-1, hi=1) for n in (4, 6, 6))
        mask = g.I(bool_mask((1, 1, 4, 6))) if dt == torch.float16 else \
            In(g.vals((1, 1, 4, 6), -1, 1, dt), grad=False)
        g.case("softmax", "sdpa", [q, k, v, mask], {}, "bool mask" if dt == torch.float16 else "float mask")

    # masked_softmax: softmax(scale * x + mask) along the last dim
    sh = (2, 3, 4, 5)
    g.case("softmax", "masked_softmax", [g.C(sh, lo=-3, hi=3), g.I(bool_mask((4, 5)))], {"scale": 0.5},
           "bool mask (L, S)")
    g.case("softmax", "masked_softmax", [g.T(sh, lo=-3, hi=3), g.I(bool_mask((2, 1, 4, 5)))], {},
           "bool mask (B, 1, L, S)")
    g.case("softmax", "masked_softmax", [g.S(sh, lo=-3, hi=3), float_mask((4, 5))], {"scale": 0.25},
           "float mask, -inf keys")
    g.case("softmax", "masked_softmax", [g.P(sh, (3, 1, 0, 2), lo=-3, hi=3), In(g.vals((5,), -1, 1))], {},
           "float mask (S)")
    g.case("softmax", "masked_softmax", [g.C((2, 3, 4, 6), lo=-3, hi=3), None], {"is_causal": True, "scale": 0.5},
           "causal, L < S")
    g.case("softmax", "masked_softmax", [g.T((2, 6, 4), lo=-3, hi=3), None], {"is_causal": True}, "causal, L > S")
    g.case("softmax", "masked_softmax", [g.Sel((3, 5), lo=-3, hi=3), None], {"scale": 2.0}, "no mask")
    m = bool_mask((4, 5))
    m[1] = False
    m[2, 0] = False
    g.case("softmax", "masked_softmax", [g.C((2, 4, 5), lo=-3, hi=3), g.I(m)], {"is_causal": True},
           "causal and bool mask, rows with no key: zeros")
    fm = g.vals((4, 5), -1.0, 1.0)
    fm[3] = -INF
    g.case("softmax", "masked_softmax", [g.C((4, 5), lo=-3, hi=3), In(fm)], {}, "a row of -inf: zeros")
    g.case("softmax", "masked_softmax", [g.S((6,), lo=-3, hi=3), g.I(bool_mask((6,)))], {"scale": 0.7}, "1-D")
    g.case("softmax", "masked_softmax", [g.C((2, 0, 5)), g.I(bool_mask((0, 5)))], {}, "size 0")
    g.case("softmax", "masked_softmax", [g.C((3, 0)), None], {"is_causal": True}, "no keys")
    for dt in (torch.float16, torch.bfloat16):
        g.case("softmax", "masked_softmax", [g.T((2, 4, 6), lo=-3, hi=3, dtype=dt), g.I(bool_mask((4, 6)))],
               {"scale": 0.5})

    # gelu_mlp: linear -> gelu(tanh) -> linear
    w = lambda shape, **kw: g.C(shape, lo=-0.7, hi=0.7, **kw)  # noqa: E731
    g.case("matmul", "gelu_mlp", [g.C((2, 3, 4)), w((6, 4)), w((6,)), w((5, 6)), w((5,))], {})
    g.case("matmul", "gelu_mlp", [g.T((3, 4)), g.T((6, 4), lo=-0.7, hi=0.7), None, g.S((5, 6), lo=-0.7, hi=0.7),
                                  w((5,))], {}, "transposed weights, no b1")
    g.case("matmul", "gelu_mlp", [g.P((2, 3, 4), (1, 0, 2)), w((6, 4)), g.S((6,), lo=-0.7, hi=0.7), w((5, 6)),
                                  None], {}, "no b2")
    g.case("matmul", "gelu_mlp", [g.Sel((3, 4)), w((6, 4)), None, w((5, 6)), None], {}, "no biases")
    g.case("matmul", "gelu_mlp", [g.E((3, 4), (1, 4)), w((6, 4)), w((6,)), w((5, 6)), w((5,))], {}, "expanded rows")
    g.case("matmul", "gelu_mlp", [g.C((4,)), w((6, 4)), w((6,)), w((5, 6)), w((5,))], {}, "1-D x")
    g.case("matmul", "gelu_mlp", [g.C((0, 4)), w((6, 4)), w((6,)), w((5, 6)), w((5,))], {}, "size 0")
    for dt in (torch.float16, torch.bfloat16):
        g.case("matmul", "gelu_mlp", [g.T((3, 8), dtype=dt), w((16, 8), dtype=dt), w((16,), dtype=dt),
                                      w((8, 16), dtype=dt), w((8,), dtype=dt)], {})

    # linear_cross_entropy: cross_entropy(linear(x, weight, bias), target), rows in chunks
    t6 = torch.tensor([0, 4, 1, 1, 3, 2])
    g.case("matmul", "linear_cross_entropy", [g.C((6, 4)), w((5, 4)), w((5,)), g.I(t6)], {"reduction": "mean"})
    g.case("matmul", "linear_cross_entropy", [g.C((6, 4)), w((5, 4)), w((5,)), g.I(t6)],
           {"reduction": "sum", "chunk_rows": 2}, "chunks of 2")
    g.case("matmul", "linear_cross_entropy",
           [g.T((2, 3, 4), a=0, b=1), w((5, 4)), w((5,)), g.I(torch.tensor([[1, -100, 4], [-100, 0, 0]]))],
           {"reduction": "mean", "chunk_rows": 2}, "(N, T, H) view, ignored rows, chunks of 2")
    g.case("matmul", "linear_cross_entropy", [g.C((6, 4)), g.T((5, 4), lo=-0.7, hi=0.7), None,
                                              g.I(torch.tensor([2, 4, 2, 1, 0, 3]))],
           {"reduction": "mean", "ignore_index": 2, "label_smoothing": 0.1, "chunk_rows": 4},
           "ignore_index 2, smoothing, transposed weight")
    g.case("matmul", "linear_cross_entropy", [g.S((6, 4)), g.S((5, 4), lo=-0.7, hi=0.7), g.S((5,), lo=-0.7, hi=0.7),
                                              g.I(torch.tensor([3, -100, 1, 0, 4, 4]))],
           {"reduction": "sum", "label_smoothing": 0.2}, "smoothing, strided operands")
    g.case("matmul", "linear_cross_entropy", [g.Sel((5, 3)), w((4, 3)), w((4,)), g.I(torch.tensor([3, 0, 2, 2, 1]))],
           {"reduction": "mean", "chunk_rows": 1}, "chunks of 1")
    g.case("matmul", "linear_cross_entropy", [g.C((4,)), w((5, 4)), w((5,)), g.I(torch.tensor(3))],
           {"reduction": "mean"}, "1-D x, 0-d target")
    g.case("matmul", "linear_cross_entropy", [g.C((6, 4)), w((5, 4)), w((5,)), g.I(t6.to(torch.int32))],
           {"reduction": "mean"}, "int32 target")
    for r in ("mean", "sum"):
        g.case("matmul", "linear_cross_entropy", [g.C((3, 4)), w((5, 4)), w((5,)), g.I(torch.full((3,), -100))],
               {"reduction": r}, "all ignored" + (": NaN" if r == "mean" else ""))
        g.case("matmul", "linear_cross_entropy", [g.C((0, 4)), w((5, 4)), w((5,)),
                                                  g.I(torch.zeros(0, dtype=torch.int64))],
               {"reduction": r}, "no rows" + (": NaN" if r == "mean" else ""))
    # 16-bit products, a float32 loss: the bounds of the 16-bit logits, not of float32
    g.case("matmul", "linear_cross_entropy", [g.T((6, 8), dtype=torch.bfloat16), w((5, 8), dtype=torch.bfloat16),
                                              w((5,), dtype=torch.bfloat16), g.I(t6)], {"reduction": "mean"},
           tol={"rtol": 3e-2, "atol": 8e-3})
    g.case("matmul", "linear_cross_entropy", [g.C((6, 8), dtype=torch.float16), w((5, 8), dtype=torch.float16),
                                              None, g.I(t6)], {"reduction": "sum", "label_smoothing": 0.1},
           tol={"rtol": 4e-3, "atol": 1e-3})

    # batch_norm_relu, batch_norm_add_relu: training (running statistics updated) and eval
    def stats(C):
        return In(g.vals((C,), -0.5, 0.5), grad=False), In(g.vals((C,), 0.5, 2.0), grad=False)
    opt = lambda shape, lo=0.5, hi=1.5, **kw: g.C(shape, lo=lo, hi=hi, **kw)  # noqa: E731
    for training in (True, False):
        rm, rv = stats(3)
        g.case("norm", "batch_norm_relu", [g.C((4, 3, 2, 2)), rm, rv, opt((3,)), opt((3,), -0.5, 0.5)],
               {"training": training, "momentum": 0.1, "eps": 1e-5})
        rm, rv = stats(3)
        g.case("norm", "batch_norm_add_relu", [g.C((4, 3, 2, 2)), g.T((4, 3, 2, 2)), rm, rv, opt((3,)),
                                               opt((3,), -0.5, 0.5)],
               {"training": training, "momentum": 0.1, "eps": 1e-5}, "transposed residual")
    rm, rv = stats(3)
    g.case("norm", "batch_norm_relu", [g.P((2, 3, 3, 2), (0, 3, 1, 2)), rm, rv, opt((3,)), opt((3,), -0.5, 0.5)],
           {"training": True, "momentum": 0.2, "eps": 1e-3}, "channels-last")
    rm, rv = stats(3)
    g.case("norm", "batch_norm_add_relu", [g.P((2, 3, 3, 2), (0, 3, 1, 2)), g.P((2, 3, 3, 2), (0, 3, 1, 2)), rm, rv,
                                           opt((3,)), opt((3,), -0.5, 0.5)],
           {"training": True, "momentum": 0.1, "eps": 1e-5}, "channels-last")
    g.case("norm", "batch_norm_relu", [g.C((5, 4)), None, None, None, None], {"training": True}, "(N, C), no stats")
    rm, rv = stats(2)
    g.case("norm", "batch_norm_relu", [g.T((3, 2, 4), a=1, b=2), rm, rv, opt((2,)), None],
           {"training": True, "momentum": 0.3, "eps": 1e-5}, "(N, C, L) view")
    rm, rv = stats(4)
    g.case("norm", "batch_norm_add_relu", [g.S((3, 4)), g.C((3, 4)), rm, rv, None, None],
           {"training": False, "momentum": 0.1, "eps": 1e-5}, "(N, C), eval")
    for dt in (torch.float16, torch.bfloat16):
        rm, rv = stats(3)
        g.case("norm", "batch_norm_relu", [g.C((4, 3, 2), dtype=dt), rm, rv, opt((3,)), opt((3,), -0.5, 0.5)],
               {"training": dt == torch.float16, "momentum": 0.1, "eps": 1e-5}, "float32 statistics")
        rm, rv = stats(3)
        g.case("norm", "batch_norm_add_relu", [g.C((4, 3, 2), dtype=dt), g.C((4, 3, 2), dtype=dt), rm, rv,
                                               opt((3,)), opt((3,), -0.5, 0.5)],
               {"training": dt == torch.bfloat16, "momentum": 0.1, "eps": 1e-5}, "float32 statistics")


def inplace_cases(g):
    """The in-place ops (family binary) on a clone of a non-contiguous view of a leaf, as
    v = x.clone(); v.op_(other): the gradient reaches the view's base through the clone and
    `other` (broadcast, a view, 0-d, another dtype) through the op."""
    away = lambda i: In(torch.where(i.base.abs() < 0.25, torch.full_like(i.base, 0.5), i.base), i.view, i.grad,  # noqa
                        i.layout)
    g.case("binary", "add_", [g.T((3, 4)), g.C((3, 4))], {}, "transposed self")
    g.case("binary", "add_", [g.S((3, 4)), g.C((4,))], {"alpha": -0.5}, "strided self, broadcast other")
    g.case("binary", "add_", [g.C((0, 3)), g.C((3,))], {}, "size 0")
    g.case("binary", "add_", [g.T((3, 4), dtype=torch.bfloat16), g.S((3, 1), dtype=torch.bfloat16)], {}, "bfloat16")
    g.case("binary", "sub_", [g.P((2, 3, 4), (2, 0, 1)), g.C(())], {}, "permuted self, 0-d other")
    g.case("binary", "sub_", [g.Sel((3, 4)), g.E((3, 4), (1, 4))], {"alpha": 2.0}, "expanded other")
    g.case("binary", "mul_", [g.T((3, 4)), g.S((3, 4))], {}, "transposed x strided")
    g.case("binary", "mul_", [g.C((2, 3, 4)), g.T((3, 4), grad=False)], {}, "other without grad")
    g.case("binary", "mul_", [g.T((3, 4), dtype=torch.float16), g.C((3, 4))], {}, "float16 self, float32 other")
    g.case("binary", "div_", [g.S((3, 4)), away(g.C((3, 1)))], {}, "broadcast divisor")
    g.case("binary", "div_", [g.T((3, 4)), away(g.C(()))], {}, "0-d divisor")
    g.case("binary", "div_", [g.C((3, 4), dtype=torch.float64), away(g.T((3, 4)))], {}, "float64 self")
    for op, s in [("add_scalar_", 1.25), ("sub_scalar_", -0.5), ("mul_scalar_", -3.0), ("div_scalar_", 4.0)]:
        g.case("binary", op, [g.P((2, 3, 4), (1, 2, 0))], {"s": s})
    g.case("binary", "mul_scalar_", [g.T((3, 4), dtype=torch.float16)], {"s": 0.1}, "float16")
    g.case("binary", "div_scalar_", [g.C(())], {"s": -3.0}, "0-d")
    g.case("binary", "masked_fill_", [g.T((3, 4)), g.I(torch.rand((4,), generator=g.rng) > 0.5)], {"value": -2.5},
           "broadcast mask")
    g.case("binary", "masked_fill_", [g.S((2, 3, 4)), g.I(torch.rand((1, 3), generator=g.rng) > 0.5,
                                                          [("transpose", 0, 1)], "transposed")], {"value": 7.0},
           "transposed mask")
    g.case("binary", "masked_fill_", [g.Sel((3, 4), dtype=torch.bfloat16),
                                      g.I(torch.rand((3, 4), generator=g.rng) > 0.5)], {"value": 0.1}, "bfloat16")
    g.case("binary", "masked_fill_", [g.C(()), g.I(torch.tensor(True))], {"value": 3.5}, "0-d")


# Exact comparison: a conversion rounds once, the same way in both.
EXACT = {"rtol": 1e-300, "atol": 1e-300}


def convert_cases(g):
    """Tensor::to and copy_ across dtypes (family unary): rounding to the 16-bit types (ties,
    subnormals, past the largest finite value: inf; float64 to 16-bit rounds through float32, as
    both PyTorch and frugal do), truncation toward zero into integers, != 0 into bool (NaN: true),
    integer narrowing (modulo 2^32), and copy_'s broadcast source."""
    def to(x, dtype, name="", exact=True):
        g.case("unary", "to", [x], {"dtype": dtype}, name, tol=EXACT if exact else None)

    f16_edges = (65504.0, 65519.0, 65520.0, -70000.0, 3e-8, 1e-8, -1e-9, 1e-5, NAN, INF, -INF, 0.1)
    to(g.T((3, 5), special=f16_edges), "float16", "range edges, subnormals, NaN, inf")
    bf16_edges = (3.4028234663852886e38, -3.4e38, 1.00390625, 1.01171875, 1e-40, NAN, INF, 3e38)
    to(g.S((3, 4), special=bf16_edges), "bfloat16", "range edges, ties, NaN, inf")
    f64 = lambda shape, special: In(g.vals(shape, dtype=torch.float64, special=special))  # noqa: E731
    to(f64((2, 4), (1 + 2**-11 + 2**-40, 65519.999, 1e-9, -2.0**-24)), "float16", "through float32")
    to(f64((2, 4), (1 + 2**-8 + 2**-40, 1e-45, 3.3e38)), "bfloat16", "through float32")
    to(f64((2, 4), (0.1, 1 / 3, 1e39, -1e39, 1e-46, NAN)), "float32", "rounding, overflow, underflow, NaN")
    to(g.T((3, 4)), "float64", exact=False)  # (the gradient rounds to float32)
    to(g.S((3, 4), dtype=torch.float16), "float32", exact=False)
    to(g.C((2, 4), dtype=torch.bfloat16, special=(1e5, -1e5, 1e-6, 3.0)), "float16", "overflow, subnormal",
       exact=False)
    to(g.T((2, 4), dtype=torch.float16), "bfloat16", exact=False)
    to(g.C((), special=(0.3,)), "float16", "0-d")
    # into integers: toward zero; NaN, +-inf and values past the integer range are left out
    ints = (-2.7, -0.5, 0.5, 2.999, -1.0, 1e10, -1e12, -0.0, 7.9999995, 16777217.0)
    to(In(g.vals((3, 4), -100, 100, special=ints), grad=False), "int64", "toward zero")
    to(In(g.vals((3, 4), -1e6, 1e6, special=(2147483520.0, -2147483648.0, -3.5, 3.5)), [("transpose", 0, 1)],
          False, "transposed"), "int32", "toward zero, range edges")
    to(In(g.vals((2, 3), dtype=torch.float64, special=(2.0**62, -9.2e18, 2.0**53 + 1, -0.99)), grad=False), "int64",
       "large float64")
    to(In(g.vals((2, 4), -50, 50, dtype=torch.float16, special=(-0.75, 65504.0)), grad=False), "int64", "float16")
    to(In(g.vals((2, 4), -50, 50, dtype=torch.bfloat16, special=(-0.75, 1e9)), [("transpose", 0, 1)], False,
          "transposed"), "int32", "bfloat16")
    to(In(g.vals((0, 3)), grad=False), "int64", "size 0")
    # into bool: != 0
    to(In(g.vals((2, 4), special=(NAN, 0.0, -0.0, INF, -INF, 1e-30, 1e-45)), grad=False), "bool", "NaN, -0, subnormal")
    to(In(g.vals((2, 3), dtype=torch.float16, special=(0.0, -0.0, 6e-8)), grad=False), "bool", "float16")
    # from integers and bool
    big = torch.tensor([[16777217, 2**31 + 1, -5, 0], [70000, 65519, 2049, 2051], [257, 259, -70000, 2**40 + 1]])
    for dt in ("float32", "float16", "bfloat16"):
        to(g.I(big.clone()), dt, "int64: rounding, overflow")
    to(g.I(torch.tensor([2**32 + 5, 2**31, -(2**31) - 1, -7])), "int32", "int64 narrowed: modulo 2^32")
    to(g.I(torch.tensor([[0, -3], [2**40, 1]]), [("transpose", 0, 1)], "transposed"), "bool", "int64")
    to(g.I(torch.tensor([-(2**31), 2**31 - 1, 3], dtype=torch.int32)), "float64", "int32")
    to(g.I(torch.tensor([-(2**31), 7], dtype=torch.int32)), "int64", "int32")
    mask = torch.rand((3, 4), generator=g.rng) > 0.5
    for dt in ("float32", "int64", "float16"):
        to(g.I(mask.clone()), dt, "bool")
    # a float tensor that requires grad, converted to an integer dtype: the result has no gradient
    to(g.S((2, 3), lo=-5, hi=5), "int64", "input requires grad")

    # copy_: into a clone of dst (dtype: dst's), src broadcast and converted
    def cp(dst, src, dtype, name, exact=True):
        g.case("unary", "copy_", [dst, src], {"dtype": dtype}, name, tol=EXACT if exact else None)
    cp(g.C((3, 4), dtype=torch.float16), g.S((4,), special=(70000.0, 1e-8, 0.1)), "float16",
       "float32 (4) into float16 (3, 4)")
    cp(g.T((3, 4)), g.E((3, 4), (1, 4), dtype=torch.float64, special=(0.1, 1e39)), "float32",
       "expanded float64 into float32")
    cp(g.S((3, 4), dtype=torch.bfloat16), g.T((3, 4)), "bfloat16", "float32 into bfloat16")
    cp(g.C((2, 3), dtype=torch.float64), g.C((), dtype=torch.float16), "float64", "0-d float16 into float64",
       exact=False)
    cp(g.I(torch.zeros((2, 3), dtype=torch.int64)), In(g.vals((3,), -9, 9, special=(-2.5, 2.5)), grad=False), "int64",
       "float32 into int64")
    cp(g.C((2, 3)), g.I(g.ints((2, 1), -5, 5)), "float32", "int64 into float32: dst's gradient 0")
    cp(g.I(torch.zeros((2, 4), dtype=torch.bool)), In(g.vals((4,), special=(NAN, 0.0, -0.0)), grad=False), "bool",
       "float32 into bool")
    cp(In(g.vals((3, 4)), grad=False), g.C((1,)), "float32", "into a tensor without grad", exact=False)
    cp(g.C((0, 3)), g.C((3,)), "float32", "size 0")


def conv_transpose_cases(g):
    w = lambda shape: g.C(shape, lo=-0.5, hi=0.5)  # noqa: E731
    b = lambda k: g.C((k,), lo=-0.5, hi=0.5)  # noqa: E731
    ct = "conv_transpose2d"
    g.case("conv", ct, [g.C((2, 3, 4, 5)), w((3, 2, 3, 3)), b(2)], {})
    g.case("conv", ct, [g.C((2, 4, 5, 4)), w((4, 3, 4, 4)), b(3)], {"stride": 2, "padding": 1}, "2x upsampling")
    g.case("conv", ct, [g.T((1, 3, 3, 4)), w((3, 2, 3, 2)), None],
           {"stride": [2, 3], "padding": [1, 0], "output_padding": [1, 2]}, "output_padding")
    g.case("conv", ct, [g.P((2, 4, 4, 3), (0, 3, 1, 2)), w((4, 1, 3, 3)), b(2)],
           {"stride": 2, "padding": 1, "groups": 2}, "groups, channels-last view")
    g.case("conv", ct, [g.S((2, 3, 5, 5)), w((3, 1, 3, 3)), b(3)], {"padding": 1, "groups": 3}, "depthwise")
    g.case("conv", ct, [g.C((2, 2, 3, 3)), w((2, 2, 3, 2)), b(2)],
           {"output_padding": [1, 0], "dilation": [2, 1]}, "output_padding >= stride, < dilation")
    g.case("conv", ct, [g.C((1, 2, 3, 4)), w((2, 3, 2, 3)), None],
           {"stride": 2, "padding": [0, 1], "output_padding": 1, "dilation": [3, 2]})
    g.case("conv", ct, [g.C((3, 5, 4)), w((3, 2, 2, 2)), b(2)], {"stride": 2}, "unbatched (C, H, W)")
    g.case("conv", ct, [g.C((2, 4, 1, 1)), w((4, 3, 4, 4)), b(3)], {}, "1x1 input (a generator's first layer)")
    g.case("conv", ct, [g.C((0, 2, 3, 3)), w((2, 3, 3, 3)), b(3)], {"stride": 2}, "size-0 batch")
    g.case("conv", ct, [g.C((1, 2, 4, 4), dtype=torch.bfloat16),
                        In(g.vals((2, 3, 3, 3), -0.5, 0.5, torch.bfloat16)),
                        In(g.vals((3,), -0.5, 0.5, torch.bfloat16))], {"stride": 2, "padding": 1})


def cases_1d(g):
    """The 1-D convolutions and pools."""
    w = lambda shape: g.C(shape, lo=-0.5, hi=0.5)  # noqa: E731
    b = lambda k: g.C((k,), lo=-0.5, hi=0.5)  # noqa: E731
    g.case("conv", "conv1d", [g.C((2, 3, 9)), w((4, 3, 3)), b(4)], {})
    g.case("conv", "conv1d", [g.T((2, 4, 11)), w((6, 2, 3)), b(6)], {"stride": 2, "padding": 1, "groups": 2},
           "an (N, L, C) tensor transposed")
    g.case("conv", "conv1d", [g.C((1, 3, 10)), w((5, 3, 4)), None], {"stride": 3, "padding": 2, "dilation": 2})
    g.case("conv", "conv1d", [g.S((3, 6, 7)), w((6, 1, 3)), b(6)], {"padding": 1, "groups": 6}, "depthwise")
    g.case("conv", "conv1d", [g.C((3, 9)), w((2, 3, 2)), b(2)], {}, "unbatched (C, L)")
    g.case("conv", "conv_transpose1d", [g.C((2, 4, 6)), w((4, 3, 4)), b(3)], {"stride": 2, "padding": 1})
    g.case("conv", "conv_transpose1d", [g.T((1, 4, 4)), w((4, 1, 3)), None],
           {"stride": 3, "padding": 1, "output_padding": 2, "groups": 2})
    g.case("conv", "conv_transpose1d", [g.C((2, 2, 4)), w((2, 2, 3)), b(2)], {"output_padding": 1, "dilation": 2},
           "output_padding >= stride, < dilation")

    # 1-D pools (ties planted in the first: the first largest value in the window wins)
    tie = torch.tensor([[[1.0, 3.0, 3.0, 0.0, -1.0, -1.0, 0.5]]])
    g.case("pool", "max_pool1d", [In(tie.clone())], {"kernel": 2}, "ties")
    g.case("pool", "max_pool1d", [g.T((2, 3, 9))], {"kernel": 3, "stride": 2, "padding": 1, "ceil_mode": True},
           "an (N, L, C) tensor transposed")
    g.case("pool", "max_pool1d", [g.C((3, 10))], {"kernel": 2, "stride": 1, "padding": 1, "dilation": 2}, "unbatched")
    g.case("pool", "avg_pool1d", [g.C((2, 3, 9))], {"kernel": 3, "stride": 2, "padding": 1})
    g.case("pool", "avg_pool1d", [g.S((1, 2, 8))], {"kernel": 4, "stride": 3, "padding": 2, "ceil_mode": True,
                                                     "count_include_pad": False})
    g.case("pool", "adaptive_avg_pool1d", [g.C((2, 3, 10))], {"output_size": 4})
    g.case("pool", "adaptive_avg_pool1d", [g.C((3, 5))], {"output_size": 7}, "more bins than samples")



def sort_cases(g):
    """sort and argsort (stable: ties in index order, NaN last ascending), topk on distinct values
    (torch.topk's order among ties is unspecified)."""
    nan, inf = float("nan"), float("inf")
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, nan, -0.0, 0.0, 2.0, -inf, inf, nan]])
    g.case("sort", "sort", [In(ties.clone())], {"dim": -1}, "ties, NaN, -0, infinities")
    g.case("sort", "sort", [In(ties.clone())], {"dim": 1, "descending": True}, "descending, ties in index order")
    g.case("sort", "sort", [g.T((3, 5, 4))], {"dim": 1}, "a middle dim of a transposed tensor")
    g.case("sort", "sort", [g.C((2, 6), dtype=torch.bfloat16)], {"dim": 0, "descending": True}, "bfloat16")
    g.case("sort", "sort", [g.C((0, 3))], {"dim": 1}, "size 0")
    g.case("sort", "argsort", [In(ties.clone(), grad=False)], {"descending": True})
    g.case("sort", "topk", [g.C((4, 9))], {"k": 3}, "the 3 largest")
    g.case("sort", "topk", [g.S((3, 7))], {"k": 2, "dim": 0, "largest": False}, "the 2 smallest along dim 0 of a slice")
    g.case("sort", "topk", [g.C((2, 5))], {"k": 0}, "k = 0")


def unary_math_cases(g):
    """tan, the inverse and hyperbolic functions, erf/erfc, expm1, exp2, log2, log10, logsigmoid and
    the rounding ops (gradient zeros): two layouts each, float16/bfloat16, the domains' edges, NaN and
    the infinities, ties of round, integer inputs. sign(NaN) is NaN in frugal and 0 in PyTorch (Note
    [NaN stays NaN] in tensor/ops/unary_math.h): no NaN reaches sign here."""
    nan, inf = float("nan"), float("inf")
    table = [("tan", (-1.2, 1.2), ()), ("asin", (-0.95, 0.95), ()), ("acos", (-0.95, 0.95), ()),
             ("atan", (-4, 4), ()), ("sinh", (-3, 3), ()), ("cosh", (-3, 3), ()), ("asinh", (-4, 4), ()),
             ("acosh", (1.05, 4), ()), ("atanh", (-0.9, 0.9), ()), ("erf", (-3, 3), (0.0,)),
             ("erfc", (-3, 3), ()), ("expm1", (-3, 3), (0.0,)), ("exp2", (-4, 4), ()), ("log2", (0.05, 4), (1.0,)),
             ("log10", (0.05, 4), (1.0,)), ("logsigmoid", (-6, 6), ()), ("floor", (-3, 3), (1.0, -2.0)),
             ("ceil", (-3, 3), (1.0, -2.0)), ("trunc", (-3, 3), (-0.5, 2.0)),
             ("round", (-3, 3), (0.5, 1.5, -2.5, -0.5)), ("sign", (-2, 2), (0.0, -0.0))]
    shapes = [(3, 5), (2, 3, 4), (7,)]
    for i, (op, (lo, hi), special) in enumerate(table):
        for j in range(2):
            layout = LAYOUTS[(i + j) % len(LAYOUTS)]
            g.case("unary", op, [g.L(layout, shape=shapes[(i + j) % len(shapes)], lo=lo, hi=hi, special=special)])
    for dt in (torch.float16, torch.bfloat16):
        for op, lo, hi, sp in [("erf", -3, 3, ()), ("expm1", -3, 3, ()), ("logsigmoid", -8, 8, ()),
                               ("atan", -4, 4, ()), ("floor", -3, 3, (1.0,)), ("sign", -2, 2, (0.0,))]:
            g.case("unary", op, [g.T((3, 6), lo=lo, hi=hi, dtype=dt, special=sp)])
    for op in ("floor", "ceil", "trunc", "round", "erf", "erfc", "atan", "asinh", "expm1", "exp2", "logsigmoid",
               "sinh", "cosh", "tan"):
        g.case("unary", op, [g.C((2, 4), special=(nan, inf, -inf, 0.0, -0.0), grad=False)], {}, "NaN, infinities, -0")
    g.case("unary", "sign", [g.C((2, 3), special=(inf, -inf, -0.0, 0.0), grad=False)], {}, "infinities, -0")
    for op, sp in [("asin", (1.0, -1.0, 1.5)), ("acos", (1.0, -1.0, -1.5)), ("atanh", (1.0, -1.0, 2.0)),
                   ("acosh", (1.0, 0.5)), ("log2", (0.0, -1.0)), ("log10", (0.0, -1.0))]:
        g.case("unary", op, [g.C((2, 3), lo=0.1, hi=0.6, special=sp, grad=False)], {}, "the domain's edges")
    g.case("unary", "logsigmoid", [g.C((2, 3), special=(-200.0, 200.0, -30.0, 30.0))], {}, "far tails")
    for op in ("floor", "round", "sign"):
        g.case("unary", op, [g.I(g.ints((2, 5), -6, 6))], {}, "int64")
    g.case("unary", "erf", [g.C(())], {}, "0-d")
    g.case("unary", "round", [g.T((0, 3))], {}, "size 0")


def distance_cases(g):
    """normalize, cosine_similarity and pairwise_distance: dims, orders, broadcast operands, views,
    keepdim, a zero vector (normalize divides it by eps)."""
    for p, dim in [(2.0, 1), (1.0, 0), (3.0, -1), ("inf", 1)]:
        g.case("reduce", "normalize", [g.T((3, 5))], {"p": p, "dim": dim})
    g.case("reduce", "normalize", [g.C((2, 3, 4), special=(0.0, 0.0, 0.0, 0.0))], {"dim": 2}, "a zero vector")
    g.case("reduce", "normalize", [g.C((4, 6), dtype=torch.bfloat16)], {"dim": -1})
    g.case("reduce", "cosine_similarity", [g.C((4, 6)), g.T((4, 6))], {})
    g.case("reduce", "cosine_similarity", [g.C((5, 3)), g.C((3,))], {"dim": -1}, "broadcast")
    g.case("reduce", "cosine_similarity", [g.S((2, 1, 4)), g.C((3, 4))], {"dim": 2}, "broadcast both")
    g.case("reduce", "cosine_similarity", [g.C((3, 4)), g.C((3, 4))], {"dim": 0, "eps": 1e-3})
    g.case("reduce", "pairwise_distance", [g.C((5, 4)), g.T((5, 4))], {})
    g.case("reduce", "pairwise_distance", [g.C((5, 4)), g.C((4,))], {"p": 1.0, "keepdim": True}, "broadcast")
    g.case("reduce", "pairwise_distance", [g.C((3, 6)), g.S((3, 6))], {"p": "inf"})
    g.case("reduce", "pairwise_distance", [g.C((7,)), g.C((7,))], {"p": 3.0}, "1-D: a 0-d distance")


def metric_loss_cases(g):
    """triplet_margin_loss (swap, p, margin, reductions) and cosine_embedding_loss (targets 1, -1 and
    0, margin, reductions, one pair)."""
    for swap, p, margin, reduction in [(False, 2.0, 1.0, "mean"), (True, 2.0, 0.5, "sum"), (False, 1.0, 2.0, "none"),
                                       (True, 3.0, 1.0, "mean")]:
        g.case("loss", "triplet_margin_loss", [g.C((5, 4)), g.T((5, 4)), g.C((5, 4))],
               {"margin": margin, "p": p, "swap": swap, "reduction": reduction})
    y = torch.tensor([1, -1, 0, -1, 1], dtype=torch.int64)
    for margin, reduction in [(0.0, "mean"), (0.3, "sum"), (-0.5, "none")]:
        g.case("loss", "cosine_embedding_loss", [g.C((5, 6)), g.S((5, 6)), g.I(y.clone())],
               {"margin": margin, "reduction": reduction})
    g.case("loss", "cosine_embedding_loss", [g.C((6,)), g.C((6,)), g.I(torch.tensor(-1))], {"margin": -1.0},
           "one pair")


def binary_math_cases(g):
    """atan2, hypot, logaddexp, remainder, fmod and the rounded divisions: layouts, broadcasts, 0-d,
    float16/bfloat16, signed zeros, infinities and zero divisors, int64 operands, scalar divisors."""
    nan, inf = float("nan"), float("inf")
    pairs = [
        ("same shape", lambda lo, hi: (g.C((3, 4), lo=lo, hi=hi), g.T((3, 4), lo=lo, hi=hi))),
        ("broadcast (3,1,4)x(2,4)", lambda lo, hi: (g.C((3, 1, 4), lo=lo, hi=hi), g.S((2, 4), lo=lo, hi=hi))),
        ("0-d operand", lambda lo, hi: (g.C((2, 5), lo=lo, hi=hi), g.C((), lo=lo, hi=hi))),
    ]
    for op in ("atan2", "hypot", "logaddexp", "remainder", "fmod", "div_floor", "div_trunc"):
        for name, make in pairs:
            a, b = make(-4.0, 4.0)
            if op not in ("atan2", "hypot", "logaddexp"):  # divisors of magnitude at least 0.5
                b.base = torch.where(b.base.abs() < 0.5, torch.full_like(b.base, 0.75), b.base)
            g.case("binary", op, [a, b], {}, name)
        for dt in (torch.float16, torch.bfloat16):
            g.case("binary", op, [g.C((3, 5), lo=-4, hi=4, dtype=dt), g.C((5,), lo=0.5, hi=2, dtype=dt)], {},
                   str(dt).replace("torch.", ""))
        sp_a, sp_b = (0.0, -0.0, 0.0, -0.0, inf, -inf, 5.0, -5.0, nan, 3.0), (0.0, 0.0, -0.0, -0.0, 2.0, inf, inf,
                                                                             -inf, 1.0, nan)
        g.case("binary", op, [In(g.vals((2, 5), special=sp_a)), In(g.vals((2, 5), special=sp_b))], {},
               "signed zeros, infinities, NaN")
    for op in ("remainder", "fmod", "div_floor", "div_trunc"):
        b = g.ints((3, 6), -5, 5)
        b[b == 0] = 3
        g.case("binary", op, [g.I(g.ints((3, 6), -20, 20)), g.I(b)], {}, "int64")
    for op, s in [("remainder_scalar", 1.5), ("remainder_scalar", -2.0), ("fmod_scalar", 0.75),
                  ("floor_divide_scalar", -1.25)]:
        g.case("binary", op, [g.T((3, 4), lo=-5, hi=5)], {"s": s})
    for op in ("remainder_scalar", "floor_divide_scalar", "fmod_scalar"):
        g.case("binary", op, [g.I(g.ints((2, 7), -20, 20))], {"s": -3}, "int64")  # a Python int: integer division


def activation_cases(g):
    """selu, celu, softsign, tanhshrink, hardshrink, softshrink, threshold (values on the kinks, two
    layouts, 16-bit, infinities), glu along a dim, prelu with one slope and one per channel.
    softsign(+-inf) and softshrink(NaN) differ from PyTorch 1.13 by design (tensor/ops/unary.h):
    neither reaches these cases."""
    inf = float("inf")
    table = [("selu", {}, (-4, 3), (0.0,)), ("celu", {"alpha": 0.5}, (-4, 3), (0.0,)), ("celu", {}, (-4, 3), ()),
             ("softsign", {}, (-5, 5), (0.0,)), ("tanhshrink", {}, (-3, 3), ()),
             ("hardshrink", {}, (-2, 2), (0.5, -0.5, 0.25)), ("hardshrink", {"lambd": 1.0}, (-2, 2), (1.0, -1.0)),
             ("softshrink", {}, (-2, 2), (0.5, -0.5)), ("softshrink", {"lambd": 0.0}, (-2, 2), (0.0,)),
             ("threshold", {"threshold": 0.5, "value": -2.0}, (-2, 2), (0.5,)),
             ("threshold", {"threshold": -1.0, "value": 0.0}, (-2, 2), (-1.0,))]
    for i, (op, args, (lo, hi), special) in enumerate(table):
        for j in range(2):
            layout = LAYOUTS[(i + j) % len(LAYOUTS)]
            g.case("unary", op, [g.L(layout, shape=(3, 5), lo=lo, hi=hi, special=special)], args)
    for dt in (torch.float16, torch.bfloat16):
        for op, args in [("selu", {}), ("softshrink", {}), ("threshold", {"threshold": 0.5, "value": 3.0})]:
            g.case("unary", op, [g.T((3, 6), lo=-3, hi=3, dtype=dt)], args)
    for op, args in [("selu", {}), ("celu", {"alpha": 2.0}), ("tanhshrink", {}), ("hardshrink", {}),
                     ("threshold", {"threshold": 0.0, "value": 1.0})]:
        g.case("unary", op, [g.C((2, 3), special=(inf, -inf), grad=False)], args, "infinities")
    g.case("unary", "glu", [g.C((4, 6))], {})
    g.case("unary", "glu", [g.T((3, 4, 5))], {"dim": 1}, "transposed, dim 1")
    g.case("unary", "glu", [g.C((2, 5, 4), dtype=torch.bfloat16)], {"dim": 2})
    g.case("unary", "prelu", [g.C((2, 3, 4)), g.C((3,), lo=-0.5, hi=0.5)], {}, "per channel")
    g.case("unary", "prelu", [g.T((4, 5)), g.C((1,), lo=0.1, hi=0.3)], {}, "one slope")


def rearrange_cases(g):
    """roll (several dims, negative and large shifts, no dims), movedim, pixel_shuffle and
    pixel_unshuffle (a batch dim or none, views)."""
    g.case("shape", "roll", [g.T((3, 4, 5))], {"shifts": [1, -2], "dims": [0, 2]})
    g.case("shape", "roll", [g.C((4, 6))], {"shifts": [13], "dims": [-1]}, "past the size")
    g.case("shape", "roll", [g.S((3, 5))], {"shifts": [4]}, "no dims")
    g.case("shape", "movedim", [g.C((2, 3, 4, 5))], {"source": [1, 3], "destination": [0, 1]})
    g.case("shape", "pixel_shuffle", [g.C((2, 12, 3, 2))], {"factor": 2})
    g.case("shape", "pixel_shuffle", [g.T((9, 2, 3))], {"factor": 3}, "no batch dim, transposed")
    g.case("shape", "pixel_unshuffle", [g.C((2, 3, 4, 6))], {"factor": 2})
    g.case("shape", "pixel_unshuffle", [g.T((1, 2, 6, 3))], {"factor": 3}, "transposed")
    g.case("matmul", "einsum", [g.C((2, 2, 3, 4)), g.T((2, 2, 5, 4))], {"equation": "bhqd,bhkd->bhqk"}, "attention")
    g.case("matmul", "einsum", [g.C((3, 4)), g.S((4, 2)), g.C((2, 5))], {"equation": "ij,jk,kl->il"}, "three")
    g.case("matmul", "einsum", [g.C((2, 3, 3, 4)), g.C((3, 4, 2))], {"equation": "...ij,...jk->...ik"}, "ellipsis")
    g.case("matmul", "einsum", [g.C((3,)), g.C((4,))], {"equation": "i,j"}, "implicit outer")
    g.case("matmul", "einsum", [g.T((4, 3))], {"equation": "ij->j"}, "one operand")
    g.case("matmul", "einsum", [g.C((2, 4, 4)), g.C((2, 4))], {"equation": "bii,bi->bi"}, "diagonal")
    g.case("matmul", "einsum", [g.T((3, 3))], {"equation": "ii"}, "trace")


def product_cases(g):
    """prod over dims and cumprod, with zeros (whose gradients take their own formula)."""
    near_one = {"lo": 0.5, "hi": 1.5}
    for i, dims in enumerate(([], [1], [0, 2], [-1, 0])):
        g.case("reduce", "prod", [g.L(LAYOUTS[i], (3, 4, 5), **near_one)], {"dims": dims, "keepdim": i % 2 == 1})
    g.case("reduce", "prod", [g.C((4, 6), special=(0.0,))], {"dims": [1]}, "a zero")
    g.case("reduce", "prod", [g.C((2, 5), special=(0.0, 0.0, 0.0))], {"dims": [1]}, "one zero and two")
    g.case("reduce", "prod", [g.C((3, 4), dtype=torch.float16)], {"dims": [0]}, "float16")
    g.case("reduce", "prod", [g.I(g.ints((3, 4), -5, 5))], {"dims": [1]}, "int64")
    g.case("reduce", "prod", [g.I(torch.rand((3, 4), generator=g.rng) > 0.3)], {"dims": [0]}, "bool")
    g.case("reduce", "prod", [g.C(())], {"dims": []}, "0-d")
    g.case("reduce", "prod", [g.C((0, 3))], {"dims": [0]}, "size 0 reduced")
    for i, dim in enumerate((0, 1, -1)):
        g.case("softmax", "cumprod", [g.L(LAYOUTS[i], (3, 4, 5), **near_one)], {"dim": dim})
    g.case("softmax", "cumprod", [g.C((3, 6), special=(0.0, 0.0, 0.0, 0.0))], {"dim": 1}, "zeros")
    g.case("softmax", "cumprod", [g.C(())], {"dim": 0}, "0-d")
    g.case("softmax", "cumprod", [g.C((0, 3))], {"dim": 1}, "size 0")
    g.case("softmax", "cumprod", [g.T((4, 5), dtype=torch.float16)], {"dim": 0})
    g.case("softmax", "cumprod", [g.T((4, 5), dtype=torch.float16)], {"dim": 1, "dtype": "float32"}, "dtype")
    g.case("softmax", "cumprod", [g.C((1, 1030), lo=0.999, hi=1.001)], {"dim": 1}, "a row past a chunk")
    g.case("softmax", "cumprod", [g.I(g.ints((3, 4), -5, 5))], {"dim": 0}, "int64")


def statistics_cases(g):
    """Order statistics, the NaN-skipping reductions and any/all/count_nonzero."""
    nan = float("nan")
    for i, (k, dim, keepdim) in enumerate(((2, 1, False), (5, -1, True), (1, 0, False))):
        g.case("reduce", "kthvalue", [g.L(LAYOUTS[i], (3, 4, 5))], {"k": k, "dim": dim, "keepdim": keepdim})
    g.case("reduce", "kthvalue", [g.C((3, 4), special=(nan,))], {"k": 4, "dim": 1}, "NaN counts as largest")
    for i, (dim, keepdim) in enumerate(((1, False), (-1, True), (0, False))):
        g.case("reduce", "median_dim", [g.L(LAYOUTS[i + 1], (3, 4, 5))], {"dim": dim, "keepdim": keepdim})
        g.case("reduce", "nanmedian_dim", [g.L(LAYOUTS[i], (4, 3, 2))], {"dim": dim, "keepdim": keepdim})
    g.case("reduce", "median_dim", [g.C((3, 4), special=(nan, nan))], {"dim": 1}, "NaN")
    g.case("reduce", "nanmedian_dim", [g.C((3, 4), special=(nan, nan, nan))], {"dim": 1}, "NaN")
    g.case("reduce", "median_dim", [g.I(torch.randperm(12, generator=g.rng).reshape(3, 4))], {"dim": 0}, "int64")
    g.case("reduce", "median", [g.C((3, 5))], {})
    g.case("reduce", "median", [g.C((5,), special=(1.0, 1.0, 1.0))], {}, "ties share the gradient")
    g.case("reduce", "nanmedian", [g.C((2, 5), special=(nan, nan))], {}, "NaN")
    q3 = lambda: g.I(torch.tensor([0.1, 0.5, 0.8]))  # noqa: E731
    for i, mode in enumerate(("linear", "lower", "higher", "midpoint", "nearest")):
        g.case("reduce", "quantile", [g.L(LAYOUTS[i], (3, 4, 5)), q3()], {"dim": 1, "interpolation": mode}, mode)
        g.case("reduce", "nanquantile", [g.C((3, 7), special=(nan, nan, nan))], {"q": 0.3, "dim": 1, "interpolation": mode},
               mode + ", NaN")
    g.case("reduce", "quantile", [g.C((4, 5))], {"q": 0.35}, "every element")
    g.case("reduce", "quantile", [g.T((4, 5)), q3()], {"dim": 0, "keepdim": True}, "keepdim")
    g.case("reduce", "quantile", [g.C((3, 5), special=(nan,))], {"q": 0.5, "dim": 1}, "NaN")
    for op in ("nansum", "nanmean"):
        g.case("reduce", op, [g.T((4, 5), special=(nan, nan, nan))], {"dims": [1], "keepdim": True})
        g.case("reduce", op, [g.C((3, 4), special=(nan,))], {"dims": []}, "every element")
    g.case("reduce", "nansum", [g.I(g.ints((3, 4), -5, 5))], {"dims": [0]}, "int64")
    for op in ("any", "all"):
        g.case("reduce", op, [g.I(g.ints((3, 4), 0, 2).to(torch.float32))], {"dim": 1}, "float")
        g.case("reduce", op, [g.I(torch.rand((3, 4), generator=g.rng) > 0.4)], {"dim": 0, "keepdim": True}, "bool")
        g.case("reduce", op, [g.I(torch.zeros((0, 3)))], {"dim": 0}, "size 0")
        g.case("reduce", op, [g.I(torch.tensor([0.0, nan]))], {}, "NaN")
    g.case("reduce", "count_nonzero", [g.I(g.ints((3, 4, 2), -1, 2))], {"dims": [0, 2]})


def scan_cases(g):
    """cummax and cummin (ties go to the latest index, NaN propagates) and logcumsumexp."""
    nan, inf = float("nan"), float("inf")
    for i, dim in enumerate((0, 1, -1)):
        for op in ("cummax", "cummin"):
            g.case("softmax", op, [g.L(LAYOUTS[i + (op == "cummin")], (3, 4, 5))], {"dim": dim})
        g.case("softmax", "logcumsumexp", [g.L(LAYOUTS[i], (3, 4, 5), lo=-4.0, hi=4.0)], {"dim": dim})
    g.case("softmax", "cummax", [g.C((2, 5), special=(nan, nan))], {"dim": 1}, "NaN")
    g.case("softmax", "cummin", [g.I(g.ints((3, 6), -2, 2))], {"dim": 1}, "int64 ties")
    g.case("softmax", "cummax", [g.I(torch.rand((2, 5), generator=g.rng) > 0.5)], {"dim": 1}, "bool")
    g.case("softmax", "cummax", [g.C(())], {"dim": 0}, "0-d")
    g.case("softmax", "logcumsumexp", [g.C((2, 5), special=(-inf, -inf, inf, nan), grad=False)], {"dim": 1},
           "infinities and NaN")
    g.case("softmax", "logcumsumexp", [g.C((2, 4), lo=500.0, hi=1000.0)], {"dim": 1}, "large values")
    g.case("softmax", "logcumsumexp", [g.C(())], {"dim": 0}, "0-d")


def tensor_product_cases(g):
    """Diagonals, the tensor products and cdist."""
    g.case("shape", "diagonal", [g.T((3, 4, 5))], {"offset": 1, "dim1": 2, "dim2": 0}, "transposed")
    g.case("shape", "diagonal", [g.C((4, 3))], {"offset": -2}, "below")
    g.case("shape", "diag_embed", [g.C((2, 3))], {"offset": 1}, "batched")
    g.case("shape", "diag_embed", [g.S((3,))], {"offset": -1, "dim1": 1, "dim2": 0})
    g.case("shape", "diag", [g.C((4,))], {"offset": 2}, "vector")
    g.case("shape", "diag", [g.T((3, 4))], {"offset": -1}, "matrix")
    g.case("reduce", "trace", [g.S((4, 3))], {})
    g.case("matmul", "outer", [g.C((3,)), g.S((4,))], {})
    g.case("matmul", "kron", [g.C((2, 3)), g.C((2, 2))], {})  # torch 1.13 cannot kron a transposed view
    g.case("matmul", "kron", [g.C((2,)), g.C((3, 2))], {}, "fewer dims")
    g.case("matmul", "tensordot", [g.C((2, 3, 4)), g.S((4, 3, 5))], {"dims_a": [1, 2], "dims_b": [1, 0]})
    g.case("matmul", "cross", [g.C((3, 4)), g.C((3, 1))], {"dim": 0}, "broadcast")
    g.case("matmul", "cross", [g.T((5, 3)), g.C((5, 3))], {})
    for p in (1.0, 2.0, 3.0):
        g.case("matmul", "cdist", [g.C((2, 4, 3)), g.C((2, 5, 3))], {"p": p})
    g.case("matmul", "cdist", [g.C((30, 4)), g.S((6, 4))], {"p": 2.0}, "the matmul form")


def build(seed=SEED):
    g = Gen(seed)
    for f in (unary_cases, binary_cases, reduce_cases, softmax_cases, shape_cases, index_cases, loss_cases, norm_cases,
              conv_cases, matmul_cases, edge_cases, view_cases, fused_cases,
              inplace_cases, convert_cases, conv_transpose_cases, cases_1d, sort_cases, unary_math_cases, distance_cases,
              metric_loss_cases, binary_math_cases, activation_cases, rearrange_cases, product_cases,
              statistics_cases, scan_cases, tensor_product_cases):
        f(g)
    return g


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "golden", "ops_torch.safetensors"))
    args = ap.parse_args()
    torch.manual_seed(SEED)
    warnings.filterwarnings("ignore", category=UserWarning)  # mse_loss's broadcast, kl_div's 'mean'
    torch.use_deterministic_algorithms(True)
    g = build()
    meta = {"cases": json.dumps(g.cases, separators=(",", ":"), allow_nan=False),
            "generator": "tools/torch_golden_ops.py", "torch": torch.__version__, "seed": str(SEED),
            "count": str(len(g.cases))}
    save_safetensors(os.path.normpath(args.out), g.tensors, meta)
    size = os.path.getsize(args.out)
    print("%d cases, %d tensors, %d bytes -> %s" % (len(g.cases), len(g.tensors), size, os.path.normpath(args.out)))
    for fam, n in g.counts.items():
        print("  %-8s %d" % (fam, n))
    if size > 2_000_000:
        sys.exit("the golden file is over 2 MB: shrink the cases")


if __name__ == "__main__":
    main()
