#!/usr/bin/env python3
"""PyTorch goldens for frugal's training-loop pieces: optimizers, LR schedulers, clipping, GradScaler.

Writes tests/golden/optim_torch.safetensors, which tests/golden_replay/optim.cpp replays (on the CPU and on CUDA). The
optimizer tests in tests/cpu/test_optim.cpp compare frugal with float64 loops written by frugal's
authors from PyTorch's documentation; these trajectories come from PyTorch itself, step for step,
so a misreading of its rules (a bias correction, where weight decay enters, the first momentum
step, what a missing gradient does, a scheduler's milestone) shows up as a failure.

Each case is an entry of the JSON list in the file's __metadata__ ("cases"), with its family, a
readable name, and its settings under the names the C++ reads; its tensors are "<id>.<what>":

  kind "optim" (families sgd, adam, adamw, offload, loop): a trajectory of `steps` steps.
    p<k>          parameter k before the first step (its dtype is the case's)
    g<s>.<k>      parameter k's gradient at step s (1-based); absent: the gradient is None that step
    x<s>.<k>      parameter k after step s, as PyTorch computed it in that dtype
    norm          float64 [steps]: clip_grad_norm_'s return value per step (when the case clips)
    lr            float64 [steps + 1, groups]: each group's lr after the scheduler's construction and
                  after each scheduler.step() (when the case has a scheduler)
    o<j>.state.<i>.<name>  optimizer j's state after the last step (PyTorch's state_dict()["state"]:
                  parameters numbered across groups, step as float64, buffers in their dtype)
    An optimizer is {type, options, groups: [{params: [k...], hyperparameters it overrides}]}; a group
    with "add_at": s joins by add_param_group before step s. A step: add those groups, set (or drop)
    every gradient, then zero_grad(set_to_none) if the step says so, then clip_grad_norm_ over every
    parameter (if the case clips), then each optimizer's step(), then the scheduler's step(). "resume_at": r means the C++ saves the optimizer and scheduler state_dicts
    after step r, builds new ones on copies of the parameters, loads them and goes on: the golden is
    PyTorch's uninterrupted run.
  kind "sched" (family sched): an lr sequence. lr: float64 [steps + 1, groups] as above, of an SGD
    whose groups start at "base_lrs", under the schedulers of "chain" made on it in order and stepped
    back to back each epoch (one scheduler, except in the chaining case).
  kind "clip" (family clip): one clip_grad_norm_ call. g<k> the gradients (absent: None), out<k> the
    gradients after it, norm the returned total norm (float64, 0-d).
  kind "scaler" (family scaler): a mixed-precision loop. Per step: zero_grad(set_to_none=True),
    loss = sum_k sum(p_k * c<s>.<k>) (c<s>.<k> absent: p_k takes no part), scaler.scale(loss).backward()
    (so the gradient is float32(scale * c)), optionally scaler.unscale_ + clip_grad_norm_, scaler.step(opt)
    for each optimizer, scaler.update() (or update(new_scale)); "enabled": false makes the scaler a
    pass-through, as GradScaler(enabled=False). Stored: scale (float64 [steps + 1], the
    scale before step 1 and after each update), tracker (int64 [steps + 1], the growth tracker), skipped
    (int64 [steps, optimizers]: 1 where the step was skipped), ug<s>.<k> (parameter k's gradient after
    step s: unscaled in place), x<s>.<k>, norm and o<j>.state.<i>.<name> as above.

PyTorch 1.13's GradScaler runs on CUDA only (its scale() asserts a CUDA output, and the CPU has no
_amp_update_scale_ or _amp_foreach_non_finite_check_and_unscale_ kernel), so RefScaler below is its
algorithm transcribed for the CPU, from torch/cuda/amp/grad_scaler.py and
aten/src/ATen/native/cuda/AmpKernels.cu (1.13):
  - the scale is a float32 tensor, the growth tracker an int32 tensor; scale(outputs) = outputs * scale;
  - unscale_: inv_scale = scale.double().reciprocal().float(); each gradient element x becomes
    x * inv_scale (computed in float; left as is when inv_scale == 1), and found_inf = 1 if any x was
    inf or NaN before scaling (_amp_foreach_non_finite_check_and_unscale_);
  - step: unscale_ unless done, then optimizer.step() unless found_inf (per optimizer);
  - update: found_inf = the sum over the optimizers' flags, then _amp_update_scale_:
        if found_inf: scale = float(double(scale) * backoff_factor); growth_tracker = 0
        else: successful = growth_tracker + 1
              if successful == growth_interval:
                  new_scale = float(double(scale) * growth_factor)
                  if isfinite(new_scale): scale = new_scale
                  growth_tracker = 0
              else: growth_tracker = successful
    update(new_scale) only fills the scale (the tracker is kept).
The optimizers, schedulers and clip_grad_norm_ are PyTorch's own (CPU, single-tensor paths).

Equivalences: frugal's OffloadAdamW is compared with torch.optim.AdamW; its WarmupCosineLR with
SequentialLR([LinearLR(start_factor, 1, warmup_steps), CosineAnnealingLR(total_steps - warmup_steps,
eta_min)], [warmup_steps]) (CosineAnnealingLR(total_steps) when warmup_steps is 0).

Left out (frugal lacks them, or has no PyTorch peer): clip_grad_value_, clip_grad_norm_'s
error_if_nonfinite and norm_type 0 or -inf, the optimizers' foreach/fused/differentiable flags and
Adam's capturable (CUDA only), GaLoreAdamW, schedulers other than the five above, 16-bit parameters
(frugal keeps float32 state for them by design, PyTorch keeps the parameter's dtype), and
zero_grad()'s default (set_to_none is False in 1.13, True in 2.x and frugal: both are tested explicitly),
and float32 gradients whose squares overflow float32 (PyTorch 1.13's CPU norm accumulates in float32 and
returns inf, then zeroes every gradient; frugal accumulates in float64, on purpose, and clips them).

Regenerate (a dev-time tool: Debian's PyTorch, CPU only; never a dependency of frugal or CI):

    apt-get install -y python3-torch
    /usr/bin/python3 tools/torch_golden_optim.py          # writes tests/golden/optim_torch.safetensors
    /usr/bin/python3 tools/torch_golden_optim.py --out /tmp/optim.safetensors

The output is deterministic (seeded); the file stays under 1 MB.
"""
import argparse
import json
import os
import sys
import warnings

