"""Code that runs when an object the trace made dies: refused (MH106).

Place in the pipeline: tracer (``trace.py`` calls ``refuse_death_code`` once forward has run,
with the values its graph holds and ctx, and once backward has run, with backward's).

An object's death can run the user's code: a ``__del__`` of the user's class, or a callback
given to ``weakref.ref(obj, cb)`` / ``weakref.proxy(obj, cb)``. Eager's objects die on every
call (a local when forward returns, what ctx keeps when the call's graph is freed), running that
code once per call, at that moment. A trace's values do not die that way: its fake tensors live
as long as its graphs, what its ctx keeps as long as the capture. The code would run once, at
an unrelated time, or never. An object made and dropped inside the trace runs its code while
the heap watch looks (what it writes is the watch's: replayed, or the capture single-use).

The caller's own objects die when the caller's code drops them, as in eager, except where the
user's code drops one the heap watch holds in its snapshot (``state_writes.write_of`` asks
``dropped_death`` of each write's old value): eager's may die there, mid-call, running its code
or emptying a weak reference the code reads next; the trace's lives to the end of the trace, a
capture's replay drops it after the graph. Refused where the old value has such code or a weak
reference minihop cannot place; a replayed write checks before each call that the value it will
drop has none (``quiet_death``).

Which code is the user's is decided the "unknown means unsafe" way: a callback counts as a
library's bookkeeping only where it is a Python function of a library module (a
``WeakKeyDictionary``'s own ``remove``); a builtin method (``log.append``), a callable object or
a user function is the user's.

Invariant: every tensor value of the graph and every value ctx keeps (however deep, within
``MAX_HELD`` containers: ``held_first``, the one walk of what ctx keeps) that existed only since
the trace began is asked, by its type's MRO and ``gc.get_referents`` of its weak references, never by running its code.
"""

from __future__ import annotations

import functools
import collections
import gc
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..errors import SideEffectError
from ..library_state import own_dict
from ..spec import MISSING as _MISSING
from ..user_code import plain_items
from .atoms import ATOMS
from .library import is_library

# How many containers and objects below ctx a held value is looked for in (here and in
# ``ctx_held``), however deep (cycles stop at a value met before); past it, nothing is assumed.
MAX_HELD = 4096
PAST_BUDGET = f"value too large to ask (more than {MAX_HELD} containers below it)"

__all__ = ["MAX_HELD", "applied_death_code", "dropped_death", "held_first", "local_callbacks", "quiet_death",
           "refuse_death_code", "refuse_local_death_code"]


def refuse_death_code(name: str, phase: str, values: Iterable[Any], ctx: Any, returned: Any = None,
                      existed: Callable[[Any], bool] = lambda value: False) -> None:
    """MH106 where one of ``values`` (a phase's graph values), a value ``ctx`` keeps, or what
    forward ``returned`` was made by the trace and runs the user's code when it dies (see the
    module docstring)."""
    for value in values:
        found = _death_code(value) if issubclass(type(value), torch.Tensor) else None
        if found is not None:
            raise refusal(name, phase, f"a tensor it makes has {found}", "when the tensor dies")
    seen: set[int] = set()
    kept = [(f"ctx.{k} keeps", v, "when the call's graph is freed") for k, v in vars(ctx).items()
            if not k.startswith("_minihop")]
    if returned is not None:  # (a capture rebuilds its result from the trace's, which it keeps)
        kept.append(("it returns", returned, "when the caller drops it"))
    for where, value, when in kept:
        found = _kept(value, seen, existed)
        if found is not None:
            raise refusal(name, phase, f"{where} an object with {found}", when)


def local_callbacks(values: Iterable[Any]) -> str | None:
    """What of the user's a weak reference among a returning frame's locals would run: eager
    clears the locals as the call returns, and a referent made in the call may die first,
    running the callback then; the trace's referent (a fake tensor its graph keeps) does not
    die. None where no local is such a reference."""
    for value in values:
        if issubclass(type(value), _WEAK):
            found = _callback_code(value)
            if found is not None:
                return found
    return None


