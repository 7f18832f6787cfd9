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

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.errors import SideEffectError

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


class _DictPick(Function):
    @staticmethod
    def forward(ctx, t, parts):
        ctx.parts = parts
        return t * parts["a"]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.parts["b"], None


def test_dict_key_backward_reads_deleted_before_backward():
    """Eager's backward raises KeyError where the caller deleted the key it reads."""
    box: list[Any] = []

    def make(i):
        box[:] = [{"a": torch.full((4,), 2.0), "b": torch.full((4,), 3.0 + i)}]
        return (_fixed(i), box[0])

    def mid(i):
        if i == 1:
            del box[0]["b"]

    eager_modes.matches_eager(_DictPick, make, mid=mid, refusable=False)


def test_list_on_ctx_popped_before_backward():
    box: list[Any] = []

    def make(i):
        box[:] = [[torch.full((4,), 2.0), torch.full((4,), 4.0 + i)]]
        return (_fixed(i), box[0])

    def mid(i):
        if i % 2:
            box[0].pop()

    eager_modes.matches_eager(_ListTail, make, mid=mid, refusable=False)


class _NestedTail(Function):
    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.opts = inputs[1]

    @staticmethod
    def forward(t, opts):
        return t * opts["ws"][0]

    @staticmethod
    def backward(ctx, g):
        return g * sum(w.sum() for w in ctx.opts["ws"]) + ctx.opts["ws"][-1], None


def test_list_inside_a_dict_on_ctx_appended_before_backward():
    """setup_context style; backward iterates the list and takes its last item."""
    box: list[Any] = []

    def make(i):
        box[:] = [{"ws": [torch.full((4,), 1.0)], "tag": "x"}]
        return (_fixed(i), box[0])

    def mid(i):
        if i >= 1:
            box[0]["ws"].append(torch.full((4,), 0.5 * i))

    eager_modes.matches_eager(_NestedTail, make, mid=mid, refusable=False)


class _Extras(Function):
    @staticmethod
    def forward(ctx, t, cfg):
        ctx.cfg = cfg
        return t * cfg.w

    @staticmethod
    def backward(ctx, g):
        extra = ctx.cfg.extras.get("bias")
        return (g * ctx.cfg.w if extra is None else g * ctx.cfg.w + extra), None


def test_dict_on_an_object_on_ctx_gains_a_key_before_backward():
    import types as _types
    box: list[Any] = []

    def make(i):
        box[:] = [_types.SimpleNamespace(w=torch.full((4,), 2.0), extras={})]
        return (_fixed(i), box[0])

    def mid(i):
        if i in (1, 3):
            box[0].extras["bias"] = torch.full((4,), float(i))

    eager_modes.matches_eager(_Extras, make, mid=mid, refusable=False)


# -- a backward traced again that reads a tensor the captured one did not ------------------------

W_ONE = torch.full((4,), 2.0)
W_TWO = torch.full((2, 4), 3.0)


def _by_one(g: torch.Tensor) -> torch.Tensor:
    return g * W_ONE


def _by_two(g: torch.Tensor) -> torch.Tensor:
    return g * W_TWO.sum(0)


HELPER: Any = _by_one


class _Helped(Function):
    @staticmethod
    def forward(ctx, t):
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return HELPER(g)


def test_helper_rebound_before_backward_reads_another_global_tensor():
    """The caller swaps backward's helper between forward and backward; the new helper reads
    a global tensor the captured backward never read (forward did not pass it)."""
    global HELPER

    def between(i):
        global HELPER
        HELPER = _by_one

    def mid(i):
        global HELPER
        if i in (1, 3):
            HELPER = _by_two
        if i == 3:
            W_TWO.mul_(2.0)

    try:
        eager_modes.matches_eager(_Helped, lambda i: (_fixed(i),), between=between, mid=mid,
                                  reset=lambda: W_TWO.fill_(3.0), refusable=False)
    finally:
        HELPER = _by_one
        W_TWO.fill_(3.0)


HIST: list[torch.Tensor] = []


class _LastOfGlobal(Function):
    @staticmethod
    def forward(ctx, t):
        return t * HIST[-1]

    @staticmethod
    def backward(ctx, g):
        return g * HIST[-1]


