"""Iterators passed in: refused before tracing, while they are still untouched.

Place in the pipeline: tracer, asked by ``pipeline.run_pipeline`` before it traces. Tracing
runs the user's forward on fake tensors; if forward takes values from an iterator or
generator it was given (``next(it)``, ``for v in gen``), the trace advances it, and an
iterator cannot be wound back (``hidden.restore`` can only wind back random generators). pystate
sees the change after the trace and refuses it (MH106), but by then the value is gone:
``fallback="eager"`` would run eager on a spent iterator and differ from eager.

So an argument that is, or holds (in a list, tuple, dict, set or an object's attributes),
an iterator of the standard library or a generator is refused before the trace runs (MH106,
nothing taken); ``fallback="eager"`` then runs eager on the untouched iterator. Random
generators are not refused here: tracing puts them back.

pystate asks the same (``refuse_iterator_read``) of each value the code's chains name outside
the arguments (a global ``COUNTER``, a closure's ``it[0]``), before the trace runs; of a
container a chain ends at (read whole, or by a key computed as the code runs:
``ITERATORS[name]``), of every iterator it holds.

Invariant: nothing is taken from an iterator by a capture that is refused.
"""

from __future__ import annotations

import random
import sys
import types
from typing import Any

import torch

from ..errors import SideEffectError
from ..library_state import unseen
from ..structure import attributes
from ..user_code import plain_items, plain_pairs
from .atoms import LEAVES
from .hidden import fingerprint
from .library import is_user_module, module_data

__all__ = ["refuse_iterator_arguments", "refuse_iterator_read"]

# How many containers and objects the walk enters (however deep: cycles stop at one met before);
# past it, it cannot say that no iterator is there, and refuses (unknown is unsafe). Above the
# heap watch's ``heap.MAX_OBJECTS``, whose refusal of a structure that large names where it stopped.
_MAX_ENTERED = 20_000
_PAST = object()


def refuse_iterator_arguments(fn_name: str, args: tuple[Any, ...], argnames: tuple[str, ...] = ()) -> None:
    """Raise MH106 naming the first iterator (or object of unseen state) found in ``args``."""
    seen: set[int] = set()
    for i, a in enumerate(args):
        name = argnames[i] if i < len(argnames) else f"args[{i}]"
        found = _find(a, name, seen)
        if found is not None and found[1] is _PAST:
            raise _past_error(fn_name, f"is called with {found[0]}")
        if found is not None and not _iterator(found[1]):  # (else: unseen)
            raise _unseen_error(fn_name, f"is called with {found[0]}", found[1])
        if found is not None:
            raise SideEffectError(
                f"{fn_name} is called with an iterator or generator ({found[0]}, a "
                f"{type(found[1]).__name__}).",
                "Tracing runs forward, and a value forward takes from an iterator cannot be "
                "given back: the trace would spend what eager's call takes.",
                "Pass the values (a list or tuple) instead of an iterator, or use "
                "fallback='eager' (it runs eager on the untouched iterator).")


def refuse_iterator_read(fn_name: str, phase: str, place: str, value: Any) -> None:
    """Raise MH106 if ``value``, which the code names at ``place`` (a global, a closure
    cell, ``COUNTER[0]``), is an iterator: the same, before the trace takes from it. The same
    for an object whose state minihop cannot see (``library_state.unseen``: a file)."""
    if not issubclass(type(value), LEAVES) and _iterator(value):
        raise SideEffectError(
            f"{fn_name}.{phase} takes the next value of {place} (a {type(value).__name__}, an "
            "iterator the code reads).",
            "Tracing runs forward, and a value taken from an iterator cannot be given back: "
            "the trace would spend what eager's call takes.",
            "Pass the values in as an argument, or use fallback='eager' (it runs eager on "
            "the untouched iterator).")
    if unseen(value):
        raise _unseen_error(f"{fn_name}.{phase}", f"reaches {place}", value)
    if issubclass(type(value), (list, tuple, dict, set, frozenset)) and value is not sys.modules:
        # A container the code reads whole or by a computed key (``ITERATORS[name]``): which
        # item it takes from is known only as it runs, so any iterator in it counts (not one
        # a module it holds keeps: ``sys.modules[name]`` is single-use, opaque.Finder).
        found = _find(value, place, set(), modules=False)
        if found is not None and found[1] is _PAST:
            raise _past_error(f"{fn_name}.{phase}", f"reads {place}")
        if found is not None:
            refuse_iterator_read(fn_name, phase, f"{found[0]}, in a container the code reads", found[1])


def _past_error(fn_name: str, what: str) -> SideEffectError:
    return SideEffectError(
        f"{fn_name} {what}, which holds more than {_MAX_ENTERED} containers and objects.",
        "Tracing runs the code once, and a value it takes from an iterator cannot be given back; "
        "minihop cannot say that no iterator is among so many.",
        "Pass what the Function uses rather than a structure this large, or use "
        "fallback='eager'.")


def _unseen_error(fn_name: str, what: str, value: Any) -> SideEffectError:
    return SideEffectError(
        f"{fn_name} {what}, a {type(value).__module__}.{type(value).__qualname__}: a library object "
        "whose state minihop can neither see nor put back.",
        "Tracing runs the code on it, once: what that does to it (a write, a read that moves "
        "it on) would stay done, where eager does it on every call, and no check could tell "
        "when it changed.",
        "Keep it out of the Function (pass in what it gives, do the writing outside), or use "
        "fallback='eager' (it runs eagerly, untouched by a trace).")


def _iterator(value: Any) -> bool:
    cls = type(value)
    if issubclass(cls, random.Random) or cls.__module__.startswith("numpy"):
        return False  # random generators are put back after tracing (hidden.restore)
    return fingerprint(value) is not None


def _find(value: Any, name: str, seen: set[int], modules: bool = True) -> tuple[str, Any] | None:
    if issubclass(type(value), LEAVES) or id(value) in seen:
        return None
    if len(seen) >= _MAX_ENTERED:
        return name, _PAST
    seen.add(id(value))
    if issubclass(type(value), types.ModuleType):
        if not modules or not is_user_module(value):
            return None  # a library's (``torch`` passed in): not the user's state, and not walked
        items: Any = ((f"{name}.{k}", v) for k, v in module_data(value).items())
    elif _iterator(value) or unseen(value):  # (an iterator is named as one)
        return name, value
    elif issubclass(type(value), (list, tuple)):  # (past a subclass's own methods: user_code)
        items = ((f"{name}[{k}]", v) for k, v in enumerate(plain_items(value)))
    elif issubclass(type(value), dict):
        items = ((f"{name}[{k!r}]", v) for k, v in plain_pairs(value))
    elif issubclass(type(value), (set, frozenset)):
        items = ((f"an item of {name}", v) for v in plain_items(value))
    elif issubclass(type(value), torch.nn.Module):
        return None  # its state is keyed whole (runtime.guards.value_key)
    else:
        try:
            items = ((f"{name}.{k}", v) for k, v in attributes(value).items())
        except Exception:  # an object whose attributes cannot be listed: nothing to find
            return None
    for inner_name, v in items:
        found = _find(v, inner_name, seen, modules)
        if found is not None:
            return found
    return None