def applied_death_code(name: str, result: Any) -> SideEffectError | None:
    """The refusal for a Function the user's code applied with grad on while traced
    (``grad_modes.watching_applies``) whose outputs' node (its ctx) keeps an object with code
    of the user's to run when it dies: eager's node dies with the call's graph, the trace's
    with the trace (the graph holds only its ops). None where there is none."""
    seen: set[int] = set()
    for t in result if issubclass(type(result), (tuple, list)) else (result,):
        node = t.grad_fn if issubclass(type(t), torch.Tensor) else None
        for key, value in (own_dict(node) or {}).items() if node is not None else ():
            found = _kept(value, seen, lambda value: False)
            if found is not None:
                return refusal(name, "forward", f"ctx.{key} keeps an object with {found}",
                               "when the graph its output is part of is freed")
    return None


def refuse_local_death_code(name: str, phase: str, found: str | None) -> None:
    """MH106 for what ``local_callbacks`` found in a phase's frame as it returned."""
    if found is not None:
        raise refusal(name, phase, f"a local of its frame is {found}",
                      "when the frame's locals are cleared as it returns")


def held_first(value: Any, test: Callable[[Any], str | None], seen: set[int], entered: list[int] | None = None,
               skip: Callable[[Any], bool] = lambda value: False) -> str | None:
    """``test``'s first answer (not None) for ``value`` or for what it holds: a dict's values, a
    list's, tuple's or deque's items, a user object's attributes, however deep; a value ``skip``
    names is neither tested nor entered; past ``MAX_HELD`` containers entered, ``PAST_BUDGET``
    (unknown is unsafe). (The one walk of what ctx keeps: for code run at an object's death
    here, for an unkeyed holder in ``ctx_held``.)"""
    if id(value) in seen or skip(value):
        return None
    seen.add(id(value))
    found = test(value)
    if found is not None:
        return found
    entered = entered if entered is not None else [0]
    cls = type(value)
    if issubclass(cls, dict):
        items: list[Any] = list(dict.values(value))  # (past a subclass's own ``values``)
    elif issubclass(cls, (list, tuple, collections.deque)):
        items = list(plain_items(value))
    elif not issubclass(cls, (torch.Tensor, type, types.ModuleType)) and (not is_library(cls) or cls is types.SimpleNamespace) \
            and own_dict(value) is not None:
        # (the user's own object, or a namespace of the user's values; a library object's
        # internals, a module's hooks, are its own)
        items = [v for k, v in own_dict(value).items() if not k.startswith("_minihop")]
    else:
        items = []
    if items:
        entered[0] += 1
        if entered[0] > MAX_HELD:
            return PAST_BUDGET
    for item in items:
        found = held_first(item, test, seen, entered, skip)
        if found is not None:
            return found
    return None


def dropped_death(step: tuple[str, Any], before: Any, after: Any) -> str | None:
    """What runs or watches when a value a write of the caller's state drops dies (the old value
    of an attribute, item or cell; the items a container lost): eager's object may die there,
    mid-call (its last reference gone), running that code or emptying that weak reference then;
    the trace's lives on in the heap watch's snapshot, and a capture's replay drops it after the
    graph ran. None where nothing would (unknown is unsafe: a weak reference minihop cannot
    place counts)."""
    if step[0] == "whole":
        kept = {id(v) for v in _items(after)}
        values = [v for v in _items(before) if id(v) not in kept]
    elif step[0] == "extend" or before is after or before is _MISSING:
        values = []
    else:
        values = [before]
    seen: set[int] = set()
    for value in values:
        found = held_first(value, _watched_death, seen)
        if found is not None:
            return found
    return None


def quiet_death(value: Any) -> str | None:
    """``dropped_death`` of the value a replayed write finds at its place on a later call (the
    capture's check, per call): None where it dies quietly."""
    return None if value is _MISSING else held_first(value, _watched_death, set())