def test_global_list_grown_before_backward_twice_in_a_row():
    """Backward reads HIST[-1] of a global list the caller appends to before backward (calls
    1 and 2: two lengths in a row, each a new last item), then not (call 3)."""
    def reset():
        HIST[:] = [torch.full((4,), 2.0)]

    def mid(i):
        if i in (1, 2):
            HIST.append(torch.full((4,), 3.0 + i))

    eager_modes.matches_eager(_LastOfGlobal, lambda i: (_fixed(i),), mid=mid, reset=reset,
                              refusable=False)


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


class _CachedInForward(Function):
    @staticmethod
    def forward(ctx, t):
        w = _table(t.shape[1])
        ctx.save_for_backward(w)
        return t * w

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        return g * w


def _rebind_base(i: int) -> None:
    global BASE
    if i == 2:
        BASE = torch.full((4,), 3.0)


def _reset_base() -> None:
    global BASE
    BASE = torch.ones(4)
    _table.cache_clear()


@pytest.mark.parametrize("fn_cls, between", [
    (_Cached, _rebind_base),
    (_Cached, lambda i: BASE.mul_(3.0) if i == 2 else None),
    (_CachedInForward, _rebind_base),
], ids=["rebound", "written-in-place", "saved-for-backward"])
def test_lru_cached_tensor_is_stale_after_its_global_changes(fn_cls, between):
    """BASE changes after the table was cached (rebound, or written in place; the table read
    in backward, or saved for it): eager keeps returning the table cached from the old BASE."""
    try:
        eager_modes.matches_eager(fn_cls, lambda i: (_fixed(i),), between=between, reset=_reset_base)
    finally:
        _reset_base()


SCALE = 2.0


@functools.cache
def _ramp(n: int) -> torch.Tensor:
    return torch.arange(float(n)) * SCALE


class _Ramped(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.n = t.shape[1]
        return t * _ramp(t.shape[1])

    @staticmethod
    def backward(ctx, g):
        return g * _ramp(ctx.n)


def test_functools_cache_reading_a_global_number_that_changes():
    """functools.cache spelling; SCALE changes between calls (eager keeps the cached ramp)."""

    def between(i):
        global SCALE
        SCALE = 2.0 + (i >= 2)

    def reset():
        global SCALE
        SCALE = 2.0
        _ramp.cache_clear()

    try:
        eager_modes.matches_eager(_Ramped, lambda i: (_fixed(i),), between=between, reset=reset)
    finally:
        reset()


@functools.lru_cache(maxsize=4)
def _tril(n: int, scale: float) -> torch.Tensor:
    return torch.ones(n, n).tril() * scale


class _Lower(Function):
    @staticmethod
    def forward(ctx, t, scale):
        ctx.scale = scale
        return _tril(t.shape[0], scale) @ t

    @staticmethod
    def backward(ctx, g):
        return _tril(g.shape[0], ctx.scale).t() @ g, None


def test_lru_cached_tensor_of_its_arguments_alone_is_captured():
    """A cached function of its arguments alone (torch only): captured, never refused."""
    eager_modes.matches_eager(_Lower, lambda i: (_fixed(i), [1.0, 2.0, 1.0, 0.5][i]),
                              state=lambda: _tril.cache_info()[:], reset=_tril.cache_clear, refusable=False)


def test_lru_cache_refusal_names_the_state_it_reads():
    _ramp.cache_clear()
    with pytest.raises(SideEffectError, match=r"MH106.*_ramp.*SCALE"):
        minihop.capture(_Ramped, _fixed(0))
    _ramp.cache_clear()


# -- found while working ---------------------------------------------------------------------------

CONF = types.SimpleNamespace(s=1.0)


@functools.lru_cache(maxsize=None)
def _steps(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + 1


class _SizedCache(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2 + g * _steps(g.shape[0]) + g * CONF.s


def test_cached_helper_called_with_a_size_in_a_backward_traced_again():
    """Sizes 3, 4, 3: dynamic from call 1; CONF.s changes before each backward, so backward is
    traced again, and its call of the cached helper took the symbolic size (TypeError: unhashable
    SymInt when replayed, also in fallback mode; effects fuzz seed 1082)."""
    def make(i):
        return (torch.linspace(-1.0, 1.0, [3, 4, 3, 3][i]).requires_grad_(),)

    def mid(i):
        CONF.s = CONF.s * 2.0 + 0.5

    def reset():
        CONF.s = 1.0
        _steps.cache_clear()

    eager_modes.matches_eager(_SizedCache, make, mid=mid, reset=reset,
                              state=lambda: tuple(_steps.cache_info())[:2], refusable=False)
