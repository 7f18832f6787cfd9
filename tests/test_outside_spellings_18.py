"""Hostile spellings, round 18 (issue #28, round 23), tried from outside against eager in
strict, apply and fallback mode (``eager_modes.matches_eager``).

Differences from eager before this round:

- a backward traced again for a call that pops forward's memo out of a global dict, then raises
  the user's exception with a message that shows fake values (``Normal``'s validation): the
  trace's pop was kept (a user's error keeps its writes, as eager's do), and fallback's eager
  backward, run for that call, then found the memo gone (``KeyError`` where eager raised
  ``ValueError``). A trace whose exception shows fakes is not eager's exception: its writes are
  put back before eager's backward runs (effects fuzz seed 1209874);
- an object of the caller's whose death runs code or empties a weak reference (a ``__del__``, a
  ``weakref.finalize``, a ``WeakValueDictionary`` entry), dropped by the user's code mid-call:
  eager's dies there, and what the code reads after it (the log its ``__del__`` appends to, the
  cache's ``get``) shows it; the heap watch's snapshot kept the trace's alive to the end of the
  trace, and a capture's replay dropped it after the graph ran. Such a drop is refused now (MH106),
  and a replayed write checks, before each call, that what it will drop dies quietly;
- a ``WeakValueDictionary`` entry that died on eager's next line lived on until the garbage
  collector ran: the finished trace's snapshots were kept in a cycle with its watches;
- a capture's keys held the caller's objects they name by identity (a guard's key, a backward
  variant's), keeping them alive after the caller let go: eager's ``__del__`` ran then, minihop's
  never. Keys hold such objects weakly now (``library_state.Same``; an object whose ``==`` is
  identity is keyed by it, not held);
- ``D.pop("w", None)`` with no "w", ``D.clear()`` of an empty dict: a trace that changed nothing
  replayed nothing and guarded nothing, and a later call with "w" there kept it where eager
  removed it (effects fuzz, round 23's ``caller_death`` kind). The receiver of a container method
  whose effect depends on what is there is a read now.
"""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch.autograd import Function
from torch.distributions import Distribution, Normal

import minihop

from eager_modes import matches_eager


@pytest.fixture(autouse=True)
def _validation_restored() -> Any:
    was = Distribution._validate_args
    yield
    Distribution.set_default_validate_args(was)


STASH: dict[str, torch.Tensor] = {}
SCALE = [1.0]


