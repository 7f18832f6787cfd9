"""Which of a call's argument objects and the objects along the places a capture read are one object.

Place in the pipeline: runtime, asked by ``assumptions`` for one ``Assumption`` per capture.
Arguments are keyed by what they hold, not by identity (a new list of the same items is the
same key), and places by their value; neither says that a global the code reads *is* the list
passed in (``sink.append(y); k = len(SINK)`` called with ``SINK``): forward's write through one
is then seen through the other, and the trace baked that in. So a capture assumes the same
sharing, by position, in every call it serves: among its argument objects that hold state (a
list, a dict, a user's object, a module) and every object along each place read (its root's
value, each owner on the way, its value: ``COUNTS["n"]`` is read through ``COUNTS``).

Tensor arguments are keyed by their properties: which of them are one tensor (``F.apply(x,
x)``, ``F.apply(x, [x])``, a module's parameter passed beside it) is part of the sharing too
(the trace of ``x is w`` answered it for its call), and so is
whether one is a tensor the code reached outside its arguments when traced
(``PythonState.outside_tensors``, ``tracer.identity``: such a call is never served, it is
refused when traced).

Invariant: a call whose sharing differs from the capture's never reuses it.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

from ..library_state import own_dict
from ..spec import MISSING, Place, PythonState
from ..place import walk_plain
from ..structure import argname, attributes
from ..user_code import plain_items, plain_pairs

__all__ = ["sharing_of"]

Args = tuple[Any, ...]
_CODE_LIKE = (types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)


def sharing_of(state: PythonState, held: frozenset[str], args: Args, argnames: tuple[str, ...]
               ) -> tuple[tuple[Any, ...], Callable[[Args], tuple[Any, ...]], Callable[[tuple[Any, ...]], str],
                          Callable[[Args], bool] | None] | None:
    """``(sharing at capture, call -> its sharing, sharing -> text, a faster equivalent of
    ``now(call) == at capture`` or None)``, or None where nothing
    can be shared (fewer than two argument objects, tensors and objects along the places read,
    and no tensor the code reached outside its arguments). A sharing is, per object, the first
    one it is, and which of them are one of ``state.outside_tensors``."""
    arg_idx = tuple(i for i, a in enumerate(args) if _holder(a) or issubclass(type(a), torch.Tensor))
    along = {p: f for p, f in _along(state, held).items() if _holder(_fetched(f, args))}
    inner = _inner_objects(args, argnames)
    outside = {id(t): r for r in state.outside_tensors if (t := r()) is not None}
    if len(arg_idx) + len(along) + len(inner) < 2 and not outside:
        return None
    fetches = tuple(along.values())
    names = [argname(i, argnames) for i in arg_idx] + list(along) + [name for name, _ in inner]

    def now(call: Args) -> tuple[Any, ...]:
        objs = [call[i] if i < len(call) else MISSING for i in arg_idx] + [_fetched(f, call) for f in fetches] \
            + [t for _, t in _inner_objects(call, ())]
        first: dict[int, int] = {}
        shared = tuple(first.setdefault(id(o), k) for k, o in enumerate(objs))
        # (a tensor the trace would see as the caller's, while the argument is its fake copy)
        return shared, tuple(k for k, o in enumerate(objs) if (r := outside.get(id(o))) is not None and r() is o)


    def show(sharing: tuple[Any, ...]) -> str:
        shared, hits = sharing
        if len(shared) != len(names):
            return "another nesting of containers in the arguments"
        same = [f"{names[k]} is {names[j]}" for k, j in enumerate(shared) if j != k]
        same += [f"{names[k]} is a tensor the code read outside its arguments" for k in hits]
        return ", ".join(same) or "no two the same object"

    at_capture = now(args)
    return at_capture, now, show, _distinct_check(args, arg_idx, at_capture) if not (fetches or inner or outside) else None


def _distinct_check(args: Args, arg_idx: tuple[int, ...], at_capture: tuple[Any, ...]) -> Callable[[Args], bool] | None:
    """For top-level tensor arguments only, all distinct at capture (the usual case, checked on
    every call's hot path): one generated ``is not`` per pair (a set of ids past four)."""
    if not all(issubclass(type(args[i]), torch.Tensor) for i in arg_idx) or at_capture != (tuple(range(len(arg_idx))), ()):
        return None
    if len(arg_idx) <= 4:
        test = " and ".join(f"args[{i}] is not args[{j}]" for k, i in enumerate(arg_idx) for j in arg_idx[k + 1:])
    else:
        test = f"len({{{', '.join(f'id(args[{i}])' for i in arg_idx)}}}) == {len(arg_idx)}"
    check: Callable[[Args], bool] = eval(f"lambda args: len(args) > {arg_idx[-1]} and {test}")
    return check


def _inner_objects(call: Args, argnames: tuple[str, ...]) -> list[tuple[str, Any]]:
    """The tensors inside the call's arguments: in lists, tuples, dicts and user objects'
    attributes (however nested), and a module's parameters and buffers, with their names
    (``argnames`` given); and the objects holding state there (a list, a dict, a user's
    object inside an argument: a global the code reads may be one of them, ``box[0] is G``)."""
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()  # (each container once: a tree with parent links is walked once)

    def walk(value: Any, name: str, depth: int) -> None:
        if not issubclass(type(value), torch.Tensor):
            if id(value) in seen:
                return
            seen.add(id(value))
        if issubclass(type(value), torch.Tensor):
            if depth:
                found.append((name, value))
            return
        if depth and _holder(value):
            found.append((name, value))
        if issubclass(type(value), (list, tuple)) and depth < 8:
            for k, v in enumerate(plain_items(value)):
                walk(v, f"{name}[{k}]", depth + 1)
        elif issubclass(type(value), dict) and depth < 8:
            for k, v in plain_pairs(value):
                walk(v, f"{name}[{k!r}]", depth + 1)
        elif issubclass(type(value), torch.nn.Module):
            found.extend(_module_tensors(value, name))
        elif _holder(value) and depth < 8 and not issubclass(type(value), types.ModuleType):
            for k, v in attributes(value).items():  # (a user's object: keyed by its contents)
                walk(v, f"{name}.{k}", depth + 1)

    for i, a in enumerate(call):
        walk(a, argname(i, argnames) if argnames else "", 0)
    return found


def _module_tensors(module: torch.nn.Module, name: str) -> list[tuple[str, torch.Tensor]]:
    """A module's parameters, then its buffers, each once, in ``named_parameters()`` and
    ``named_buffers()`` order, read off the modules' own dicts (on every call: those generators
    cost nine times as much)."""
    modules: list[tuple[str, torch.nn.Module]] = []
    stack = [(name, module)]
    while stack:  # (pre-order, as named_modules)
        prefix, m = stack.pop()
        modules.append((prefix, m))
        stack += reversed([(f"{prefix}.{k}", c) for k, c in m._modules.items() if c is not None])
    found: list[tuple[str, torch.Tensor]] = []
    once: set[int] = set()
    for kind in ("_parameters", "_buffers"):
        for prefix, m in modules:
            for k, t in getattr(m, kind).items():
                if t is not None and id(t) not in once:
                    once.add(id(t))
                    found.append((f"{prefix}.{k}", t))
    return found


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
    if issubclass(type(value), (list, dict, set, bytearray, torch.nn.Module)):
        return True
    return own_dict(value) is not None and not issubclass(type(value), (torch.Tensor, type, *_CODE_LIKE))


def _fetched(fetch: Callable[[Args], Any], args: Args) -> Any:
    try:
        return fetch(args)
    except Exception:
        return MISSING