import torch

from golden_safetensors import STORE, save_safetensors

SEED = 20240614
DTYPES = {"float32": torch.float32, "float64": torch.float64}
INF = float("inf")
NAN = float("nan")


# ---- optimizers and schedulers from a case's settings (frugal's option names) -----------------

DEFAULTS = {
    "SGD": {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False,
            "maximize": False},
    "Adam": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
             "maximize": False},
    "AdamW": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2, "amsgrad": False,
              "maximize": False},
    "OffloadAdamW": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2,
                     "maximize": False},
}


def torch_group(spec, gs, params):
    """A torch param group of a frugal spec's group (every hyperparameter resolved)."""
    kind = spec["type"]
    h = dict(DEFAULTS[kind])
    h.update(spec.get("options", {}))
    h.update({k: v for k, v in gs.items() if k not in ("params", "add_at")})
    d = {"params": [params[i] for i in gs["params"]], "lr": h["lr"], "weight_decay": h["weight_decay"],
         "maximize": h["maximize"]}
    if kind == "SGD":
        d.update(momentum=h["momentum"], dampening=h["dampening"], nesterov=h["nesterov"])
    else:
        d.update(betas=(h["beta1"], h["beta2"]), eps=h["eps"], amsgrad=h.get("amsgrad", False))
    return d


def torch_optimizer(spec, params):
    """torch.optim's peer of a frugal optimizer spec: {type, options, groups: [{params, overrides}]}.
    A group with "add_at": s joins by add_param_group before step s (see Gen.trajectory)."""
    kind = spec["type"]
    opts = dict(DEFAULTS[kind])
    opts.update(spec.get("options", {}))
    groups = [torch_group(spec, gs, params) for gs in spec["groups"] if "add_at" not in gs]
    if kind == "SGD":
        return torch.optim.SGD(groups, lr=opts["lr"], foreach=False)
    if kind == "Adam":
        return torch.optim.Adam(groups, foreach=False)
    return torch.optim.AdamW(groups, foreach=False)  # AdamW and OffloadAdamW


def torch_scheduler(spec, opt):
    """torch.optim.lr_scheduler's peer of a frugal scheduler spec."""
    S = torch.optim.lr_scheduler
    t = spec["type"]
    if t == "StepLR":
        return S.StepLR(opt, step_size=spec["step_size"], gamma=spec["gamma"])
    if t == "CosineAnnealingLR":
        return S.CosineAnnealingLR(opt, T_max=spec["T_max"], eta_min=spec["eta_min"])
    if t == "LinearLR":
        return S.LinearLR(opt, start_factor=spec["start_factor"], end_factor=spec["end_factor"],
                          total_iters=spec["total_iters"])
    if t == "SequentialLR":
        subs = [torch_scheduler(s, opt) for s in spec["schedulers"]]
        return S.SequentialLR(opt, subs, milestones=spec["milestones"])
    if t == "WarmupCosineLR":  # the composition frugal's closed form stands for
        w, total = spec["warmup_steps"], spec["total_steps"]
        cos = {"type": "CosineAnnealingLR", "T_max": total - w, "eta_min": spec["eta_min"]}
        if w == 0:
            return torch_scheduler(cos, opt)
        lin = {"type": "LinearLR", "start_factor": spec["start_factor"], "end_factor": 1.0, "total_iters": w}
        return torch_scheduler({"type": "SequentialLR", "schedulers": [lin, cos], "milestones": [w]}, opt)
    raise ValueError(t)


def sched_text(spec):
    """A short description of a scheduler spec, for case names."""
    t = spec["type"]
    if t == "SequentialLR":
        return "SequentialLR([%s], milestones=%s)" % (", ".join(sched_text(s) for s in spec["schedulers"]),
                                                      spec["milestones"])
    return "%s(%s)" % (t, ", ".join("%s=%s" % (k, v) for k, v in spec.items() if k != "type"))


# ---- GradScaler: torch.cuda.amp.GradScaler's algorithm on the CPU (see the docstring) ---------

