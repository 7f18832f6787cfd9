"""The cases the second red team left open (docs/reads.md), each as a user writes it: state
read through a mutable holder that changes between forward and ``.backward()`` (a list or dict
argument kept on ctx, a global memo, ctx itself across two backwards), a global alias of a
library module rebound, and a cached helper's stale value. Each runs through eager, strict,
apply and fallback mode (``eager_modes.matches_eager``): equal records or a coded refusal."""

from __future__ import annotations

import functools
import math
import types
from typing import Any

import torch
from torch.autograd import Function

import eager_modes  # tests/ is on the path (pytest prepends a test file's directory)


def _fixed(i: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, 12).reshape(3, 4).requires_grad_()


# -- a list or dict argument kept on ctx, changed by the caller before backward -----------------

class _ListTail(Function):
    @staticmethod
    def forward(ctx, t, ws):
        ctx.ws = ws
        return t * ws[0]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.ws[-1], None


def test_list_of_tensors_on_ctx_appended_before_backward():
    """ws[-1] in backward is the item the caller appended after forward."""
    box: list[Any] = []

    def make(i):
        box[:] = [[torch.full((4,), 2.0)]]
        return (_fixed(i), box[0])

    def mid(i):
        if i != 1:
            box[0].append(torch.full((4,), 5.0 + i))

    eager_modes.matches_eager(_ListTail, make, mid=mid)


class _FloatTail(Function):
    @staticmethod
    def forward(ctx, t, scales):
        ctx.scales = scales
        return t * scales[0]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scales[-1] * len(ctx.scales), None


def test_list_of_floats_on_ctx_appended_before_backward():
    box: list[Any] = []

    def make(i):
        box[:] = [[2.0]]
        return (_fixed(i), box[0])

    def mid(i):
        if i % 2 == 0:
            box[0].append(3.0 + i)

    eager_modes.matches_eager(_FloatTail, make, mid=mid)


class _DictSum(Function):
    @staticmethod
    def forward(ctx, t, parts):
        ctx.parts = parts
        return t * parts["a"]

    @staticmethod
    def backward(ctx, g):
        total = g
        for key in sorted(ctx.parts):
            total = total + ctx.parts[key]
        return total, None


def test_dict_on_ctx_gains_a_key_before_backward():
    """Backward sums every value; the caller adds "b" after forward (some calls)."""
    box: list[Any] = []

    def make(i):
        box[:] = [{"a": torch.full((4,), 2.0)}]
        return (_fixed(i), box[0])

    def mid(i):
        if i in (1, 2):
            box[0]["b"] = torch.full((4,), 10.0 * i)

    eager_modes.matches_eager(_DictSum, make, mid=mid, refusable=False)


def test_dict_on_ctx_loses_a_key_before_backward():
    box: list[Any] = []

    def make(i):
        box[:] = [{"a": torch.full((4,), 2.0), "b": torch.full((4,), 3.0)}]
        return (_fixed(i), box[0])

    def mid(i):
        if i == 2:
            del box[0]["b"]

    eager_modes.matches_eager(_DictSum, make, mid=mid, refusable=False)


# -- ctx written in backward, backward run twice -----------------------------------------------