def _items(contents: Any) -> list[Any]:
    return list(contents.values()) if issubclass(type(contents), dict) else \
        list(contents) if issubclass(type(contents), (list, tuple)) else []


def _watched_death(value: Any) -> str | None:
    """``_death_code``, or a live weak reference minihop cannot place that the user's code may
    read (a ``WeakValueDictionary``'s entry, a ``weakref.ref`` it keeps): torch's and minihop's
    own (a tensor's memo entries) are bookkeeping."""
    found = _death_code(value)
    if found is not None or issubclass(type(value), (*ATOMS, type, types.ModuleType, types.FunctionType)):
        return found
    try:
        refs = weakref.getweakrefs(value)
    except TypeError:
        return None
    tensor = issubclass(type(value), torch.Tensor)
    for ref in refs:
        if ref() is None or _own_module(type(ref)) or (tensor and type(ref) is not weakref.KeyedRef):
            continue  # (a tensor's plain weak references: torch's and minihop's memos)
        callback = getattr(ref, "__callback__", None)
        if callback is not None and _own_module(getattr(callback, "__func__", callback)):
            continue
        return ("an entry of a WeakValueDictionary" if type(ref) is weakref.KeyedRef
                else f"a weak reference to it ({type(ref).__qualname__})")
    return None


def _own_module(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return issubclass(type(module), str) and module.split(".")[0] in ("torch", "minihop")


def _kept(value: Any, seen: set[int], existed: Callable[[Any], bool]) -> str | None:
    """The death code of ``value`` or of what it holds (made by the trace: the caller's own
    objects die when the caller drops them, as in eager), or None."""
    return held_first(value, _death_code, seen,
                      skip=lambda v: not issubclass(type(v), torch.Tensor) and existed(v))


def _death_code(value: Any) -> str | None:
    """What of the user's runs when ``value`` dies: its class's ``__del__``, a weak reference's
    callback; None when nothing does."""
    for klass in type(value).__mro__:
        if "__del__" in klass.__dict__ and not is_library(klass):
            return f"a __del__ ({klass.__qualname__}.__del__)"
    try:
        refs = weakref.getweakrefs(value)
    except TypeError:  # (a type that takes no weak references)
        return None
    for ref in refs:
        found = _callback_code(ref)
        if found is not None:
            return found
    return None


def _callback_code(ref: Any) -> str | None:
    if issubclass(type(ref), weakref.ref):
        if ref() is None:
            return None  # (dead: its callback has run, or never will)
        callback = _CALLBACK.__get__(ref)  # (a subclass's own slots are not its callback)
    else:
        # A proxy forwards attribute reads to its object; for the collector its only
        # referent is its callback.
        callback = next(iter(gc.get_referents(ref)), None)
    if callback is not None and callable(callback) and not _library_callback(callback):
        return f"a weak reference whose callback is {_named(callback)}"
    return None


_CALLBACK = weakref.ref.__dict__["__callback__"]
_WEAK = (weakref.ref, weakref.ProxyType, weakref.CallableProxyType)


def _library_callback(callback: Any) -> bool:
    fn = callback.func if issubclass(type(callback), functools.partial) else callback
    fn = getattr(fn, "__func__", fn) if issubclass(type(fn), types.MethodType) else fn
    return issubclass(type(fn), types.FunctionType) and is_library(fn)


def _named(callback: Any) -> str:
    name = getattr(callback, "__qualname__", None)
    return name if issubclass(type(name), str) else type(callback).__qualname__


def refusal(name: str, phase: str, found: str, when: str) -> SideEffectError:
    return SideEffectError(
        f"{name}.{phase} leaves code of its own to run when an object dies: {found}.",
        f"Eager runs that code on every call, {when}; the capture's objects are the trace's, "
        "which live as long as the capture (its graphs, what its ctx keeps), so the code would "
        "run once at another time, or never.",
        "Do the work where the object is used (or drop the callback / __del__), or run it "
        "eagerly with minihop.function(F, fallback='eager').")