class RefScaler:
    def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval, enabled=True):
        self.enabled = enabled  # disabled: scale() returns the loss, step() just steps, update() does nothing
        self.scale = torch.full((), init_scale if enabled else 1.0, dtype=torch.float32)
        self.tracker = torch.zeros((), dtype=torch.int32)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.per_opt = {}

    def scale_loss(self, loss):
        return loss * self.scale if self.enabled else loss

    def unscale_(self, opt):
        if not self.enabled:
            return
        assert id(opt) not in self.per_opt
        inv = self.scale.double().reciprocal().float()
        found = torch.zeros((), dtype=torch.float32)
        with torch.no_grad():
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if not bool(torch.isfinite(p.grad).all()):
                        found.fill_(1.0)
                    if float(inv) != 1.0:
                        p.grad.mul_(inv)  # float32 * float32 0-d: computed in float
        self.per_opt[id(opt)] = found

    def step(self, opt):
        """Returns whether the step was skipped."""
        if not self.enabled:
            opt.step()
            return False
        if id(opt) not in self.per_opt:
            self.unscale_(opt)
        if float(self.per_opt[id(opt)]) == 0.0:
            opt.step()
            return False
        return True

    def update(self, new_scale=None):
        if not self.enabled:
            return
        if new_scale is not None:
            self.scale.fill_(new_scale)
        else:
            found = sum(float(f) for f in self.per_opt.values())
            if found:  # _amp_update_scale_, AmpKernels.cu
                self.scale = torch.tensor(float(self.scale) * self.backoff_factor, dtype=torch.float32)
                self.tracker.fill_(0)
            else:
                successful = int(self.tracker) + 1
                if successful == self.growth_interval:
                    new = torch.tensor(float(self.scale) * self.growth_factor, dtype=torch.float32)
                    if bool(torch.isfinite(new)):
                        self.scale = new
                    self.tracker.fill_(0)
                else:
                    self.tracker.fill_(successful)
        self.per_opt = {}


# ---- the generator ---------------------------------------------------------------------------

