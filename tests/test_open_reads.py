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

import minihop
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


# == helper "memo": a tensor forward memoises in a global, changed before backward ============
# Forward's tensor written below a global or a cell is read by backward from that place when
# backward runs (tracer/backward_reads.py ``stand_in``), as eager reads it.

CACHE: dict[Any, torch.Tensor] = {}


class _DeviceCache(Function):
    """A cache keyed by (size, device), as rotary-embedding code keys its tables."""

    @staticmethod
    def forward(ctx, t):
        key = (t.shape[-1], str(t.device))
        if key not in CACHE:
            CACHE[key] = torch.linspace(0.5, 2.0, t.shape[-1])
        ctx.key = key
        return t * CACHE[key]

    @staticmethod
    def backward(ctx, g):
        return g * CACHE[ctx.key]


def test_cache_keyed_by_size_and_device_replaced_or_popped_before_backward():
    def mid(i):
        if i == 0:
            CACHE[(4, "cpu")] = torch.full((4,), 3.0)
        elif i == 1:
            CACHE.pop((4, "cpu"))
        elif i == 3:
            CACHE[(4, "cpu")] = torch.full((3, 1), -2.0)  # another shape: broadcasts otherwise

    eager_modes.matches_eager(_DeviceCache, lambda i: (_fixed(i),), steps=5, mid=mid,
                              state=lambda: sorted(CACHE), reset=CACHE.clear)


class _ClassMemo(Function):
    """The table memoised on the Function's own class."""

    _table: torch.Tensor | None = None

    @staticmethod
    def forward(ctx, t):
        _ClassMemo._table = t.detach().abs() + 1.0
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * _ClassMemo._table


def test_class_attribute_memo_replaced_before_backward():
    def mid(i):
        if i % 2:
            _ClassMemo._table = torch.full((3, 4), 0.25 * i)

    def reset():
        _ClassMemo._table = None

    eager_modes.matches_eager(_ClassMemo, lambda i: (_fixed(i),), mid=mid, reset=reset)


LOCAL = __import__("threading").local()


class _LocalSlot(Function):
    @staticmethod
    def forward(ctx, t):
        LOCAL.mask = (t.detach() > 0).float()
        return t.relu()

    @staticmethod
    def backward(ctx, g):
        return g * LOCAL.mask


def test_thread_local_slot_replaced_or_deleted_before_backward():
    """``del LOCAL.mask``: eager's backward raises AttributeError with its own message."""
    def mid(i):
        if i == 1:
            LOCAL.mask = torch.ones(3, 4)
        elif i == 2:
            del LOCAL.mask

    def reset():
        LOCAL.__dict__.clear()

    eager_modes.matches_eager(_LocalSlot, lambda i: (_fixed(i),), mid=mid, reset=reset)


HIST: list[torch.Tensor] = []


class _History(Function):
    @staticmethod
    def forward(ctx, t):
        HIST.append(t.detach() * 0.5)
        return t * 3.0

    @staticmethod
    def backward(ctx, g):
        return g * HIST[-1]


def test_list_memo_appended_to_before_backward():
    """``HIST[-1]`` in backward: the caller's item appended after forward's, or forward's."""
    def mid(i):
        if i in (1, 2):
            HIST.append(torch.full((3, 4), 2.0 + i))

    eager_modes.matches_eager(_History, lambda i: (_fixed(i),), mid=mid,
                              state=lambda: len(HIST), reset=HIST.clear)


STASH = types.SimpleNamespace(obj=None)


class _Stash2(Function):
    @staticmethod
    def forward(ctx, t):
        STASH.obj = t.detach() * 3.0
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * STASH.obj


def test_memo_overwritten_by_a_second_forward_before_the_first_backward():
    """Two outputs alive: the second forward overwrites the memo, then the first's backward
    runs (eager: with the second call's table), then the second's."""
    def run(mode):
        STASH.obj = None
        call = eager_modes.caller(mode, _Stash2)
        records = []
        for step in range(3):
            a, b = _fixed(step), torch.linspace(2.0, 3.0, 12).reshape(3, 4).requires_grad_()
            out_a = call(a)
            out_b = call(b)
            out_a.sum().backward()
            if step == 1:
                STASH.obj = torch.full((3, 4), 7.0)
            out_b.sum().backward()
            records.append((out_a.detach(), out_b.detach(), a.grad, b.grad))
        return records

    eager = run("eager")
    for mode in eager_modes.MODES:
        minihop.reset()
        eager_modes.same(eager, run(mode), mode)


def test_memo_deleted_before_backward_raises_eagers_error():
    """``del STASH.obj``: the same AttributeError as eager's, in every mode."""
    def run(mode):
        STASH.obj = None
        out = eager_modes.caller(mode, _Stash2)(_fixed(0))
        del STASH.obj
        try:
            out.sum().backward()
        except AttributeError as e:
            return str(e)
        finally:
            STASH.obj = None
        return None

    eager = run("eager")
    assert eager is not None
    for mode in eager_modes.MODES:
        minihop.reset()
        assert run(mode) == eager, mode
