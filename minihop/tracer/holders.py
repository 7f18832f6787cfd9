"""What each kind of object holds, as the heap watch snapshots and compares it.

Place in the pipeline: tracer, used by ``heap`` (its snapshot walks what ``contents_of`` and
``held_by`` give; its diff compares what ``contents_of`` copied). One function per question:
``contents_of``, a shallow copy of what an object holds and its kind (``attrs``, ``list``,
``dict``, ``pairs``, ``set``, ``library``, ``hidden``, ``tensor``; None: not watched); ``held_by``, the
objects reached *through* one that is not itself watched (a tuple's items, a bound method's
object, a partial's function and arguments, a builtin subclass's ``__dict__``).

A new kind of holder is taught here, once: ``heap``'s rules then classify its changes.
"""

from __future__ import annotations

import collections
import functools
import types
from collections.abc import MutableMapping, MutableSequence, MutableSet
from typing import Any

import torch

from ..library_state import (ITEMS_IN_DATA, c_method_owner, kept_by_library, library_module, module_attributes, native_state, plain_holder,
                             own_dict, state_of, subclass_attributes, tensor_attributes)
from ..spec import MISSING
from ..structure import attributes
from ..user_code import key_code, library_base, plain_items
from . import hidden
from .atoms import ATOMS, CONSTANTS
from .identity import SWAPPED_IN
from .library import is_library

__all__ = ["UNWATCHED", "class_state", "contents_of", "dunder", "held_by"]


def held_by(value: Any, callables: bool) -> list[tuple[tuple[str, Any], Any]]:
    """The objects a tuple holds, and (``callables``) a bound method (its ``__self__``: ``cb =
    Q.put``, ``pop = DQ.popleft``) or a ``functools.partial`` (its function and arguments): the
    way to state the code changes (``cb(1)`` puts into ``Q``); a random generator's is ``hidden``'s.
    And a ``class Pair(tuple)``'s attributes (``p.seen += 1``), as its ``__dict__``."""
    held = [(("item", i), v) for i, v in enumerate(plain_items(value))] if issubclass(type(value), tuple) else []
    own = subclass_attributes(value)
    if own is not None and not issubclass(type(value), ITEMS_IN_DATA):
        held.append((("attr", "__dict__"), own))
    if not callables:
        return held
    owner = value.__self__ if issubclass(type(value), types.MethodType) else c_method_owner(value)
    if owner is not None:
        return held if hidden.fingerprint(owner) is not None else [*held, (("attr", "__self__"), owner)]
    if issubclass(type(value), functools.partial):
        return [*held, (("attr", "func"), value.func), (("attr", "args"), value.args), (("attr", "keywords"), value.keywords)]
    return held



_BUILTIN_ITEMS = ((list, "list"), (collections.deque, "list"), (dict, "dict"), (set, "set"))

UNWATCHED = frozenset({*CONSTANTS, torch.Tensor, torch.nn.Parameter, types.ModuleType, types.FunctionType,
                       tuple, frozenset})


def contents_of(value: Any) -> tuple[str | None, Any]:
    """A shallow copy of what an object holds, for a later comparison (None: not watched)."""
    if issubclass(type(value), torch.Tensor):
        # The attributes the user set on it (``x.scale = 2.0``, ``out._soft = soft``): its data is
        # the graphs', its properties are keyed with the call.
        return "tensor", tensor_attributes(value)
    if issubclass(type(value), (functools.partial, functools._lru_cache_wrapper)) or (
            type(value) is types.FunctionType and not is_library(value)):
        # Attributes set on the user's function or a wrapper of it (``helper.calls += 1``,
        # ``memo.last = t``): Python's static-variable idiom, state like an object's.
        return "attrs", {k: v for k, v in own_dict(value).items() if not dunder(k) and not k.startswith("_minihop")}
    if type(value) in UNWATCHED:
        return None, None
    if issubclass(type(value), torch.nn.Module):
        # Its plain attributes (``training``, ``self.steps``), and its parameters and buffers
        # by name (``mod.k = t`` rebinds a registered buffer in ``_buffers``); submodules are
        # walked as children.
        return "attrs", {**module_attributes(value), **value._parameters, **value._buffers}
    if issubclass(type(value), ATOMS) or issubclass(type(value), (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool,
                                                      types.ModuleType, types.FunctionType,
                                                      types.BuiltinFunctionType, types.MethodType,
                                                      staticmethod, classmethod, property, tuple,
                                                      frozenset, torch.nn.Module)) or value is MISSING:
        return None, None
    state = hidden.fingerprint(value)
    if state is not None:
        return "hidden", state  # a random generator or an iterator: refused if it moves
    if issubclass(type(value), ITEMS_IN_DATA) and subclass_attributes(value) is not None:
        # A user's ``class Cfg(UserDict)`` with attributes of its own: its items are its
        # ``.data``, so its attributes, that one among them, are what it holds.
        return "attrs", attributes(value)
    # Containers whose whole state is their items, whoever defined them (``bytearray``,
    # ``array``, ``UserDict``, a ``WeakValueDictionary``): watched, and replayed, as items.
    # (by type: ``isinstance`` against an ABC asks ``value.__class__``, which a user's
    # ``__getattribute__`` answers)
    cls = type(value)
    for builtin, kind in _BUILTIN_ITEMS:
        if issubclass(cls, builtin):
            # Through the nearest library class's methods (``dict``'s, ``OrderedDict``'s): a
            # user subclass's ``__iter__``, ``__len__`` or ``__getitem__`` is the user's code,
            # run only where the user's code runs it.
            base = library_base(cls)
            if kind == "dict" and any(key_code(k, library_module) for k in dict.__iter__(value)):
                # Keys whose ``__hash__``/``__eq__`` is the user's: kept as pairs, compared by
                # identity, so watching never hashes them (any change is refused: ``heap.RULES``).
                return "pairs", tuple(base.items(value))
            items = base.__iter__(value) if kind != "dict" else base.items(value)
            if SWAPPED_IN and kind in ("dict", "list"):  # (an lru_cache helper minihop stood in for there: the user's own)
                items = [(k, SWAPPED_IN.get(id(v), v)) for k, v in items] if kind == "dict" else \
                    [SWAPPED_IN.get(id(v), v) for v in items]
            return kind, (list if kind == "list" else set if kind == "set" else dict)(items)
    if issubclass(cls, (MutableSequence, MutableMapping, MutableSet)) and not is_library(cls):
        return "attrs", attributes(value)  # the user's own container: what it holds is its state
    if issubclass(cls, MutableSequence) and not issubclass(cls, (str, bytes)):
        return "list", list(value)
    if issubclass(cls, MutableMapping):  # (by its pairs: a weak dictionary's lookups compare keys)
        return "dict", dict(value.items())
    if issubclass(cls, MutableSet):
        return "set", set(value)
    if issubclass(type(value), type):
        if is_library(value):  # (a class exec made is the user's: library.is_exec_class)
            return None, None
        return "attrs", class_state(value)
    if is_library(type(value)) and not plain_holder(value) or native_state(type(value)):  # (``class Buf(io.BytesIO)``)
        return (None, None) if kept_by_library(value) else ("library", state_of(value))
    try:
        return "attrs", attributes(value)
    except Exception:
        return None, None


def class_state(cls: type) -> dict[str, Any]:
    """A class's own data attributes: its methods, dunders and minihop's own entries are not state."""
    return {k: v for k, v in own_dict(cls).items() if not k.startswith("__") and not k.startswith("_minihop")
            and not issubclass(type(v), (types.FunctionType, staticmethod, classmethod, property))}


def dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")
