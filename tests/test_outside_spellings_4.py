"""Red team, round 4 (issue 28: the same classes written differently, tried from outside):
Functions the suite had not met, crossing where state lives (a module argument, a bound method,
a class, a global holding a library function, a class tensor, a partial, an attrgetter, a memo,
a ContextVar, an iterator or deque on ctx, warnings and logging behind a flag, a saved random
state, ctx counters over several backwards, a frozen dataclass replaced on a holder, an enum
key, ``__slots__``, a property, ``__getattr__``, a submodule swapped, a hook added, a
``random.Random`` argument, an inner Function, a ``-0.0`` key, the default dtype, ``x.grad``)
× when it changes (between calls, between forward and ``.backward()``, over two backwards).

Four differed from eager before this round's fixes (a partial's keywords changed before
backward, an iterator on ctx over two backwards, a warning and a log line behind a flag set
before backward): ``tests/test_ctx_callables.py`` and ``tests/test_backward_standing.py`` hold
their focused tests. Each case here runs eagerly and in strict, apply and fallback mode
(``eager_modes.matches_eager``): equal records, or a coded refusal in strict and apply.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import enum
import functools
import operator
import random
import types
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import eager_modes

CASES: list[tuple[str, type, Callable[[int], tuple[Any, ...]], dict[str, Any]]] = []


def _case(name: str, fn_cls: type, make_args: Callable[[int], tuple[Any, ...]], **options: Any) -> None:
    CASES.append((name, fn_cls, make_args, options))


x3 = lambda i: (torch.arange(1.0, 4.0).requires_grad_(),)  # noqa: E731

# -- round 4, first batch --

# 1 module training read in backward via ctx, flipped before backward
drop = torch.nn.Dropout(0.5)
class ModTrain(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, m):
        ctx.m = m
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * (3.0 if ctx.m.training else 1.0), None
_case("module_training_bwd", ModTrain, lambda i: (torch.ones(3, requires_grad=True), drop),
      mid=lambda i: drop.train(i % 2 == 0), reset=lambda: drop.train())

# 2 bound method arg, object attr changed before backward
class Scaler:
    def __init__(self): self.k = 2.0
    def apply(self, t): return t * self.k
sc = Scaler()
class BoundBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, f):
        ctx.f = f
        return f(x)
    @staticmethod
    def backward(ctx, g):
        return ctx.f(g), None
_case("bound_method_bwd", BoundBwd, lambda i: (torch.ones(3, requires_grad=True), sc.apply),
      mid=lambda i: setattr(sc, "k", 2.0 + i), reset=lambda: setattr(sc, "k", 2.0))

# 3 class arg, class attribute changed before backward
class Cfg: scale = 2.0
class ClassBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cls):
        ctx.cls = cls
        return x * cls.scale
    @staticmethod
    def backward(ctx, g):
        return g * ctx.cls.scale, None
_case("class_attr_bwd", ClassBwd, lambda i: (torch.ones(3, requires_grad=True), Cfg),
      mid=lambda i: setattr(Cfg, "scale", 2.0 + i), reset=lambda: setattr(Cfg, "scale", 2.0))

# 5 global library fn rebound before backward
ACT = torch.relu
class GlobalFnBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2
    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * ACT(x - 2)
def _rebind(i):
    global ACT
    ACT = torch.tanh if i % 2 else torch.relu
_case("global_libfn_bwd", GlobalFnBwd, x3, mid=_rebind, reset=lambda: _rebind(0))

# 6 tensor class attribute replaced before backward
class ClsTensor(torch.autograd.Function):
    W = torch.ones(3)
    @staticmethod
    def forward(ctx, x):
        return x * ClsTensor.W
    @staticmethod
    def backward(ctx, g):
        return g * ClsTensor.W
_case("class_tensor_bwd", ClsTensor, x3, mid=lambda i: setattr(ClsTensor, "W", torch.full((3,), float(i + 1))),
      reset=lambda: setattr(ClsTensor, "W", torch.ones(3)))

# 7 partial on ctx, keywords mutated in place before backward
def surrogate(t, alpha=1.0): return t * alpha
P = functools.partial(surrogate, alpha=2.0)
class PartialBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fn):
        ctx.fn = fn
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return ctx.fn(g), None
_case("partial_kw_mutated_bwd", PartialBwd, lambda i: (torch.ones(3, requires_grad=True), P),
      mid=lambda i: P.keywords.__setitem__("alpha", 2.0 + i), reset=lambda: P.keywords.__setitem__("alpha", 2.0))

# 11 attrgetter on config in backward
CONF = types.SimpleNamespace(opt=types.SimpleNamespace(beta=0.5))
get_beta = operator.attrgetter("opt.beta")
class AttrGetterBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * get_beta(CONF)
_case("attrgetter_bwd", AttrGetterBwd, x3, mid=lambda i: setattr(CONF.opt, "beta", 0.5 * (i + 1)),
      reset=lambda: setattr(CONF.opt, "beta", 0.5))

# 12 setdefault memo in backward
MEMO = {}
class SetdefaultBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        t = MEMO.setdefault(g.shape[0], torch.arange(float(g.shape[0])))
        return g * t
_case("setdefault_bwd", SetdefaultBwd, x3, mid=lambda i: MEMO.clear() if i == 2 else MEMO.__setitem__(3, torch.full((3,), 5.0)) if i == 3 else None,
      reset=MEMO.clear, state=lambda: sorted((k, v.tolist()) for k, v in MEMO.items()))

# 13 contextvar read in backward
CV = contextvars.ContextVar("scale", default=1.0)
class CtxVarBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * CV.get()
_case("contextvar_bwd", CtxVarBwd, x3, mid=lambda i: CV.set(1.0 + i), reset=lambda: CV.set(1.0))

# 14 generator on ctx consumed in backward
class GenBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.it = iter([1.0, 2.0, 3.0])
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * next(ctx.it)
_case("iterator_on_ctx_bwd", GenBwd, x3, backwards=2)

# 15 deque on ctx (argument) mutated before backward
DQ = collections.deque([1.0, 2.0], maxlen=3)
class DequeBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dq):
        ctx.dq = dq
        return x * dq[-1]
    @staticmethod
    def backward(ctx, g):
        return g * ctx.dq[-1], None
_case("deque_arg_bwd", DequeBwd, lambda i: (torch.ones(3, requires_grad=True), DQ),
      mid=lambda i: DQ.append(float(i + 5)), reset=lambda: (DQ.clear(), DQ.extend([1.0, 2.0])), state=lambda: list(DQ))

# 16 warnings in backward on flag
FL = {"warn": False}
class WarnBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        if FL["warn"]:
            warnings.warn(f"grad norm {float(g.norm()):.2f}")
        return g * 2
_case("warn_flag_bwd", WarnBwd, x3, mid=lambda i: FL.update(warn=i == 2), reset=lambda: FL.update(warn=False))

# 17 logging in backward with value when flag
class LogBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        if FL["warn"]:
            eager_modes.LOG.info("bwd %s", g.shape[0])
        return g * 2
_case("log_flag_bwd", LogBwd, x3, mid=lambda i: FL.update(warn=i in (1, 2)), reset=lambda: FL.update(warn=False))

# 18 rng state saved in forward, restored in backward (checkpoint style)
class RngBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.state = torch.get_rng_state()
        return x * torch.rand(3)
    @staticmethod
    def backward(ctx, g):
        now = torch.get_rng_state()
        torch.set_rng_state(ctx.state)
        r = torch.rand(3)
        torch.set_rng_state(now)
        return g * r
_case("rng_checkpoint_bwd", RngBwd, x3)

# 19 ctx counter across 2 backwards
class CtxCount(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.k = 0
        return x * 2
    @staticmethod
    def backward(ctx, g):
        ctx.k += 1
        return g * ctx.k
_case("ctx_counter_2bwd", CtxCount, x3, backwards=3)

# 20 module eps changed between calls (global module)
LN = torch.nn.LayerNorm(3)
class ModEps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        with torch.enable_grad():
            pass
        return LN(x).detach() + x * 0
    @staticmethod
    def backward(ctx, g):
        return g * LN.eps * 1e5
_case("module_eps_global", ModEps, x3, between=lambda i: setattr(LN, "eps", 1e-5 * (i + 1)), reset=lambda: setattr(LN, "eps", 1e-5))

# -- round 4, second batch --

# a: frozen dataclass config arg replaced (dataclasses.replace) on a holder object between fwd/bwd
@dataclasses.dataclass(frozen=True)
class FrozenCfg:
    beta: float = 1.0
HOLD = types.SimpleNamespace(cfg=FrozenCfg())
class DCBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h):
        ctx.h = h
        return x * h.cfg.beta
    @staticmethod
    def backward(ctx, g):
        return g * ctx.h.cfg.beta, None
_case("dataclass_replace_bwd", DCBwd, lambda i: (torch.ones(3, requires_grad=True), HOLD),
      mid=lambda i: setattr(HOLD, "cfg", dataclasses.replace(HOLD.cfg, beta=1.0 + i)), reset=lambda: setattr(HOLD, "cfg", FrozenCfg()))

# b: enum member on ctx, class-level mapping changed
class Mode(enum.Enum):
    A = 1
    B = 2
TABLE = {Mode.A: 2.0, Mode.B: 3.0}
class EnumBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, m):
        ctx.m = m
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * TABLE[ctx.m], None
_case("enum_table_bwd", EnumBwd, lambda i: (torch.ones(3, requires_grad=True), Mode.A if i % 2 else Mode.B),
      mid=lambda i: TABLE.__setitem__(Mode.A, 2.0 + i), reset=lambda: TABLE.__setitem__(Mode.A, 2.0))

# c: __slots__ object arg mutated before backward
class Slotted:
    __slots__ = ("k",)
    def __init__(self): self.k = 2.0
SL = Slotted()
class SlotBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x * s.k
    @staticmethod
    def backward(ctx, g):
        return g * ctx.s.k, None
_case("slots_bwd", SlotBwd, lambda i: (torch.ones(3, requires_grad=True), SL), mid=lambda i: setattr(SL, "k", 2.0 + i), reset=lambda: setattr(SL, "k", 2.0))

# d: property on user object computed from mutable state read in backward
class Sched:
    def __init__(self): self.step = 0
    @property
    def lr(self): return 0.1 * (self.step + 1)
SC = Sched()
class PropBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * ctx.s.lr, None
_case("property_bwd", PropBwd, lambda i: (torch.ones(3, requires_grad=True), SC), mid=lambda i: setattr(SC, "step", i), reset=lambda: setattr(SC, "step", 0))

# e: __getattr__ object
class Dyn:
    def __init__(self): self.__dict__["store"] = {"alpha": 1.0}
    def __getattr__(self, k): return self.__dict__["store"][k]
DY = Dyn()
class GetattrBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, d):
        ctx.d = d
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return g * ctx.d.alpha, None
_case("getattr_obj_bwd", GetattrBwd, lambda i: (torch.ones(3, requires_grad=True), DY), mid=lambda i: DY.store.__setitem__("alpha", 1.0 + i), reset=lambda: DY.store.__setitem__("alpha", 1.0))

# f: nn.Module submodule swapped between fwd and bwd, backward calls ctx.mod.act
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.act = torch.nn.ReLU()
NET = Net()
class SubmodBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, m):
        ctx.m = m
        ctx.save_for_backward(x)
        return x * 2
    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * ctx.m.act(x - 2), None
_case("submodule_swap_bwd", SubmodBwd, lambda i: (torch.arange(1.0, 4.0).requires_grad_(), NET),
      mid=lambda i: setattr(NET, "act", torch.nn.Tanh() if i % 2 else torch.nn.ReLU()), reset=lambda: setattr(NET, "act", torch.nn.ReLU()))

# g: nn.Module hook registered between calls (forward pre hook on a module called inside forward)
LIN = torch.nn.Linear(3, 3)
class HookFwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        with torch.no_grad():
            return LIN(x) + x * 0
    @staticmethod
    def backward(ctx, g):
        return g
handles = []
def add_hook(i):
    if i == 2:
        handles.append(LIN.register_forward_hook(lambda m, a, o: o * 2))
def rm_hooks():
    while handles: handles.pop().remove()
_case("module_hook_added", HookFwd, x3, between=add_hook, reset=rm_hooks)

# h: random.Random instance arg drawn in forward
class RandArg(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, rng):
        return x * rng.random()
    @staticmethod
    def backward(ctx, g):
        return g, None
RG = random.Random(0)
_case("random_instance_arg", RandArg, lambda i: (torch.ones(3, requires_grad=True), RG), reset=lambda: RG.seed(0))

# i: inner Function apply whose global changes
SCALE = {"v": 2.0}
class Inner(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * SCALE["v"]
    @staticmethod
    def backward(ctx, g):
        return g * SCALE["v"]
class Outer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return Inner.apply(x) + 1
    @staticmethod
    def backward(ctx, g):
        return g * SCALE["v"] * 10
_case("inner_fn_global", Outer, x3, between=lambda i: SCALE.__setitem__("v", 2.0 + i), mid=lambda i: SCALE.__setitem__("v", 5.0 + i), reset=lambda: SCALE.__setitem__("v", 2.0))

# j: float key -0.0 in dict arg
class FloatKey(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, d):
        k = next(iter(d))
        return x * (2.0 if str(k).startswith("-") else 3.0)
    @staticmethod
    def backward(ctx, g):
        return g, None
_case("neg_zero_key", FloatKey, lambda i: (torch.ones(3, requires_grad=True), {(-0.0 if i % 2 else 0.0): 1}))

# k: default dtype change between calls
class DefDtype(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * torch.ones(3).sum()
    @staticmethod
    def backward(ctx, g):
        return g * torch.ones(3).sum()
def dd(i): torch.set_default_dtype(torch.float64 if i == 2 else torch.float32)
_case("default_dtype", DefDtype, x3, between=dd, reset=lambda: torch.set_default_dtype(torch.float32))

# l: x.grad read in forward
class ReadsGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * (1.0 if x.grad is None else 2.0)
    @staticmethod
    def backward(ctx, g):
        return g
XL = torch.ones(3, requires_grad=True)
_case("reads_x_grad", ReadsGrad, lambda i: (XL,), reset=lambda: setattr(XL, "grad", None))


@pytest.mark.parametrize(("fn_cls", "make_args", "options"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_eager(fn_cls: type, make_args: Callable[[int], tuple[Any, ...]], options: dict[str, Any]) -> None:
    torch.set_default_dtype(torch.float32)
    try:
        eager_modes.matches_eager(fn_cls, make_args, **options)
    finally:
        torch.set_default_dtype(torch.float32)
        rm_hooks()