class Gen:
    def __init__(self, seed):
        self.rng = torch.Generator().manual_seed(seed)
        self.tensors, self.cases, self.counts = {}, [], {}

    def vals(self, shape, lo=-1.0, hi=1.0, dtype=torch.float32):
        t = torch.rand(shape, generator=self.rng, dtype=torch.float64) * (hi - lo) + lo
        return t.to(dtype)

    def put(self, cid, what, t):
        assert t.dtype in STORE, t.dtype
        self.tensors["%s.%s" % (cid, what)] = t.detach().clone()

    def put_state(self, cid, opts):
        """Each optimizer's state_dict()["state"] as o<j>.state.<i>.<name>."""
        for j, o in enumerate(opts):
            for i, st in o.state_dict()["state"].items():
                for n, v in st.items():
                    if v is None:  # SGD without momentum keeps momentum_buffer = None
                        continue
                    self.put(cid, "o%d.state.%d.%s" % (j, i, n), v.to(torch.float64) if n == "step" else v)

    def new_case(self, kind, family, name, **fields):
        cid = "c%03d" % len(self.cases)
        c = {"id": cid, "kind": kind, "family": family, "name": name}
        c.update(fields)
        self.cases.append(c)
        self.counts[family] = self.counts.get(family, 0) + 1
        return cid, c

    # -- optimizer trajectories ----------------------------------------------------------------
    def trajectory(self, family, name, optimizers, shapes, steps=8, dtype="float32", absent=(), zero_grad=None,
                   clip=None, sched=None, resume_at=None, grad_layout=None, param_layout=None, grad_range=(-1, 1)):
        """absent: (step, param) pairs whose gradient is None; zero_grad: {step: "none" | "zeros"}."""
        dt = DTYPES[dtype]
        fields = {"optimizers": optimizers, "shapes": [list(s) for s in shapes], "steps": steps, "dtype": dtype}
        if zero_grad:
            fields["zero_grad"] = {str(k): v for k, v in zero_grad.items()}
        if clip:
            fields["clip"] = clip
        if sched:
            fields["scheduler"] = sched
        if resume_at:
            fields["resume_at"] = resume_at
        if grad_layout:
            fields["grad_layout"] = {str(k): v for k, v in grad_layout.items()}
        if param_layout:
            fields["param_layout"] = {str(k): v for k, v in param_layout.items()}
        cid, _ = self.new_case("optim", family, name, **fields)

        params = []
        for k, s in enumerate(shapes):
            p = self.vals(s, dtype=dt)
            self.put(cid, "p%d" % k, p)
            params.append(p.clone().requires_grad_(True))
        opts = [torch_optimizer(spec, params) for spec in optimizers]
        scheduler = torch_scheduler(sched, opts[0]) if sched else None
        lrs = [[g["lr"] for g in opts[0].param_groups]]
        norms = []
        for s in range(1, steps + 1):
            for k, p in enumerate(params):
                if (s, k) in absent:
                    p.grad = None
                    continue
                g = self.vals(tuple(shapes[k]), *grad_range, dtype=dt)
                self.put(cid, "g%d.%d" % (s, k), g)
                p.grad = g.clone()
            for spec, o in zip(optimizers, opts):
                for gs in spec["groups"]:
                    if gs.get("add_at") == s:
                        o.add_param_group(torch_group(spec, gs, params))
            if zero_grad and s in zero_grad:
                for o in opts:
                    o.zero_grad(set_to_none=zero_grad[s] == "none")
            if clip:
                n = torch.nn.utils.clip_grad_norm_(params, clip["max_norm"], norm_value(clip["norm_type"]))
                norms.append(float(n))
            for o in opts:
                o.step()
            if scheduler:
                scheduler.step()
                lrs.append([g["lr"] for g in opts[0].param_groups])
            for k, p in enumerate(params):
                self.put(cid, "x%d.%d" % (s, k), p)
        if clip:
            self.put(cid, "norm", torch.tensor(norms, dtype=torch.float64))
        if sched:
            self.put(cid, "lr", torch.tensor(lrs, dtype=torch.float64))
        self.put_state(cid, opts)

    # -- LR schedules --------------------------------------------------------------------------
    def schedule(self, name, sched, steps=30, base_lrs=(0.1, 0.02), resume_at=None):
        """sched: a spec, or a list of specs made on one optimizer and stepped back to back (chained)."""
        chain = sched if isinstance(sched, list) else [sched]
        fields = {"chain": chain, "steps": steps, "base_lrs": list(base_lrs)}
        if resume_at:
            fields["resume_at"] = resume_at
        cid, _ = self.new_case("sched", "sched", name or sched_text(chain[0]), **fields)
        ps = [torch.zeros(1, requires_grad=True) for _ in base_lrs]
        opt = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(ps, base_lrs)], lr=base_lrs[0])
        scheds = [torch_scheduler(spec, opt) for spec in chain]
        lrs = [[g["lr"] for g in opt.param_groups]]
        for _ in range(steps):
            opt.step()
            for s in scheds:
                s.step()
            lrs.append([g["lr"] for g in opt.param_groups])
        self.put(cid, "lr", torch.tensor(lrs, dtype=torch.float64))

    # -- clip_grad_norm_ -----------------------------------------------------------------------
    def clip(self, name, grads, max_norm, norm_type, dtype="float32", grad_layout=None):
        """grads: per parameter a shape (random gradient), a tensor, or ("none", shape)."""
        dt = DTYPES[dtype]
        shapes, gs = [], []
        for g in grads:
            if isinstance(g, tuple) and g and g[0] == "none":
                shapes.append(list(g[1]))
                gs.append(None)
            elif isinstance(g, torch.Tensor):
                shapes.append(list(g.shape))
                gs.append(g.to(dt))
            else:
                shapes.append(list(g))
                gs.append(self.vals(tuple(g), -2, 2, dt))
        fields = {"shapes": shapes, "dtype": dtype, "max_norm": max_norm, "norm_type": norm_type}
        if grad_layout:
            fields["grad_layout"] = {str(k): v for k, v in grad_layout.items()}
        cid, _ = self.new_case("clip", "clip", name, **fields)
        params = []
        for k, (s, g) in enumerate(zip(shapes, gs)):
            p = torch.zeros(s, dtype=dt, requires_grad=True)
            if g is not None:
                self.put(cid, "g%d" % k, g)
                p.grad = g.clone()
            params.append(p)
        n = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_value(norm_type))
        self.put(cid, "norm", torch.tensor(float(n), dtype=torch.float64))
        for k, p in enumerate(params):
            if p.grad is not None:
                self.put(cid, "out%d" % k, p.grad)

    # -- GradScaler loops ----------------------------------------------------------------------
    def scaler(self, name, options, optimizers, shapes, coeffs, unscale=False, clip=None, new_scale=None,
               resume_at=None, check_grads=True):
        """coeffs[s - 1][k]: parameter k's loss coefficient at step s: None (no part), a tensor, or
        (big, nan) for a random one with `big` at element 0 and NaN at the last element when nan."""
        steps = len(coeffs)
        fields = {"options": options, "optimizers": optimizers, "shapes": [list(s) for s in shapes],
                  "steps": steps, "dtype": "float32", "unscale": unscale, "check_grads": check_grads}
        if clip:
            fields["clip"] = clip
        if new_scale:
            fields["new_scale"] = {str(k): v for k, v in new_scale.items()}
        if resume_at:
            fields["resume_at"] = resume_at
        cid, _ = self.new_case("scaler", "scaler", name, **fields)
        params = []
        for k, s in enumerate(shapes):
            p = self.vals(s)
            self.put(cid, "p%d" % k, p)
            params.append(p.clone().requires_grad_(True))
        opts = [torch_optimizer(spec, params) for spec in optimizers]
        sc = RefScaler(options["init_scale"], options["growth_factor"], options["backoff_factor"],
                       options["growth_interval"], options.get("enabled", True))
        scales, trackers, skipped, norms = [float(sc.scale)], [int(sc.tracker)], [], []
        for s in range(1, steps + 1):
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss = None
            for k, p in enumerate(params):
                c = coeffs[s - 1][k]
                if c is None:
                    continue
                if isinstance(c, tuple):
                    big, nan = c
                    c = self.vals(tuple(shapes[k]))
                    flat = c.view(-1)
                    if big is not None:
                        flat[0] = big
                    if nan:
                        flat[-1] = NAN
                self.put(cid, "c%d.%d" % (s, k), c)
                term = (p * c).sum()
                loss = term if loss is None else loss + term
            sc.scale_loss(loss).backward()
            if unscale:
                for o in opts:
                    sc.unscale_(o)
            if clip:
                n = torch.nn.utils.clip_grad_norm_(params, clip["max_norm"], norm_value(clip["norm_type"]))
                norms.append(float(n))
            skipped.append([int(sc.step(o)) for o in opts])
            sc.update(new_scale.get(s) if new_scale else None)
            scales.append(float(sc.scale))
            trackers.append(int(sc.tracker))
            for k, p in enumerate(params):
                if p.grad is not None:
                    self.put(cid, "ug%d.%d" % (s, k), p.grad)
                self.put(cid, "x%d.%d" % (s, k), p)
        self.put_state(cid, opts)
        self.put(cid, "scale", torch.tensor(scales, dtype=torch.float64))
        self.put(cid, "tracker", torch.tensor(trackers, dtype=torch.int64))
        self.put(cid, "skipped", torch.tensor(skipped, dtype=torch.int64))
        if clip:
            self.put(cid, "norm", torch.tensor(norms, dtype=torch.float64))