class _Counter(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.calls = 0
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        ctx.calls += 1
        return g * ctx.calls


def test_ctx_counter_in_backward_run_twice():
    """retain_graph=True: the second backward sees calls == 2, as eager's ctx holds it."""
    eager_modes.matches_eager(_Counter, lambda i: (_fixed(i),), backwards=2, refusable=False)


class _Trail(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.trail = []
        return t.sin()

    @staticmethod
    def backward(ctx, g):
        (ctx.trail).append(len(ctx.trail))
        return g * t_cos(ctx) * float(len(ctx.trail))


def t_cos(ctx: Any) -> float:
    return 1.0 + 0.5 * sum(ctx.trail)


def test_ctx_list_grown_in_backward_run_three_times():
    eager_modes.matches_eager(_Trail, lambda i: (_fixed(i),), backwards=3, refusable=False)


# -- a tensor forward memoises in a global, changed before backward -----------------------------

ROTARY: dict[int, torch.Tensor] = {}


class _Rotary(Function):
    @staticmethod
    def forward(ctx, t):
        n = t.shape[0]
        if n not in ROTARY:
            ROTARY[n] = torch.arange(float(n)).unsqueeze(-1).cos()
        ctx.n = n
        return t * ROTARY[n]

    @staticmethod
    def backward(ctx, g):
        return g * ROTARY[ctx.n]


def test_memo_cleared_before_backward():
    """The caller clears the memo between forward and backward: eager's backward raises
    KeyError (call 1); call 2 refills it with another table before backward."""
    def mid(i):
        if i == 1:
            ROTARY.clear()
        elif i == 2:
            ROTARY[3] = torch.full((3, 1), 7.0)

    eager_modes.matches_eager(_Rotary, lambda i: (_fixed(i),), mid=mid,
                              state=lambda: sorted(ROTARY), reset=ROTARY.clear)


STATE = types.SimpleNamespace(obj=None)


class _Stash(Function):
    @staticmethod
    def forward(ctx, t):
        STATE.obj = t.detach() * 3.0
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * STATE.obj


def test_tensor_stashed_on_a_global_object_replaced_before_backward():
    def mid(i):
        if i % 2:
            STATE.obj = torch.full((3, 4), 0.5 + i)

    def reset():
        STATE.obj = None

    eager_modes.matches_eager(_Stash, lambda i: (_fixed(i),), mid=mid, reset=reset)


# -- a global alias of a library module, rebound ------------------------------------------------

class _Shim:
    """Stands in for ``math`` (a user's own numerics module)."""

    @staticmethod
    def cos(v: float) -> float:
        return 0.25 + v


MATHLIB: Any = math


class _AliasScale(Function):
    @staticmethod
    def forward(ctx, t, p):
        ctx.c = MATHLIB.cos(p)
        return t * ctx.c

    @staticmethod
    def backward(ctx, g):
        return g * ctx.c * MATHLIB.cos(0.0), None


def test_global_alias_of_a_module_rebound():
    global MATHLIB

    def between(i):
        global MATHLIB
        MATHLIB = _Shim if i == 2 else math

    def mid(i):
        global MATHLIB
        if i == 3:
            MATHLIB = _Shim

    try:
        eager_modes.matches_eager(_AliasScale, lambda i: (_fixed(i), 0.5), between=between, mid=mid)
    finally:
        MATHLIB = math


# -- a cached helper's stale value ---------------------------------------------------------------

BASE = torch.ones(4)


@functools.lru_cache(maxsize=None)
def _table(n: int) -> torch.Tensor:
    return BASE * n


class _Cached(Function):
    @staticmethod
    def forward(ctx, t):
        return t * _table(t.shape[0])

    @staticmethod
    def backward(ctx, g):
        return g * _table(g.shape[0])


def test_lru_cached_tensor_is_stale_after_its_global_changes():
    """Eager keeps returning the table cached from the old BASE."""
    global BASE

    def between(i):
        global BASE
        if i == 2:
            BASE = torch.full((4,), 3.0)

    def reset():
        global BASE
        BASE = torch.ones(4)
        _table.cache_clear()

    try:
        eager_modes.matches_eager(_Cached, lambda i: (_fixed(i),), between=between, reset=reset)
    finally:
        reset()


# -- modalias: names holding modules, rebound (tracer/module_reads, runtime/module_reads) -------

import math as m  # noqa: E402  (the alias is the case: ``import math as m``, then ``globals()["m"] = shim``)
import torch.nn.functional as F  # noqa: E402  (``F``: the alias nearly every Function reads)


def _shim_module(name: str, **attrs: Any) -> types.ModuleType:
    """A user's own module (built at run time, as a plugin or a test double is)."""
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


_MSHIM = _shim_module("mshim", cos=lambda v: 0.5 + v, sqrt=lambda v: 2.0 * v)


class _AliasSqrt(Function):
    @staticmethod
    def forward(ctx, t, p):
        ctx.s = m.sqrt(p)
        return t * ctx.s

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s * m.cos(0.0), None


def test_import_as_alias_rebound_through_globals():
    """``import math as m``; the caller swaps ``globals()["m"]`` between calls and before backward."""
    def between(i):
        globals()["m"] = _MSHIM if i == 1 else math

    def mid(i):
        if i == 2:
            globals()["m"] = _MSHIM

    try:
        eager_modes.matches_eager(_AliasSqrt, lambda i: (_fixed(i), 2.25), between=between, mid=mid)
    finally:
        globals()["m"] = math


class _Cfg:
    lib: Any = math


class _ClassHeldModule(Function):
    @staticmethod
    def forward(ctx, t, p):
        return t * _Cfg.lib.cos(p)

    @staticmethod
    def backward(ctx, g):
        return g * _Cfg.lib.cos(0.5), None


def test_module_on_a_class_attribute_rebound():
    """``class Cfg: lib = math``; ``Cfg.lib = shim`` between calls and before backward."""
    def between(i):
        _Cfg.lib = _MSHIM if i == 1 else math

    def mid(i):
        if i == 3:
            _Cfg.lib = _MSHIM

    try:
        eager_modes.matches_eager(_ClassHeldModule, lambda i: (_fixed(i), 0.25), between=between, mid=mid)
    finally:
        _Cfg.lib = math


def _cell_function() -> tuple[type, Any]:
    lib: Any = math

    class CellHeld(Function):
        @staticmethod
        def forward(ctx, t, p):
            return t * lib.cos(p)

        @staticmethod
        def backward(ctx, g):
            return g * lib.cos(1.0), None

    def rebind(new: Any) -> None:
        nonlocal lib
        lib = new

    return CellHeld, rebind


def test_module_in_a_closure_cell_rebound():
    """A Function built in a factory reads ``lib`` from its closure; the factory rebinds it."""
    fn, rebind = _cell_function()

    def between(i):
        rebind(_MSHIM if i in (1, 3) else math)

    def mid(i):
        if i == 2:
            rebind(_MSHIM)

    eager_modes.matches_eager(fn, lambda i: (_fixed(i), 0.75), between=between, mid=mid)


# numpy-style: ``import mynum as np``, a user module whose attributes change.
unum = _shim_module("unum", SCALE=2.0, act=lambda v: v * 3.0)


class _UserModuleAttrs(Function):
    @staticmethod
    def forward(ctx, t):
        return unum.act(t) * unum.SCALE

    @staticmethod
    def backward(ctx, g):
        return unum.act(g) * unum.SCALE


def test_user_module_attributes_change():
    """A user module's function and constant replaced between calls and before backward."""
    def between(i):
        unum.SCALE = 2.0 + (i == 1)
        unum.act = (lambda v: v * 5.0) if i == 3 else (lambda v: v * 3.0)

    def mid(i):
        if i == 2:
            unum.act = lambda v: v - 1.0

    def reset():
        unum.SCALE, unum.act = 2.0, (lambda v: v * 3.0)

    try:
        eager_modes.matches_eager(_UserModuleAttrs, lambda i: (_fixed(i),), between=between, mid=mid, reset=reset)
    finally:
        reset()


_FSHIM = _shim_module("fshim", relu=lambda t: t * 0.5, silu=torch.tanh)


class _FunctionalAlias(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return F.relu(t)

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return F.silu(g) * (t > 0)


def test_functional_alias_swapped_for_a_shim_module():
    """``import torch.nn.functional as F``; a test double module put in ``F``'s place."""
    def between(i):
        globals()["F"] = _FSHIM if i in (1, 2) else torch.nn.functional

    def mid(i):
        if i == 3:
            globals()["F"] = _FSHIM

    try:
        eager_modes.matches_eager(_FunctionalAlias, lambda i: (_fixed(i),), between=between, mid=mid)
    finally:
        globals()["F"] = torch.nn.functional


class _ModuleArgument(Function):
    @staticmethod
    def forward(ctx, t, lib, p):
        ctx.lib = lib
        return t * lib.cos(p) * lib.SCALE

    @staticmethod
    def backward(ctx, g):
        return g * ctx.lib.cos(0.0) * ctx.lib.SCALE, None, None


def test_module_passed_as_an_argument():
    """A module passed in (keyed by identity); the user module's constant changes between
    calls and before backward (read inside it: guarded as a place)."""
    lib = _shim_module("passedlib", cos=math.cos, SCALE=2.0)
    other = _shim_module("otherlib", cos=lambda v: 0.5 - v, SCALE=1.0)

    def make(i):
        return (_fixed(i), other if i == 0 else lib, 0.5)

    def between(i):
        lib.SCALE = 3.0 if i == 2 else 2.0

    def mid(i):
        if i == 3:
            lib.SCALE = 4.0

    eager_modes.matches_eager(_ModuleArgument, make, between=between, mid=mid)