class PopsMemo(Function):
    """forward memoises a tensor in a global dict; backward pops it, then builds a ``Normal``
    whose scale is a global the caller sets (validated where torch's default says so)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["memo"] = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * STASH.pop("memo") + Normal(g, torch.full_like(g, SCALE[0])).log_prob(g)


def test_backward_pops_memo_then_raises_with_fakes() -> None:
    """Fourth call: validation on and scale -1 (set between forward and ``.backward()``), after
    a third call whose backward found the memo cleared (``KeyError``, eager's too)."""
    def mid(i: int) -> None:
        Distribution.set_default_validate_args(i % 2 == 1)
        SCALE[0] = -1.0 if i >= 2 else 1.0
        if i == 2:
            STASH.clear()

    def reset() -> None:
        STASH.clear()
        SCALE[0] = 1.0
        Distribution.set_default_validate_args(True)
    sizes = [3, 4, 3, 3]
    matches_eager(PopsMemo, lambda i: (torch.linspace(-1.0, 1.0, sizes[i]).add(i).requires_grad_(),),
                  mid=mid, reset=reset, state=lambda: sorted(STASH))


LOG: list[int] = []
HOLD: dict[str, Any] = {}
L: list[int] = []


class Noisy:
    """Logs its death."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __del__(self, log: list[int] = LOG) -> None:  # (bound now: at exit the global is gone)
        log.append(self.v)


class Box:
    def __init__(self, v: float) -> None:
        self.v = v


def _x(i: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, 3).add(i).requires_grad_()


def _reset() -> None:
    HOLD.clear()
    LOG.clear()


class PopsHeld(Function):
    """forward drops what the caller put in ``HOLD["o"]``, then reads the log."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        HOLD.pop("o", None)
        return x * len(LOG)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


def test_del_runs_where_forward_drops_the_object() -> None:
    """Eager's ``Noisy.__del__`` runs at the pop, before ``len(LOG)``."""
    def between(i: int) -> None:
        HOLD["o"] = Noisy(i)
    matches_eager(PopsHeld, lambda i: (_x(i),), between=between, reset=_reset, state=lambda: list(LOG))


def test_plain_value_then_an_object_with_del() -> None:
    """The first two calls drop an int (a capture replays the pop); the next two a ``Noisy``:
    the capture's check sees the value its replay would drop runs code when it dies."""
    def between(i: int) -> None:
        HOLD["o"] = Noisy(i) if i >= 2 else 5
    matches_eager(PopsHeld, lambda i: (_x(i),), between=between, reset=_reset, state=lambda: list(LOG))


def test_finalizer_of_a_dropped_object() -> None:
    """``weakref.finalize`` on the caller's object, dropped by forward's ``HOLD.clear()``."""
    class Clears(Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            HOLD.clear()
            return x * len(LOG)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g

    def between(i: int) -> None:
        HOLD["o"] = Box(i)
        weakref.finalize(HOLD["o"], LOG.append, i)
    matches_eager(Clears, lambda i: (_x(i),), between=between, reset=_reset, state=lambda: list(LOG))


CACHE: "weakref.WeakValueDictionary[str, Box]" = weakref.WeakValueDictionary()


class ReadsCache(Function):
    """backward drops the caller's last reference, then reads a weak cache."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        HOLD.clear()
        box = CACHE.get("k")
        return g * (box.v if box is not None else 1.0)


def test_weak_cache_entry_dies_inside_backward() -> None:
    def mid(i: int) -> None:
        HOLD["o"] = CACHE["k"] = Box(2.0 + i)
    matches_eager(ReadsCache, lambda i: (_x(i),), mid=mid, reset=lambda: (_reset(), CACHE.clear()))


class MakesCached(Function):
    """forward makes a cache entry only the caller may keep alive."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        box = CACHE.get("k")
        if box is None:
            box = CACHE["k"] = Box(1.0)
        return x * box.v

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


def test_weak_cache_entry_dies_when_the_caller_lets_go() -> None:
    """The caller keeps the entry for two calls, then lets go: eager's next call finds it gone
    (refcounting); the trace's snapshots had kept it until the collector ran."""
    keep: list[Box] = []

    def between(i: int) -> None:
        if i == 0:
            keep.append(Box(2.0))
            CACHE["k"] = keep[0]
        elif i == 1:
            keep[0].v = 3.0
        elif i == 2:
            keep.clear()
    matches_eager(MakesCached, lambda i: (_x(i),), between=between,
                  reset=lambda: (keep.clear(), CACHE.clear()), refusable=False)


class ReadsHeld(Function):
    """forward reads whether the caller's object is there (keyed by identity: a capture's guard)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * (2.0 if HOLD.get("o") is not None else 1.0) + len(LOG)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * (3.0 if HOLD.get("o") is not None else 1.0)


def test_a_guard_does_not_keep_the_callers_object_alive() -> None:
    """The caller replaces the object between calls: eager's old one dies then (its ``__del__``
    logs). A capture's key of the read held it (and a backward variant's key), so it lived on."""
    def between(i: int) -> None:
        HOLD["o"] = Noisy(i)

    def mid(i: int) -> None:
        if i == 1:
            HOLD["o"] = Noisy(10 + i)
    matches_eager(ReadsHeld, lambda i: (_x(i),), between=between, mid=mid, reset=_reset,
                  state=lambda: list(LOG), refusable=False)


D: dict[str, Any] = {}
L: list[int] = []


def _no_op_write(stmt: str, phase: str) -> type:
    """A Function whose ``phase`` runs ``stmt`` on ``D``: a write that changes nothing where the
    trace ran (the key absent, the dict empty) and something on a later call."""
    body = {"forward": "", "backward": ""}
    body[phase] = stmt
    namespace: dict[str, Any] = {"Function": Function, "D": D, "L": L}
    exec(f"""
class NoOp(Function):
    @staticmethod
    def forward(ctx, x):
        {body["forward"] or "pass"}
        return x * 2

    @staticmethod
    def backward(ctx, g):
        {body["backward"] or "pass"}
        return g * 2
