"""Effects of the user's code that are not Python-state writes: torch generators handed to
ops, and ctx as forward left it (messages and ``print``: ``messages``).

Place in the pipeline: tracer, beside the heap watch (``heap``). The recorder notes each
``torch.Generator`` that reaches a recorded op (``note_generator``); the trace asks
``refuse_generators`` once the phase's code has run.

Why a generator is refused: a graph can only hold it as a constant, the object seen while
tracing. A generator made and seeded inside forward (``torch.Generator().manual_seed(0)``)
would then advance from call to call where eager makes a fresh one each time; one passed as an
argument would be the traced call's object on every later call. Either is a silently wrong
random stream. The refusal is deferred to the end of the phase so that a value read made
from the same draw (``torch.rand((), generator=g).item()``) still reports as the value read
it also is.

Invariant: no graph holds a ``torch.Generator``.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch

from ..errors import SideEffectError
from ..library_state import library_module, own_dict
from ..spec import CTX_HELD, MISSING
from ..structure import attributes
from .atoms import CONSTANTS
from .death_code import quiet_death

__all__ = ["constant_container", "refuse_generators", "ctx_as_forward_left_it", "ctx_forward", "ctx_values", "refuse_symbolic_ctx_write", "seed_ctx",
           "ctx_objects", "refuse_ctx_rebinding", "share_arguments"]



def constant_container(value: Any, depth: int = 0) -> bool:
    """A list, dict, tuple or set built only of constants (nested, at most a few levels): a
    value a write can replay by setting a fresh copy of it on each call."""
    if issubclass(type(value), CONSTANTS):
        return depth > 0
    if depth > 4 or type(value) not in (list, dict, tuple, set, frozenset):
        return False
    items = (*value.keys(), *value.values()) if type(value) is dict else tuple(value)
    return all(constant_container(v, depth + 1) for v in items)


def refuse_generators(generators: list[str | None], describe: str) -> None:
    """Raise MH106 when a ``torch.Generator`` reached an op of this phase (``generators``:
    where each did, in the user's code)."""
    if not generators:
        return
    raise SideEffectError(
        f"{describe} passes a torch.Generator to a random op (generator=...).",
        "A graph can hold a generator only as the object seen while tracing: a generator made "
        "and seeded in the Function would keep advancing from call to call, and one passed as "
        "an argument would be the traced call's, where eager draws from the one of each call.",
        "Draw from torch's default generator (seed it outside the Function), or run it eagerly "
        "with minihop.function(F, fallback='eager').", where=generators[0])


class ctx_as_forward_left_it:  # noqa: N801  (used as a context manager, named as one)
    """While active, the user's attributes on ``ctx`` are as forward left them (the lists,
    dicts and sets among them with their contents then), and again so afterwards; made once,
    after forward, and entered for each trace of backward. Eager's backward runs once on the
    ctx forward filled; minihop may trace backward more than once (grads laid out otherwise,
    values it reads again), and a backward that writes ctx (``ctx.calls += 1``,
    ``ctx.trail.append(...)``) must not see its own earlier trace.

    Only containers and objects forward made are put back: one that existed before forward (an argument
    list, a global dict: ``existed``) is the caller's, and backward must see it as it is when
    backward runs (eager's does; the caller may change it in between). Putting its old
    contents back would also write the caller's object."""

    def __init__(self, ctx: Any, existed: Callable[[Any], bool] = lambda value: False) -> None:
        self.ctx = ctx
        self.saved = [(k, v, None if existed(v) else _contents(v))
                      for k, v in vars(ctx).items() if not k.startswith("_minihop")]

    def __enter__(self) -> None:
        _put_back(self.ctx, self.saved)

    def __exit__(self, *exc: Any) -> None:
        _put_back(self.ctx, self.saved)


def _contents(value: Any) -> Any:
    """What of ``value`` a trace of backward may change and ``_put_back`` puts back: a list's,
    dict's or set's items; the attributes of an object of plain Python state (a
    ``SimpleNamespace``, the user's object: ``ctx.box.n += 1`` in a backward traced again for a
    call, which an eager run of that call's backward then read a second time). None: nothing."""
    if type(value) in (list, dict, set):
        return type(value)(value)
    plain = type(value) is types.SimpleNamespace or not (
        issubclass(type(value), _NOT_STATE) or library_module(str(type(value).__module__)))
    own = own_dict(value) if plain else None
    return _Attrs(dict(own)) if type(own) is dict else None


@dataclasses.dataclass(frozen=True)
class _Attrs:
    """An object's instance attributes as forward left them."""

    items: dict[str, Any]


_NOT_STATE = (torch.Tensor, torch.nn.Module, type, types.ModuleType, types.FunctionType, types.MethodType)


# What a trace of backward put on ctx (or into a container forward left there) that runs the
# user's code when it dies (a ``__del__``, a weak reference's callback): put back, it would die
# then, mid-call, running that code where eager's never runs it (a retrace's backward is not
# eager's; the capture is refused for it: ``death_code``). Kept alive here instead, for good.
_NEVER_DIE: list[Any] = []


def _keep_if_dying(dropped: list[Any]) -> None:
    _NEVER_DIE.extend(v for v in dropped if quiet_death(v) is not None)


def _put_back(ctx: Any, saved: list[tuple[str, Any, Any]]) -> None:
    names = {k for k, _, _ in saved}
    now = vars(ctx)
    dropped = [now[k] for k in now if not k.startswith("_minihop") and k not in names]
    dropped += [now[k] for k, v, _ in saved if k in now and now[k] is not v]
    for k, v, contents in saved:
        if type(contents) is _Attrs:
            kept = {id(x) for x in contents.items.values()}
            dropped += [x for x in own_dict(v).values() if id(x) not in kept]
        elif contents is not None:
            kept = {id(x) for x in (contents.values() if type(v) is dict else contents)}
            dropped += [x for x in (v.values() if type(v) is dict else v) if id(x) not in kept]
    _keep_if_dying(dropped)
    for k in [k for k in vars(ctx) if not k.startswith("_minihop") and k not in names]:
        object.__delattr__(ctx, k)
    for k, v, contents in saved:
        object.__setattr__(ctx, k, v)
        if contents is None:
            continue
        if type(contents) is _Attrs:
            attrs = own_dict(v)
            attrs.clear()
            attrs.update(contents.items)
        elif type(v) is list:
            v[:] = contents
        elif type(v) in (dict, set):
            v.clear()
            v.update(contents)


_PLAIN = (int, float, bool, str, type(None))
_OTHER = object()  # an object ctx_values does not copy


@dataclasses.dataclass(frozen=True)
class _Symbolic:
    """A number of symbolic sizes on ctx (each call's own): no value to key or replay."""

    expr: str


def _copied(value: Any) -> Any:
    """``value`` copied, if it is plain (numbers, strings, containers of them); a symbolic
    number as ``_Symbolic``; else ``_OTHER``."""
    if type(value) in _PLAIN:
        return value
    if issubclass(type(value), (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _Symbolic(str(value))
    if type(value) in (list, tuple, set):
        items = [_copied(v) for v in value]
        return _OTHER if any(v is _OTHER for v in items) else type(value)(items)
    if type(value) is dict:
        pairs = [(_copied(k), _copied(v)) for k, v in value.items()]
        return _OTHER if any(k is _OTHER or v is _OTHER for k, v in pairs) else dict(pairs)
    return _OTHER


def ctx_values(ctx: Any) -> dict[str, Any]:
    """A copy of the user's plain values on ``ctx`` (numbers, strings, and lists, tuples, dicts
    and sets of them): what a backward that writes ctx (``ctx.calls += 1``) leaves for the next
    backward of the same call. Tensors and other objects are not copied (their changes are
    judged elsewhere)."""
    # (an argument kept on ctx, ``ctx.log = log``, is the caller's: its writes are replayed
    # where it lives, and backward reads it there; ``share_arguments`` names them)
    shared = getattr(ctx, "_minihop_shared", ())
    copied = {k: _copied(v) for k, v in vars(ctx).items() if not k.startswith("_minihop") and k not in shared}
    return {k: v for k, v in copied.items() if v is not _OTHER}


def ctx_forward(ctx: Any) -> tuple[tuple[str, Any], ...]:
    """The user's attributes on ``ctx`` as forward left them, for ``PythonState.ctx_forward``:
    each immutable plain value (numbers, strings, tuples of them) as it is, anything else as
    ``CTX_HELD`` (a mutable container the caller could change through ``y.grad_fn``; a tensor,
    an object, a number of symbolic sizes)."""
    def shown(value: Any) -> Any:
        if type(value) in _PLAIN or (type(value) is tuple and all(shown(v) is v for v in value)):
            return value
        return CTX_HELD
    return tuple((k, shown(v)) for k, v in vars(ctx).items() if not k.startswith("_minihop"))


def share_arguments(ctx: Any, args: tuple[Any, ...]) -> None:
    """Name the ctx attributes that hold one of the call's mutable arguments (see ``ctx_values``;
    a number is a value: ``ctx.left = k`` is ctx's own)."""
    ids = {id(a) for a in args if not issubclass(type(a), (int, float, complex, str, bytes, bool, tuple, type(None)))}
    object.__setattr__(ctx, "_minihop_shared", frozenset(k for k, v in vars(ctx).items() if id(v) in ids))


def ctx_objects(ctx: Any, existed: Callable[[Any], bool] = lambda value: False) -> dict[str, Any]:
    """Each value on ``ctx`` that ``ctx_values`` does not copy (a tensor, an object, a container
    holding one): its identity and what it holds (an object's attributes, a container's items,
    down to tensors, which count by identity). A backward that rebinds one (``ctx.k = ctx.k *
    0.5``) or changes what it holds (``ctx.info.n += 1``) leaves a value a second backward of
    the call reads, and backward's case is keyed on plain values only. An object that
    ``existed`` before the call (a global's) counts by identity: what backward changes in it
    is the heap watch's, replayed where it lives."""
    shared = getattr(ctx, "_minihop_shared", ())
    return {k: (id(v), held(v, 0, existed)) for k, v in vars(ctx).items()
            if not k.startswith("_minihop") and k not in shared and _copied(v) is _OTHER}


def held(value: Any, depth: int = 0, existed: Callable[[Any], bool] = lambda value: False) -> Any:
    """What ``value`` holds, as comparable values: plain values copied, a container's items, a
    user object's attributes, a function's closure cells and a bound method's object, down to
    tensors, which count by identity (their writes are judged by their version counters). A
    container met again below itself counts by identity; past ``_HELD_DEPTH`` levels or
    ``_HELD_BUDGET`` values, what lies below is ``_Below()``, equal to nothing: unknown, so a
    comparison finds it changed (refused, never assumed the same)."""
    return _held(value, depth, existed, _HeldWalk(_HELD_BUDGET, set()))


_HELD_DEPTH, _HELD_BUDGET = 12, 20_000


@dataclasses.dataclass
class _HeldWalk:
    left: int
    open: set[int]


class _Below:
    """What ``held`` did not look at: equal to nothing (a new one each time: containers compare
    their items by identity first)."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "<not looked at>"



def _held(value: Any, depth: int, existed: Callable[[Any], bool], walk: _HeldWalk) -> Any:
    copied = _copied(value)
    if copied is not _OTHER:
        return copied
    if existed(value):
        return ("id", id(value))
    if issubclass(type(value), (torch.Tensor, type, types.ModuleType)) or id(value) in walk.open:
        return ("id", id(value))  # (a cycle: a tree's parent link)
    walk.left -= 1
    if depth > _HELD_DEPTH or walk.left < 0:
        return _Below()
    walk.open.add(id(value))
    try:
        return _parts(value, depth, existed, walk)
    finally:
        walk.open.discard(id(value))


def _parts(value: Any, depth: int, existed: Callable[[Any], bool], walk: _HeldWalk) -> Any:
    def inner(v: Any) -> Any:
        return _held(v, depth + 1, existed, walk)
    if issubclass(type(value), types.FunctionType):  # (a closure's counter: ``box[0] += 1``)
        return ("fn", id(value), tuple(inner(c.cell_contents) if _filled(c) else MISSING
                                       for c in value.__closure__ or ()))
    if issubclass(type(value), types.MethodType):
        return ("method", id(value.__func__), inner(value.__self__))
    cls = type(value)
    # (by class, whoever defined it: a deque, a Counter, an OrderedDict, a namedtuple hold items)
    if issubclass(cls, (list, tuple, set, frozenset, collections.deque)):
        return (cls, tuple(inner(v) for v in value))
    if issubclass(cls, dict):
        return (cls, tuple((inner(k), inner(v)) for k, v in value.items()))
    if not library_module(cls.__module__) or cls is types.SimpleNamespace:
        own = attributes(value)  # (its ``__dict__`` and its ``__slots__``)
        return (cls, id(value), tuple((k, inner(v)) for k, v in own.items()))
    return ("id", id(value))


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # (an empty cell: a name bound later)
        return False
    return True


def refuse_ctx_rebinding(name: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    """MH106 where backward rebinds, deletes or changes a ctx attribute holding a tensor or an
    object (see ``ctx_objects``)."""
    # (an attribute backward adds is set before any read of it, or eager's first backward
    # would have raised: only one that held forward's value is read by a second backward)
    changed = sorted(k for k in before if before[k] != after.get(k))
    if changed:
        deep = "<not looked at>" in repr(before[changed[0]])
        raise SideEffectError(
            f"{name}.backward may change ctx.{changed[0]}, an object holding more, or deeper, than "
            f"minihop compares ({_HELD_BUDGET:,} values, {_HELD_DEPTH} levels)." if deep else
            f"{name}.backward rebinds or changes ctx.{changed[0]}, a tensor or an object "
            "(or what it holds).",
            "A second backward of the call (retain_graph=True) reads what the first left on "
            "ctx; minihop traces backward again for the plain values (numbers, strings, "
            "containers of them) left there, and cannot key one on a tensor or object.",
            "Keep what backward changes in a plain Python value on ctx (ctx.n += 1), or run it "
            "eagerly with minihop.function(F, fallback='eager').")


def refuse_symbolic_ctx_write(name: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    """MH106 where backward changed a ctx value holding a number of symbolic sizes
    (``ctx.left -= 1`` with ``ctx.left = n`` an argument traced as a symbol): the value a
    second backward reads is each call's own, and minihop keys backward on values."""
    changed = [k for k in {*before, *after} if before.get(k, _OTHER) != after.get(k, _OTHER)]
    symbolic = [k for k in changed if "_Symbolic(" in repr((before.get(k), after.get(k)))]
    if symbolic:
        raise SideEffectError(
            f"{name}.backward writes ctx.{symbolic[0]}, a value computed from an argument traced "
            "as a symbol (its value differs per call).",
            "A second backward of the call (retain_graph=True) reads what the first left on "
            "ctx; minihop traces that backward for the values left there, and this one has no "
            "value at capture.",
            "Keep the count in a plain Python value, or run it eagerly with "
            "minihop.function(F, fallback='eager').")


def seed_ctx(ctx: Any, values: dict[str, Any]) -> None:
    """Put ``values`` (a ``ctx_values``) on ``ctx``, as fresh objects (the exit of
    ``ctx_as_forward_left_it`` puts forward's own back)."""
    for k in [k for k in ctx_values(ctx) if k not in values]:
        object.__delattr__(ctx, k)  # a backward before this one deleted it
    for k, v in values.items():
        if "_Symbolic(" not in repr(v):  # forward's symbolic number, unchanged (else refused)
            object.__setattr__(ctx, k, copy.deepcopy(v))
