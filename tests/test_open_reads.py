"""The cases the second red team left open (docs/reads.md), each as a user writes it: state
read through a mutable holder that changes between forward and ``.backward()`` (a list or dict
argument kept on ctx, a global memo, ctx itself across two backwards), a global alias of a
library module rebound, and a cached helper's stale value. Each runs through eager, strict,
apply and fallback mode (``eager_modes.matches_eager``): equal records or a coded refusal."""

from __future__ import annotations

import functools
import math
import sys
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


def test_memo_dict_written_in_forward_read_in_backward():
    """A rotary-table memo: forward fills ROTARY[n], backward reads it back (sizes 3 and 4)."""
    eager_modes.matches_eager(_Rotary, lambda i: (torch.randn(3 + i % 2, 4).requires_grad_(),),
                              state=lambda: sorted(ROTARY), reset=ROTARY.clear)


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


def test_names_holding_modules_are_one_assumption():
    """All of a capture's module-holding names are one record (one identity check per call),
    each listed by ``explain``; backward's are checked again when backward runs; a capture
    called after a rebinding names the place and both modules."""
    from minihop.errors import GuardMismatchError

    x = _fixed(0)
    cap = minihop.capture(_FunctionalAlias, x)
    forward = [a for a in cap.assumptions if a.place == "names holding modules"]
    assert len(forward) == 1 and forward[0].phase == "forward"
    assert "F is module torch.nn.functional" in forward[0].show()
    # (and the library function backward calls through it: F.silu, by identity too)
    # (and, since round 22, the names silu's own code resolved: torch.nn.functional's)
    backward_names = [a.place for a in cap.assumptions if a.phase == "backward" and "module" in a.description]
    assert backward_names[:2] == ["F", "F.silu"] and all(n.startswith("torch.nn.functional") for n in backward_names[2:])
    assert "F is module torch.nn.functional" in str(minihop.explain(_FunctionalAlias, x))
    try:
        globals()["F"] = _FSHIM
        assert not cap.fits((x,))
        with pytest.raises(GuardMismatchError, match=r"F holds another module.*torch\.nn\.functional.*fshim"):
            cap(x)
    finally:
        globals()["F"] = torch.nn.functional
    assert cap.fits((x,))
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


MEMO_HIST: list[torch.Tensor] = []


class _History(Function):
    @staticmethod
    def forward(ctx, t):
        MEMO_HIST.append(t.detach() * 0.5)
        return t * 3.0

    @staticmethod
    def backward(ctx, g):
        return g * MEMO_HIST[-1]


def test_list_memo_appended_to_before_backward():
    """``MEMO_HIST[-1]`` in backward: the caller's item appended after forward's, or forward's."""
    def mid(i):
        if i in (1, 2):
            MEMO_HIST.append(torch.full((3, 4), 2.0 + i))

    eager_modes.matches_eager(_History, lambda i: (_fixed(i),), mid=mid,
                              state=lambda: len(MEMO_HIST), reset=MEMO_HIST.clear)


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


def test_memo_of_dynamic_sizes_read_by_backward_is_refused_and_falls_back():
    """Captured with dynamic sizes, the memo's tensor has symbolic sizes: a read of its place
    when backward runs cannot be given sizes of its own, so strict refuses (MH106, naming
    ``STASH.obj``) and fallback runs eagerly; sizes 3, 4, 5, each replaced before backward."""
    def run(call):
        STASH.obj = None
        grads = []
        for n in (3, 4, 5):
            x = torch.linspace(0.0, 1.0, n).requires_grad_()
            out = call(x)
            STASH.obj = torch.full((n,), 7.0 + n)
            out.sum().backward()
            grads.append(x.grad)
        return grads

    eager = run(_Stash2.apply)
    minihop.reset()
    with pytest.raises(SideEffectError, match=r"MH106.*STASH\.obj"):
        run(minihop.function(_Stash2, dynamic=True))
    minihop.reset()
    eager_modes.same(eager, run(minihop.function(_Stash2, dynamic=True, fallback="eager")), "fallback")


