"""Which of a call's argument objects and the objects along the places a capture read are one object.

Place in the pipeline: runtime, asked by ``assumptions`` for one ``Assumption`` per capture.
Arguments are keyed by what they hold, not by identity (a new list of the same items is the
same key), and places by their value; neither says that a global the code reads *is* the list
passed in (``sink.append(y); k = len(SINK)`` called with ``SINK``): forward's write through one
is then seen through the other, and the trace baked that in. So a capture assumes the same
sharing, by position, in every call it serves: among its argument objects that hold state (a
list, a dict, a user's object, a module) and every object along each place read (its root's
value, each owner on the way, its value: ``COUNTS["n"]`` is read through ``COUNTS``).

Invariant: a call whose sharing differs from the capture's never reuses it.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

from ..spec import MISSING, Place, PythonState
from ..place import walk_plain
from ..structure import argname

__all__ = ["sharing_of"]

Args = tuple[Any, ...]
_CODE_LIKE = (types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)


def sharing_of(state: PythonState, held: frozenset[str], args: Args, argnames: tuple[str, ...]
               ) -> tuple[tuple[int, ...], Callable[[Args], tuple[int, ...]], Callable[[tuple[int, ...]], str]] | None:
    """``(sharing at capture, call -> its sharing, sharing -> text)``, or None where nothing
    can be shared (no argument object holding state, or nothing beside it)."""
    arg_idx = tuple(i for i, a in enumerate(args) if _holder(a))
    along = {p: f for p, f in _along(state, held).items() if _holder(_fetched(f, args))}
    if not arg_idx or len(arg_idx) + len(along) < 2:
        return None
    fetches = tuple(along.values())
    names = [argname(i, argnames) for i in arg_idx] + list(along)

    def now(call: Args) -> tuple[int, ...]:
        objs = [call[i] if i < len(call) else MISSING for i in arg_idx] + [_fetched(f, call) for f in fetches]
        return tuple(next(k for k in range(len(objs)) if objs[k] is o) for o in objs)

    def show(shared: tuple[int, ...]) -> str:
        same = [f"{names[k]} is {names[j]}" for k, j in enumerate(shared) if j != k]
        return ", ".join(same) or "no two the same object"

    return now(args), now, show


def _along(state: PythonState, held: frozenset[str]) -> dict[str, Callable[[Args], Any]]:
    """Each object along each place read outside the arguments, by its description."""
    found: dict[str, Callable[[Args], Any]] = {}
    for r in state.reads:
        place = r.place
        if place.description in held or place.uses_args:
            continue
        for k in range(len(place.steps)):
            text = Place(place.root, place.steps[:k]).description
            found.setdefault(text, lambda args, p=place, k=k: walk_plain(p.root.get(args), p.steps[:k]))
        found.setdefault(place.description, place.get)
    return found


def _holder(value: Any) -> bool:
    """An object whose state a write changes in place (a list, a dict, a user's object)."""
    if isinstance(value, (list, dict, set, bytearray, torch.nn.Module)):
        return True
    return hasattr(value, "__dict__") and not isinstance(value, (torch.Tensor, type, *_CODE_LIKE))


def _fetched(fetch: Callable[[Args], Any], args: Args) -> Any:
    try:
        return fetch(args)
    except Exception:
        return MISSING