""", namespace)
    return namespace["NoOp"]


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("stmt", ["D.pop('w', None)", "D.clear()", "D.setdefault('w', 0)"])
def test_a_write_that_changed_nothing_while_traced(stmt: str, phase: str) -> None:
    """``D.pop("w", None)`` with no "w", ``D.clear()`` of an empty dict: the trace saw no
    change, so nothing was replayed, and nothing guarded what the call depends on; the caller
    puts "w" in from the second call on. The receiver of such a call is read, whole.
    (``setdefault``, whose result the code may use, was read already: the crossing.)"""
    def put(i: int) -> None:
        if i >= 1:
            D["w"] = i
    hook = {"between": put} if phase == "forward" else {"mid": put}
    matches_eager(_no_op_write(stmt, phase), lambda i: (_x(i),), reset=D.clear,
                  state=lambda: sorted(D.items()), **hook)


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("stmt", ["L.sort()", "L.reverse()"])
def test_a_list_method_that_changed_nothing_while_traced(stmt: str, phase: str) -> None:
    """``L.sort()`` of a list already sorted (empty), ``L.reverse()`` of an empty one: the caller
    puts an item at the front from the second call on."""
    def put(i: int) -> None:
        if i >= 1:
            L.insert(0, 10 + i)

    def reset() -> None:
        L.clear()
    hook = {"between": put} if phase == "forward" else {"mid": put}
    matches_eager(_no_op_write(stmt, phase), lambda i: (_x(i),), reset=reset, state=lambda: list(L), **hook)


class Tag:
    """An object the code compares by identity (its key holds it weakly)."""


TAG = Tag()


class DropsTag(Function):
    """forward reads the caller's tag, then drops it from the dict (the caller keeps ``TAG``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        tag = HOLD.get("t")
        HOLD["t"] = None
        return x * (2.0 if tag is TAG else 1.0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2


def test_a_keys_own_weak_reference_is_not_the_users() -> None:
    """The crossing: a capture's key of ``TAG`` holds a weak reference to it (minihop's own); a
    second capture (another size) drops it from ``HOLD`` again, which is no death to watch (the
    caller holds ``TAG``): captured, not refused."""
    def between(i: int) -> None:
        HOLD["t"] = TAG
    sizes = [3, 3, 4, 5]
    matches_eager(DropsTag, lambda i: (torch.linspace(-1.0, 1.0, sizes[i]).requires_grad_(),),
                  between=between, reset=_reset, refusable=False)


class Scale:
    """A config object passed as an argument."""

    def __init__(self, s: float) -> None:
        self.s = s


class ByConfig(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cfg: Scale) -> torch.Tensor:
        return x * cfg.s

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * SCALE[0], None


class ByModule(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, m: torch.nn.Module) -> torch.Tensor:
        return m(x) * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * 2, None


class BySentinel(Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tag: Any) -> torch.Tensor:
        return x * (2.0 if tag is not None else 1.0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * 2, None


def _deaths(call: Any, make: Any, backward_reads_change: bool = False) -> list[Any]:
    """Four calls, each with a fresh argument object the caller drops after ``.backward()``
    (a ``weakref.finalize`` logs its death): what died after each call, and the grads."""
    died: list[int] = []
    seen: list[Any] = []
    SCALE[0] = 1.0
    for i in range(4):
        obj = make()
        weakref.finalize(obj, died.append, i)
        x = torch.ones(3, requires_grad=True)
        y = call(x, obj)
        if backward_reads_change:
            SCALE[0] = 1.0 + i  # backward reads another value: traced again for the call
        y.sum().backward()
        seen.append(x.grad.tolist())
        del obj, y
        seen.append(list(died))
    SCALE[0] = 1.0
    return seen


@pytest.mark.parametrize("case", ["config", "module", "sentinel", "traced again"])
def test_argument_objects_die_when_the_caller_lets_go(case: str) -> None:
    """A capture kept the objects of the call it was traced for (a config, an ``nn.Module``, a
    sentinel) as long as it lived (the trace's kept arguments, its state tracker's roots and its
    watches): their finalizers never ran, and a module's tensors were never freed. Kept weakly
    now; a backward traced again for a later call (the value it reads changed) uses that call's."""
    fn, make = {"config": (ByConfig, lambda: Scale(2.0)), "module": (ByModule, lambda: torch.nn.Tanh()),
                "sentinel": (BySentinel, Tag), "traced again": (ByConfig, lambda: Scale(2.0))}[case]
    eager = _deaths(fn.apply, make, case == "traced again")
    for call in (minihop.function(fn), minihop.function(fn, fallback="eager"), lambda *a: minihop.apply(fn, *a)):
        minihop.reset()
        assert _deaths(call, make, case == "traced again") == eager, case