def norm_value(n):
    return INF if n == "inf" else float(n)


def one(kind, options=None, groups=None, n=3):
    """An optimizer spec: all n parameters in one group unless `groups` says otherwise."""
    return {"type": kind, "options": options or {}, "groups": groups or [{"params": list(range(n))}]}


SHAPES = [(4, 3), (5,), ()]  # a matrix, a vector, a 0-d parameter


# ---- the cases -------------------------------------------------------------------------------

def sgd_cases(g):
    for o in [{"lr": 0.1}, {"lr": 0.1, "momentum": 0.9}, {"lr": 0.05, "momentum": 0.9, "dampening": 0.3},
              {"lr": 0.05, "momentum": 0.9, "nesterov": True}, {"lr": 0.1, "momentum": 0.5, "weight_decay": 0.05},
              {"lr": 0.1, "momentum": 0.8, "weight_decay": 0.02, "maximize": True},
              {"lr": 0.1, "momentum": 0.7, "dampening": 0.5, "weight_decay": 0.1, "maximize": True}]:
        g.trajectory("sgd", "SGD %s" % json.dumps(o), [one("SGD", o)], SHAPES)
    g.trajectory("sgd", "SGD nesterov + weight_decay, float64", [one("SGD", {"lr": 0.05, "momentum": 0.9,
                                                                              "nesterov": True,
                                                                              "weight_decay": 0.01})],
                 SHAPES, dtype="float64")
    g.trajectory("sgd", "SGD momentum, transposed parameter and transposed gradients",
                 [one("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01})], SHAPES,
                 param_layout={0: "transposed"}, grad_layout={0: "transposed"})
    g.trajectory("sgd", "SGD param groups: nesterov lr 0.1 / plain lr 0.01 + weight_decay / dampening",
                 [one("SGD", {"lr": 0.1, "momentum": 0.9},
                      [{"params": [0], "nesterov": True}, {"params": [1], "lr": 0.01, "momentum": 0.0,
                                                           "weight_decay": 0.1},
                       {"params": [2], "lr": 0.3, "dampening": 0.5}])], SHAPES)
    g.trajectory("sgd", "SGD momentum, gradients absent on some steps (skipped; no buffer until the first)",
                 [one("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.05})], SHAPES,
                 absent={(1, 1), (2, 1), (3, 0), (5, 2), (6, 0), (6, 2)})
    g.trajectory("sgd", "SGD momentum, zero_grad(set_to_none=False) steps with zero gradients, "
                        "zero_grad(set_to_none=True) skips",
                 [one("SGD", {"lr": 0.1, "momentum": 0.9})], SHAPES, zero_grad={3: "zeros", 4: "zeros", 6: "none"})
    g.trajectory("sgd", "SGD momentum, an empty parameter [0, 3] among the others",
                 [one("SGD", {"lr": 0.1, "momentum": 0.9}, n=4)], SHAPES + [(0, 3)])
    g.trajectory("sgd", "SGD, a param group added by add_param_group before step 4 (momentum, nesterov)",
                 [one("SGD", {"lr": 0.1, "momentum": 0.9},
                      [{"params": [0, 1]}, {"params": [2], "add_at": 4, "lr": 0.05, "nesterov": True}])], SHAPES)
    g.trajectory("sgd", "SGD momentum + dampening, resumed from a state_dict after step 4",
                 [one("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01})], SHAPES,
                 resume_at=4, absent={(2, 2)})


def adam_cases(g):
    for o in [{"lr": 0.01}, {"lr": 0.02, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6},
              {"lr": 0.01, "weight_decay": 0.1}, {"lr": 0.01, "amsgrad": True},
              {"lr": 0.01, "maximize": True}, {"lr": 0.01, "beta1": 0.0, "beta2": 0.5},
              {"lr": 0.01, "amsgrad": True, "maximize": True, "weight_decay": 0.05}]:
        g.trajectory("adam", "Adam %s" % json.dumps(o), [one("Adam", o)], SHAPES)
    g.trajectory("adam", "Adam amsgrad + maximize + weight_decay, float64",
                 [one("Adam", {"lr": 0.01, "amsgrad": True, "maximize": True, "weight_decay": 0.05})], SHAPES,
                 dtype="float64")
    g.trajectory("adam", "Adam amsgrad, gradients of shrinking size (max_exp_avg_sq holds the max)",
                 [one("Adam", {"lr": 0.05, "amsgrad": True, "beta2": 0.9})], SHAPES, grad_range=(-0.05, 0.05))
    g.trajectory("adam", "Adam, gradients absent on some steps (per-parameter step counts and bias corrections)",
                 [one("Adam", {"lr": 0.01, "weight_decay": 0.01})], SHAPES,
                 absent={(1, 0), (2, 0), (3, 1), (4, 2), (5, 2), (6, 2), (7, 0)})
    g.trajectory("adam", "Adam param groups with different lrs, betas, eps, amsgrad",
                 [one("Adam", {"lr": 0.01},
                      [{"params": [0, 2], "amsgrad": True, "beta1": 0.5},
                       {"params": [1], "lr": 0.003, "beta2": 0.9, "eps": 1e-4, "weight_decay": 0.2}])], SHAPES)
    g.trajectory("adam", "Adam, transposed parameter and gradients",
                 [one("Adam", {"lr": 0.01, "amsgrad": True})], SHAPES,
                 param_layout={0: "transposed"}, grad_layout={0: "transposed"})
    g.trajectory("adam", "Adam amsgrad, zero_grad(set_to_none=False) steps with zero gradients",
                 [one("Adam", {"lr": 0.01, "amsgrad": True})], SHAPES, zero_grad={2: "zeros", 5: "none", 6: "zeros"})
    g.trajectory("adam", "Adam amsgrad, an empty parameter [0, 3] among the others",
                 [one("Adam", {"lr": 0.01, "amsgrad": True}, n=4)], SHAPES + [(0, 3)])
    g.trajectory("adam", "Adam, a param group added by add_param_group before step 3, resumed after step 5",
                 [one("Adam", {"lr": 0.01},
                      [{"params": [0]}, {"params": [1, 2], "add_at": 3, "lr": 0.03, "amsgrad": True}])], SHAPES,
                 resume_at=5)
    g.trajectory("adam", "Adam amsgrad, resumed from a state_dict after step 3",
                 [one("Adam", {"lr": 0.01, "amsgrad": True, "weight_decay": 0.01})], SHAPES, resume_at=3,
                 absent={(5, 1)})


def adamw_cases(g):
    for o in [{"lr": 0.01}, {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True},
              {"lr": 0.01, "weight_decay": 0.0}, {"lr": 0.01, "maximize": True, "weight_decay": 0.1},
              {"lr": 0.05, "beta1": 0.95, "beta2": 0.95, "eps": 1e-3, "weight_decay": 0.5}]:
        g.trajectory("adamw", "AdamW %s" % json.dumps(o), [one("AdamW", o)], SHAPES)
    g.trajectory("adamw", "AdamW amsgrad + weight_decay, float64",
                 [one("AdamW", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True})], SHAPES, dtype="float64")
    g.trajectory("adamw", "AdamW param groups: decay / no decay, another lr",
                 [one("AdamW", {"lr": 0.01, "weight_decay": 0.1},
                      [{"params": [0]}, {"params": [1, 2], "weight_decay": 0.0, "lr": 0.03}])], SHAPES)
    g.trajectory("adamw", "AdamW, gradients absent on some steps",
                 [one("AdamW", {"lr": 0.01, "weight_decay": 0.1})], SHAPES, absent={(1, 2), (2, 2), (4, 0)})
    g.trajectory("adamw", "AdamW, resumed from a state_dict after step 5",
                 [one("AdamW", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True})], SHAPES, resume_at=5)


def offload_cases(g):
    g.trajectory("offload", "OffloadAdamW vs AdamW {lr 0.01, weight_decay 0.1}",
                 [one("OffloadAdamW", {"lr": 0.01, "weight_decay": 0.1})], SHAPES)
    g.trajectory("offload", "OffloadAdamW vs AdamW, maximize, betas, eps",
                 [one("OffloadAdamW", {"lr": 0.02, "maximize": True, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6})],
                 SHAPES)
    g.trajectory("offload", "OffloadAdamW vs AdamW, param groups and absent gradients",
                 [one("OffloadAdamW", {"lr": 0.01},
                      [{"params": [0, 1]}, {"params": [2], "lr": 0.05, "weight_decay": 0.0}])], SHAPES,
                 absent={(1, 1), (3, 0), (3, 2)})
    g.trajectory("offload", "OffloadAdamW vs AdamW, resumed from a state_dict after step 4",
                 [one("OffloadAdamW", {"lr": 0.01, "weight_decay": 0.05})], SHAPES, resume_at=4)


def sched_cases(g):
    g.schedule("", {"type": "StepLR", "step_size": 4, "gamma": 0.5})
    g.schedule("", {"type": "StepLR", "step_size": 1, "gamma": 0.9})
    g.schedule("StepLR resumed after step 13", {"type": "StepLR", "step_size": 5, "gamma": 0.3}, resume_at=13)
    g.schedule("CosineAnnealingLR past T_max (3 half periods)", {"type": "CosineAnnealingLR", "T_max": 10,
                                                                 "eta_min": 0.0})
    g.schedule("CosineAnnealingLR with eta_min, past T_max", {"type": "CosineAnnealingLR", "T_max": 7,
                                                              "eta_min": 0.001})
    g.schedule("CosineAnnealingLR T_max=1", {"type": "CosineAnnealingLR", "T_max": 1, "eta_min": 0.0}, steps=8)
    g.schedule("CosineAnnealingLR T_max=2 with eta_min", {"type": "CosineAnnealingLR", "T_max": 2, "eta_min": 0.01},
               steps=10)
    g.schedule("CosineAnnealingLR resumed after step 9", {"type": "CosineAnnealingLR", "T_max": 12,
                                                          "eta_min": 0.005}, resume_at=9)
    g.schedule("", {"type": "LinearLR", "start_factor": 1.0 / 3.0, "end_factor": 1.0, "total_iters": 5})
    g.schedule("LinearLR decaying", {"type": "LinearLR", "start_factor": 1.0, "end_factor": 0.1, "total_iters": 8})
    g.schedule("", {"type": "LinearLR", "start_factor": 0.25, "end_factor": 0.75, "total_iters": 10})
    lin = {"type": "LinearLR", "start_factor": 0.1, "end_factor": 1.0, "total_iters": 5}
    cos = {"type": "CosineAnnealingLR", "T_max": 20, "eta_min": 1e-4}
    g.schedule("", {"type": "SequentialLR", "schedulers": [lin, cos], "milestones": [5]})
    g.schedule("SequentialLR(LinearLR, CosineAnnealingLR) resumed after step 7 (past the milestone)",
               {"type": "SequentialLR", "schedulers": [lin, cos], "milestones": [5]}, resume_at=7)
    g.schedule("", {"type": "SequentialLR",
                    "schedulers": [{"type": "LinearLR", "start_factor": 0.5, "end_factor": 1.0, "total_iters": 3},
                                   {"type": "StepLR", "step_size": 2, "gamma": 0.5},
                                   {"type": "CosineAnnealingLR", "T_max": 8, "eta_min": 0.0}],
                    "milestones": [3, 10]})
    g.schedule("", {"type": "SequentialLR",
                    "schedulers": [{"type": "StepLR", "step_size": 3, "gamma": 0.5},
                                   {"type": "LinearLR", "start_factor": 0.2, "end_factor": 1.0, "total_iters": 4}],
                    "milestones": [7]})
    for w, total, sf, eta in [(5, 20, 0.01, 1e-4), (3, 10, 1e-3, 0.0), (0, 12, 1e-3, 0.001), (1, 25, 0.5, 0.0)]:
        spec = {"type": "WarmupCosineLR", "warmup_steps": w, "total_steps": total, "start_factor": sf,
                "eta_min": eta}
        g.schedule(sched_text(spec) + " vs torch " + ("SequentialLR(LinearLR, CosineAnnealingLR)" if w else
                                                      "CosineAnnealingLR") + ", past total_steps", spec)
    # Chaining: schedulers made on one optimizer and stepped back to back, each applied to the lr the
    # one before it left (torch.optim's documentation, "How to adjust learning rate").
    g.schedule("chained StepLR(step_size=10, gamma=0.1) and LinearLR warmup (0.1 -> 1 over 5), both stepped",
               [{"type": "StepLR", "step_size": 10, "gamma": 0.1},
                {"type": "LinearLR", "start_factor": 0.1, "end_factor": 1.0, "total_iters": 5}])
    g.schedule("WarmupCosineLR resumed after step 4 (inside the warmup)",
               {"type": "WarmupCosineLR", "warmup_steps": 6, "total_steps": 24, "start_factor": 0.1,
                "eta_min": 0.0}, resume_at=4)


def clip_cases(g):
    for dtype in ("float32", "float64"):
        for nt in (2, 1, 3, 0.5, "inf"):
            g.clip("clip_grad_norm_ norm_type=%s clips (%s)" % (nt, dtype),
                   [(4, 3), (5,), (), ("none", (2, 2)), (6,)], 1.0, nt, dtype)
        g.clip("clip_grad_norm_ norm_type=2, max_norm above the norm: unchanged (%s)" % dtype,
               [(4, 3), (5,)], 100.0, 2, dtype)
    g.clip("clip_grad_norm_ norm_type=2, transposed gradient", [(4, 3), (3, 5)], 0.5, 2, grad_layout={1: "transposed"})
    g.clip("clip_grad_norm_ norm_type=inf, transposed gradient", [(4, 3), (3, 5)], 0.5, "inf",
           grad_layout={1: "transposed"})
    g.clip("clip_grad_norm_ of zero gradients (coefficient max_norm / 1e-6, clamped to 1)",
           [torch.zeros(3, 2), torch.zeros(4)], 1.0, 2)
    g.clip("clip_grad_norm_ max_norm 0: every gradient becomes 0", [(4, 3), (5,)], 0.0, 2)
    g.clip("clip_grad_norm_ with an empty gradient", [(0, 3), (5,)], 0.5, 2)
    g.clip("clip_grad_norm_, no parameter has a gradient: returns 0", [("none", (2,)), ("none", (3,))], 1.0, 2)
    inf_g = torch.tensor([1.0, -INF, 0.5, 2.0])
    nan_g = torch.tensor([1.0, NAN, 0.5, -2.0])
    for nt in (2, "inf", 1):
        g.clip("clip_grad_norm_ norm_type=%s, an inf gradient (inf norm, gradients * 0)" % nt,
               [(3,), inf_g], 1.0, nt)
        g.clip("clip_grad_norm_ norm_type=%s, a NaN gradient (NaN norm and gradients)" % nt,
               [(3,), nan_g], 1.0, nt)


def scaler_cases(g):
    opts = {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3}
    # per step: a coefficient per parameter; (big, nan): element 0 set to big, the last to NaN if nan.
    clean = (None, False)
    over = (1e34, False)  # 1e34 * 65536 overflows float32; once the scale is below 3.4e4 it does not
    nan = (None, True)
    seq = [[clean, clean, clean], [clean, clean, clean], [clean, clean, clean], [clean, over, clean],
           [clean, clean, nan], [clean, clean, clean], [clean, None, clean], [clean, clean, clean],
           [over, clean, clean], [clean, clean, clean], [clean, clean, clean], [clean, clean, clean]]
    g.scaler("GradScaler + SGD momentum: growth every 3 clean steps, backoff on overflow and NaN", opts,
             [one("SGD", {"lr": 0.05, "momentum": 0.9})], SHAPES, seq)
    g.scaler("GradScaler + Adam, explicit unscale_ then clip_grad_norm_ (inf and NaN norms on skipped steps)",
             opts, [one("Adam", {"lr": 0.01})], SHAPES, seq, unscale=True, clip={"max_norm": 1.0, "norm_type": 2})
    g.scaler("GradScaler + AdamW, non power-of-two factors (float32 rounding of the scale)",
             {"init_scale": 1000.0, "growth_factor": 3.0, "backoff_factor": 0.3, "growth_interval": 2},
             [one("AdamW", {"lr": 0.01, "weight_decay": 0.1})], SHAPES,
             [[clean, clean, clean], [clean, clean, clean], [(1e36, False), clean, clean],
              [clean, clean, clean], [clean, clean, clean], [clean, clean, nan], [clean, clean, clean],
              [clean, clean, clean], [clean, (3e35, False), clean], [clean, clean, clean]])
    g.scaler("GradScaler growth interval 1, growth stops below float32's overflow",
             {"init_scale": 2.0 ** 125, "growth_factor": 4.0, "backoff_factor": 0.5, "growth_interval": 1},
             [one("SGD", {"lr": 0.1})], SHAPES, [[(1e-3, False)] * 3] * 5)
    g.scaler("GradScaler update(new_scale) keeps the growth tracker", opts,
             [one("SGD", {"lr": 0.05, "momentum": 0.5})], SHAPES,
             seq[:3] + [[clean, (1e38, False), clean]] + seq[4:8], new_scale={2: 1024.0, 6: 8.0})
    g.scaler("GradScaler with two optimizers: each skips on its own inf, the update sees both", opts,
             [one("SGD", {"lr": 0.05, "momentum": 0.9}, [{"params": [0]}]),
              one("Adam", {"lr": 0.01}, [{"params": [1, 2]}])], SHAPES, seq)
    g.scaler("GradScaler + Adam amsgrad, scaler and optimizer resumed from state_dicts after step 5", opts,
             [one("Adam", {"lr": 0.01, "amsgrad": True})], SHAPES, seq, resume_at=5)
    g.scaler("GradScaler(enabled=False): scale 1, nothing unscaled, a NaN step is not skipped",
             dict(opts, enabled=False), [one("SGD", {"lr": 0.05, "momentum": 0.5})], SHAPES,
             [[clean, clean, clean]] * 4 + [[clean, clean, nan], [clean, clean, clean]])
    g.scaler("GradScaler + OffloadAdamW vs AdamW (unscaled inside its step)", opts,
             [one("OffloadAdamW", {"lr": 0.01, "weight_decay": 0.1})], SHAPES, seq, check_grads=False)


def loop_cases(g):
    g.trajectory("loop", "AdamW + WarmupCosineLR + clip_grad_norm_(1.0): a transformer's training loop",
                 [one("AdamW", {"lr": 0.01, "weight_decay": 0.1},
                      [{"params": [0]}, {"params": [1, 2], "weight_decay": 0.0}])], SHAPES, steps=12,
                 clip={"max_norm": 1.0, "norm_type": 2}, grad_range=(-2, 2),
                 sched={"type": "WarmupCosineLR", "warmup_steps": 3, "total_steps": 10, "start_factor": 0.1,
                        "eta_min": 0.001})
    g.trajectory("loop", "SGD nesterov + StepLR + clip_grad_norm_(inf norm), resumed after step 5",
                 [one("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3})], SHAPES,
                 steps=10, clip={"max_norm": 0.5, "norm_type": "inf"}, resume_at=5,
                 sched={"type": "StepLR", "step_size": 3, "gamma": 0.5})
    g.trajectory("loop", "Adam + SequentialLR(LinearLR, CosineAnnealingLR), resumed after step 6 (past the milestone)",
                 [one("Adam", {"lr": 0.02, "amsgrad": True})], SHAPES, steps=10, resume_at=6,
                 sched={"type": "SequentialLR", "milestones": [4],
                        "schedulers": [{"type": "LinearLR", "start_factor": 0.25, "end_factor": 1.0,
                                        "total_iters": 4},
                                       {"type": "CosineAnnealingLR", "T_max": 6, "eta_min": 0.0}]})


def build(seed=SEED):
    g = Gen(seed)
    for f in (sgd_cases, adam_cases, adamw_cases, offload_cases, sched_cases, clip_cases, scaler_cases, loop_cases):
        f(g)
    return g


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "golden", "optim_torch.safetensors"))
    args = ap.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # the sums of clip_grad_norm_ in one order
    warnings.filterwarnings("ignore", category=UserWarning)  # the schedulers' step-order warnings
    torch.use_deterministic_algorithms(True)
    g = build()
    meta = {"cases": json.dumps(g.cases, separators=(",", ":"), allow_nan=False),
            "generator": "tools/torch_golden_optim.py", "torch": torch.__version__, "seed": str(SEED),
            "count": str(len(g.cases))}
    save_safetensors(os.path.normpath(args.out), g.tensors, meta)
    size = os.path.getsize(args.out)
    print("%d cases, %d tensors, %d bytes -> %s" % (len(g.cases), len(g.tensors), size, os.path.normpath(args.out)))
    for fam, n in g.counts.items():
        print("  %-8s %d" % (fam, n))
    if size > 1_000_000:
        sys.exit("the golden file is over 1 MB: shrink the cases")


if __name__ == "__main__":
    main()