# -- ctxwrites: backward writes ctx, and backward runs again (retain_graph) ----------------------
# Eager's second backward reads what the first left on ctx; minihop keys backward on the plain
# values on ctx (``PythonState.ctx_state``) and traces a bwd from them.

class _CountGetattr(Function):
    @staticmethod
    def forward(ctx, t):
        return t * 3.0

    @staticmethod
    def backward(ctx, g):
        ctx.n_backward = getattr(ctx, "n_backward", 0) + 1  # forward never set it
        return g * (3.0 / ctx.n_backward)


def test_ctx_counter_created_by_getattr_in_backward():
    eager_modes.matches_eager(_CountGetattr, lambda i: (_fixed(i),), backwards=3, refusable=False)


class _DictCount(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.counts = {"bwd": 0, "fwd": 1}
        return t.exp()

    @staticmethod
    def backward(ctx, g):
        ctx.counts["bwd"] += 1
        return g * float(ctx.counts["bwd"] + ctx.counts["fwd"])


def test_ctx_dict_counter_in_backward():
    eager_modes.matches_eager(_DictCount, lambda i: (_fixed(i),), backwards=3, refusable=False)


class _Popper(Function):
    @staticmethod
    def forward(ctx, t, k):
        ctx.stack = [float(j + 1) for j in range(k)]
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        scale = ctx.stack.pop()
        return g * scale, None


def test_ctx_list_popped_in_backward():
    """Each backward pops the next scale; the stack's length is a call argument."""
    eager_modes.matches_eager(_Popper, lambda i: (_fixed(i), 3 + i % 2), backwards=3, refusable=False)


class _FirstTime(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        ctx.seen = False
        return t * t

    @staticmethod
    def backward(ctx, g):
        if ctx.seen:  # the second backward takes the other branch, reading the saved input
            (t,) = ctx.saved_tensors
            return g * t
        ctx.seen = True
        return g * 2.0


def test_ctx_flag_set_in_backward_switches_the_next_backward():
    eager_modes.matches_eager(_FirstTime, lambda i: (_fixed(i),), backwards=3, refusable=False)


class _Countdown(Function):
    @staticmethod
    def forward(ctx, t, k):
        ctx.left = k
        ctx.history = ()
        return t.sin()

    @staticmethod
    def backward(ctx, g):
        ctx.left -= 1
        ctx.history = (*ctx.history, ctx.left)
        return g * float(ctx.left * len(ctx.history)), None


def test_ctx_countdown_from_an_argument_with_a_tuple_history():
    """``ctx.left`` starts from a call argument (one capture per ``k``), and a tuple on ctx is
    rebuilt by each backward."""
    eager_modes.matches_eager(_Countdown, lambda i: (_fixed(i), 5 + i), backwards=2, refusable=False)




class _SizeCountdown(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.n = t.shape[0]
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        ctx.n -= 1
        return g * float(ctx.n)


def _two_backwards(call: Any, n: int) -> list[float]:
    x = torch.ones(n, requires_grad=True)
    y = call(x)
    seen = []
    for _ in range(2):
        y.sum().backward(retain_graph=True)
        seen.append(x.grad[0].item())
        x.grad = None
    return seen


def test_ctx_symbolic_size_written_in_backward_is_refused():
    """dynamic=True: ``ctx.n`` is a symbol, no value to trace the second backward from: strict
    refuses (MH106) at capture; fallback runs eagerly and equals eager."""
    import pytest

    import minihop
    from minihop.errors import SideEffectError

    with pytest.raises(SideEffectError, match="ctx.n"):
        _two_backwards(minihop.function(_SizeCountdown, dynamic=True), 3)
    fallback = minihop.function(_SizeCountdown, dynamic=True, fallback="eager")
    for n in (3, 4, 5):
        assert _two_backwards(fallback, n) == _two_backwards(_SizeCountdown.apply, n) == [n - 1.0, n - 2.0]


def test_ctx_writing_capture_is_not_saved(tmp_path):
    """A loaded artifact cannot trace backward again: saving refuses (MH102) rather than run
    the first backward's bwd for the second."""
    import pytest

    import minihop
    from minihop.errors import UnsupportedOutputError

    cap = minihop.capture(_Counter, _fixed(0))
    with pytest.raises(UnsupportedOutputError, match="writes ctx"):
        cap.save(str(tmp_path / "counter.mh"))


class _HalvedOnCtx(Function):
    @staticmethod
    def forward(ctx, t):
        ctx.k = torch.full((4,), 2.0)
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        ctx.k = ctx.k * 0.5
        return g * ctx.k


def test_tensor_on_ctx_rebound_in_backward_run_twice():
    """Backward rebinds a tensor ctx held from forward; the second backward reads the new one
    (red team 3: 6.0 where eager gives 4.5, silent). Refused (MH106); fallback runs eagerly."""
    eager_modes.matches_eager(_HalvedOnCtx, lambda i: (_fixed(i),), backwards=2)
    with pytest.raises(SideEffectError, match=r"MH106.*rebinds or changes ctx\.k"):
        minihop.capture(_HalvedOnCtx, _fixed(0))


# --- fnstate ---------------------------------------------------------------------------------------
# A function read by the Function is what it reads of itself (its defaults, keyword defaults, code),
# a module imported inside the Function is the module a global would name, and an lru_cache
# helper's stale value is refused whatever it returns (red team 3, #28).

def _scaled(t, s=2.0):
    return t * s


class _DefaultScale(Function):
    @staticmethod
    def forward(ctx, t):
        return _scaled(t)

    @staticmethod
    def backward(ctx, g):
        return g * 3.0


def test_helper_defaults_replaced_between_calls():
    """``_scaled.__defaults__ = (3.0,)`` before calls 1 and 3: eager scales by the new default."""
    def between(i):
        _scaled.__defaults__ = (2.0 + i,) if i in (1, 3) else (2.0,)

    try:
        eager_modes.matches_eager(_DefaultScale, lambda i: (_fixed(i),), between=between,
                                  reset=lambda: between(0))
    finally:
        _scaled.__defaults__ = (2.0,)


def _kw_scaled(t, *, s=2.0):
    return t * s


class _KwDefaultScale(Function):
    @staticmethod
    def forward(ctx, t):
        return _kw_scaled(t)

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


@pytest.mark.parametrize("how", ["replaced", "item-set"])
def test_helper_kwdefaults_replaced_between_calls(how):
    """``_kw_scaled.__kwdefaults__ = {"s": 4.0}``, or its dict's item set in place."""
    def between(i):
        s = 2.0 + (i >= 2)
        if how == "replaced":
            _kw_scaled.__kwdefaults__ = {"s": s}
        else:
            _kw_scaled.__kwdefaults__["s"] = s

    try:
        eager_modes.matches_eager(_KwDefaultScale, lambda i: (_fixed(i),), between=between,
                                  reset=lambda: between(0))
    finally:
        _kw_scaled.__kwdefaults__ = {"s": 2.0}


SHIFT = lambda t, k=1.0: t + k  # noqa: E731  (a lambda held in a global is the case)


class _LambdaShift(Function):
    @staticmethod
    def forward(ctx, t):
        return SHIFT(t) * t

    @staticmethod
    def backward(ctx, g):
        return g


def test_lambda_default_replaced_between_calls():
    def between(i):
        SHIFT.__defaults__ = (1.0 + 0.5 * i,)

    try:
        eager_modes.matches_eager(_LambdaShift, lambda i: (_fixed(i),), between=between,
                                  reset=lambda: between(0))
    finally:
        SHIFT.__defaults__ = (1.0,)


def _square_code(t, s=2.0):
    return t * t * s


class _CodeSwapped(Function):
    _ORIGINAL = _scaled.__code__

    @staticmethod
    def forward(ctx, t):
        return _scaled(t)

    @staticmethod
    def backward(ctx, g):
        return g


def test_helper_code_replaced_between_calls():
    """``_scaled.__code__ = _square_code.__code__`` before call 2 (a patched helper)."""
    def between(i):
        _scaled.__code__ = _square_code.__code__ if i == 2 else _CodeSwapped._ORIGINAL

    try:
        eager_modes.matches_eager(_CodeSwapped, lambda i: (_fixed(i),), between=between,
                                  reset=lambda: between(0))
    finally:
        _scaled.__code__ = _CodeSwapped._ORIGINAL


class _StaticDefault(Function):
    @staticmethod
    def scale(t, s=2.0):
        return t * s

    @staticmethod
    def forward(ctx, t):
        return _StaticDefault.scale(t)

    @staticmethod
    def backward(ctx, g):
        return g


def test_staticmethod_defaults_replaced_between_calls():
    """The Function's own helper (a staticmethod, read as ``_StaticDefault.scale``)."""
    def between(i):
        _StaticDefault.scale.__defaults__ = (2.0 + (i % 2),)

    try:
        eager_modes.matches_eager(_StaticDefault, lambda i: (_fixed(i),), between=between,
                                  reset=lambda: between(0))
    finally:
        _StaticDefault.scale.__defaults__ = (2.0,)


class _LocalNumpy(Function):
    @staticmethod
    def forward(ctx, t):
        import numpy as np
        return t * float(np.random.rand())

    @staticmethod
    def backward(ctx, g):
        return g


class _LocalNumpyFrom(Function):
    @staticmethod
    def forward(ctx, t):
        from numpy import random as npr
        return t * float(npr.uniform())

    @staticmethod
    def backward(ctx, g):
        return g


class _LocalNumpyInLambda(Function):
    @staticmethod
    def forward(ctx, t):
        import numpy.random
        draw = lambda: float(numpy.random.rand())  # noqa: E731  (the import's name in nested code)
        return t * draw()

    @staticmethod
    def backward(ctx, g):
        return g


@pytest.mark.parametrize("fn_cls", [_LocalNumpy, _LocalNumpyFrom, _LocalNumpyInLambda],
                         ids=["import-as", "from-import-as", "in-a-lambda"])
def test_numpy_random_after_an_import_inside_forward(fn_cls):
    """The caller reseeds numpy's stream between calls (not before call 2): eager draws anew."""
    np = pytest.importorskip("numpy")
    eager_modes.matches_eager(fn_cls, lambda i: (_fixed(i),),
                              between=lambda i: np.random.seed(i) if i != 2 else None,
                              reset=lambda: np.random.seed(0))


class _ImportModuleRandom(Function):
    @staticmethod
    def forward(ctx, t):
        import importlib
        rng = importlib.import_module("random")
        return t * rng.random()

    @staticmethod
    def backward(ctx, g):
        return g


class _DunderImportRandom(Function):
    @staticmethod
    def forward(ctx, t):
        rng = __import__("random")
        return t + rng.gauss(0.0, 1.0)

    @staticmethod
    def backward(ctx, g):
        return g


@pytest.mark.parametrize("fn_cls", [_ImportModuleRandom, _DunderImportRandom],
                         ids=["importlib.import_module", "__import__"])
def test_python_random_after_an_import_call_inside_forward(fn_cls):
    """``importlib.import_module("random")`` / ``__import__("random")`` in forward: every
    call draws a new number in eager."""
    eager_modes.matches_eager(fn_cls, lambda i: (_fixed(i),))


class _CachedFactor(Function):
    SCALE = 2.0

    @staticmethod
    @functools.lru_cache(maxsize=4)
    def factor(n):
        return _CachedFactor.SCALE * n

    @staticmethod
    def forward(ctx, t):
        return t * _CachedFactor.factor(t.shape[0])

    @staticmethod
    def backward(ctx, g):
        return g


def test_lru_cached_float_from_class_state_is_stale():
    """An lru_cache'd staticmethod returns a float computed from a class attribute the caller
    changes: eager keeps returning the cached float."""
    def reset():
        _CachedFactor.factor.cache_clear()
        _CachedFactor.SCALE = 2.0

    try:
        eager_modes.matches_eager(_CachedFactor, lambda i: (_fixed(i),), reset=reset,
                                  between=lambda i: setattr(_CachedFactor, "SCALE", 2.0 + i))
    finally:
        reset()


HEADS = 2


@functools.cache
def _heads() -> int:
    return HEADS * 2


@functools.lru_cache(maxsize=None)
def _window(n: int) -> tuple[float, ...]:
    return tuple(CONF.s * k for k in range(n))


class _CachedInt(Function):
    @staticmethod
    def forward(ctx, t):
        return t * _heads()

    @staticmethod
    def backward(ctx, g):
        return g * _heads()


class _CachedTuple(Function):
    @staticmethod
    def forward(ctx, t):
        return t * torch.tensor(_window(t.shape[1]))

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def test_functools_cache_int_from_a_global_is_stale():
    """``functools.cache`` returning an int from a global the caller rebinds (read in forward
    and backward)."""
    def between(i):
        global HEADS
        HEADS = 2 + i

    def reset():
        global HEADS
        HEADS = 2
        _heads.cache_clear()

    try:
        eager_modes.matches_eager(_CachedInt, lambda i: (_fixed(i),), between=between, reset=reset)
    finally:
        reset()


def test_lru_cached_tuple_of_floats_from_an_object_is_stale():
    def reset():
        CONF.s = 1.0
        _window.cache_clear()

    try:
        eager_modes.matches_eager(_CachedTuple, lambda i: (_fixed(i),), reset=reset,
                                  between=lambda i: setattr(CONF, "s", 1.0 + i))
    finally:
        reset()


def _user_config_module() -> types.ModuleType:
    """A user's own module (a config or plugin module), imported by name inside forward."""
    mod = _shim_module("fnstate_cfg", SCALE=2.0)

    def scale(t, s=1.0):
        return t * s * mod.SCALE

    scale.__module__ = "fnstate_cfg"
    mod.scale = scale
    return mod


class _ImportsUserModule(Function):
    @staticmethod
    def forward(ctx, t):
        import fnstate_cfg as cfg
        return t * cfg.SCALE

    @staticmethod
    def backward(ctx, g):
        return g


class _FromUserModuleImportsAValue(Function):
    @staticmethod
    def forward(ctx, t):
        from fnstate_cfg import SCALE
        return t * SCALE

    @staticmethod
    def backward(ctx, g):
        return g


class _FromUserModuleImportsAHelper(Function):
    @staticmethod
    def forward(ctx, t):
        from fnstate_cfg import scale
        return scale(t)

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


@pytest.mark.parametrize("fn_cls", [_ImportsUserModule, _FromUserModuleImportsAValue, _FromUserModuleImportsAHelper],
                         ids=["import-as", "from-import-value", "from-import-helper"])
def test_user_module_imported_inside_forward_changes(fn_cls, monkeypatch):
    """The module's SCALE changes between calls (and its helper's default before call 3): read
    through the import as through a global naming the module."""
    mod = _user_config_module()
    monkeypatch.setitem(sys.modules, "fnstate_cfg", mod)

    def between(i):
        mod.SCALE = 2.0 + (i % 2)
        mod.scale.__defaults__ = (1.0 + (i == 3),)

    eager_modes.matches_eager(fn_cls, lambda i: (_fixed(i),), between=between, reset=lambda: between(0))


def test_fnstate_refusals_name_what_they_found():
    """The strict-mode refusals are coded and say what was read: a draw after a local import,
    a cached value computed from a class attribute."""
    pytest.importorskip("numpy")
    with pytest.raises(SideEffectError, match=r"MH106.*draws from numpy's global random state.*numpy\.random\.rand"):
        minihop.capture(_LocalNumpy, _fixed(0))
    _CachedFactor.factor.cache_clear()
    with pytest.raises(SideEffectError, match=r"MH106.*factor \(an lru_cache helper\) returned a value computed from _CachedFactor"):
        minihop.capture(_CachedFactor, _fixed(0))
    _CachedFactor.factor.cache_clear()


class _OwnDefault(Function):
    @staticmethod
    def forward(ctx, t, s=2.0):
        ctx.s = s
        return t * s

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s, None


class _OwnKwDefault(Function):
    @staticmethod
    def forward(ctx, t, *, s=2.0):
        return t * s

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def _cubed(ctx, t, s=2.0):
    ctx.s = s
    return t * t * t


@pytest.mark.parametrize("fn_cls, change", [
    (_OwnDefault, lambda i: setattr(_OwnDefault.forward, "__defaults__", (2.0 + (i % 2),))),
    (_OwnKwDefault, lambda i: _OwnKwDefault.forward.__kwdefaults__.__setitem__("s", 2.0 + (i >= 2))),
    (_OwnDefault, lambda i: setattr(_OwnDefault.forward, "__code__",
                                    _cubed.__code__ if i == 2 else _OwnDefault._code)),
], ids=["defaults", "kwdefaults-item", "code"])
def test_the_functions_own_forward_defaults_or_code_replaced(fn_cls, change):
    """The Function's own forward: its default (read when the call leaves it out), keyword-only
    default, or code replaced on the same function object between calls."""
    try:
        eager_modes.matches_eager(fn_cls, lambda i: (_fixed(i),), between=change, reset=lambda: change(0))
    finally:
        _OwnDefault.forward.__defaults__ = (2.0,)
        _OwnDefault.forward.__code__ = _OwnDefault._code
        _OwnKwDefault.forward.__kwdefaults__["s"] = 2.0


_OwnDefault._code = _OwnDefault.forward.__code__


# --- ctxheld ---
# A holder on ctx whose lookups are no attribute/item place (a weak reference, a ChainMap):
# backward reads through it when it runs, after the caller changed what it reaches (red team 3,
# silent). Refused in strict mode (MH106, minihop/tracer/ctx_held.py); fallback equals eager.

class _Box:
    def __init__(self, v: float) -> None:
        self.v = v


_box = _Box(2.0)


class _WeakRefOnCtx(Function):
    @staticmethod
    def forward(ctx, t, h):
        ctx.ref = __import__("weakref").ref(h)
        return t * h.v

    @staticmethod
    def backward(ctx, g):
        return g * ctx.ref().v, None


def test_weakref_on_ctx_dereferenced_in_backward():
    """red team 3 #01: eager's backward sees h.v as the caller set it before .backward()."""
    eager_modes.matches_eager(_WeakRefOnCtx, lambda i: (_fixed(i), _box),
                              between=lambda i: setattr(_box, "v", 2.0), mid=lambda i: setattr(_box, "v", 5.0 + i),
                              reset=lambda: setattr(_box, "v", 2.0))
    with pytest.raises(SideEffectError, match=r"MH106.*ReferenceType on ctx\.ref"):
        minihop.capture(_WeakRefOnCtx, _fixed(0), _box)


class _WeakProxyOnCtx(Function):
    @staticmethod
    def forward(ctx, t, h):
        ctx.h = __import__("weakref").proxy(h)
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * ctx.h.v, None


def test_weakref_proxy_on_ctx():
    eager_modes.matches_eager(_WeakProxyOnCtx, lambda i: (_fixed(i), _box),
                              between=lambda i: setattr(_box, "v", 2.0), mid=lambda i: setattr(_box, "v", 3.0 + i),
                              reset=lambda: setattr(_box, "v", 2.0))


_scales: Any = None


def _weak_scales() -> Any:
    global _scales
    if _scales is None:
        import weakref
        _scales = weakref.WeakKeyDictionary()
        _scales[_box] = 2.0
    return _scales


class _WeakKeyDictOnCtx(Function):
    @staticmethod
    def forward(ctx, t, h):
        ctx.table, ctx.key = _weak_scales(), h
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * ctx.table[ctx.key], None


def test_weak_key_dictionary_on_ctx():
    eager_modes.matches_eager(_WeakKeyDictOnCtx, lambda i: (_fixed(i), _box),
                              between=lambda i: _weak_scales().__setitem__(_box, 2.0),
                              mid=lambda i: _weak_scales().__setitem__(_box, -1.0 - i),
                              reset=lambda: _weak_scales().__setitem__(_box, 2.0))


_over: dict[str, float] = {}
_chain = __import__("collections").ChainMap(_over, {"k": 2.0})


class _ChainMapOnCtx(Function):
    @staticmethod
    def forward(ctx, t, cm):
        ctx.cm = cm
        return t * cm["k"]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.cm["k"], None


def test_chain_map_on_ctx_overridden_before_backward():
    """red team 3 #03: an override key appears in the ChainMap's first map before backward."""
    eager_modes.matches_eager(_ChainMapOnCtx, lambda i: (_fixed(i), _chain), between=lambda i: _over.clear(),
                              mid=lambda i: _over.update(k=-3.0 - i) if i % 2 else None, reset=_over.clear)
    with pytest.raises(SideEffectError, match=r"MH106.*ChainMap on ctx\.cm"):
        minihop.capture(_ChainMapOnCtx, _fixed(0), _chain)


class _NewChildOnCtx(Function):
    @staticmethod
    def forward(ctx, t, cm):
        ctx.scopes = [cm.new_child()]  # a child scope, kept in a list on ctx
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scopes[0]["k"], None


def test_chain_map_new_child_in_list_on_ctx():
    eager_modes.matches_eager(_NewChildOnCtx, lambda i: (_fixed(i), _chain), between=lambda i: _over.clear(),
                              mid=lambda i: _over.__setitem__("k", 4.0 + i), reset=_over.clear)


_dq = __import__("collections").deque([2.0])
_dd = __import__("collections").defaultdict(lambda: 2.0)


class _DequeOnCtx(Function):
    @staticmethod
    def forward(ctx, t, q, d):
        ctx.q, ctx.d = q, d
        return t * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * ctx.q[-1] * ctx.d["s"], None, None


def test_deque_and_defaultdict_on_ctx_changed_before_backward():
    def reset() -> None:
        _dq.clear(), _dq.append(2.0), _dd.clear()

    def mid(i: int) -> None:
        _dq.append(3.0 + i)
        _dd["s"] = 1.0 + i

    eager_modes.matches_eager(_DequeOnCtx, lambda i: (_fixed(i), _dq, _dd), between=lambda i: reset(), mid=mid,
                              reset=reset)


# A helper's mutable default (``def acc(v, seen=[])``) is one object every call: state it reads
# and grows, keyed like a global (minihop/tracer/roots.py resolve_root; red team 3 #09: forward
# read its first length on every call, silent).

def _accumulate(v: float, acc: list = []) -> int:  # noqa: B006 - the user's mutable default
    acc.append(v)
    return len(acc)


class _GrowingDefault(Function):
    @staticmethod
    def forward(ctx, t):
        return t * _accumulate(1.0)

    @staticmethod
    def backward(ctx, g):
        return g


def test_mutable_default_list_grows_each_call():
    eager_modes.matches_eager(_GrowingDefault, lambda i: (_fixed(i),),
                              state=lambda: list(_accumulate.__defaults__[0]),
                              reset=lambda: _accumulate.__defaults__[0].clear())


def _scale_for(key: str, *, cache: dict = {}) -> float:  # noqa: B006
    return cache.get(key, 2.0)


class _KwOnlyCacheDefault(Function):
    @staticmethod
    def forward(ctx, t):
        return t * _scale_for("s")

    @staticmethod
    def backward(ctx, g):
        return g * _scale_for("s")


def test_kw_only_mutable_default_changed_between_calls_and_before_backward():
    cache = _scale_for.__kwdefaults__["cache"]
    eager_modes.matches_eager(_KwOnlyCacheDefault, lambda i: (_fixed(i),),
                              between=lambda i: cache.__setitem__("s", 1.0 + i),
                              mid=lambda i: cache.__setitem__("s", -2.0 - i), reset=cache.clear)
