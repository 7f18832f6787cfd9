"""Python structures around tensors: paths to leaves, flattening plans, rebuilding plans.

Shared by the tracer (which swaps argument tensors for fake ones and flattens what forward
returned) and the runtime (which pulls graph inputs out of the caller's arguments and rebuilds
the caller's output structure). Everything decided here is decided once, at capture time: a
plan is a small closure the hot path calls, not a walk over the structure.

Invariant: ``flatten`` and ``rebuild`` agree on leaf order (depth first: tuple/list items in
order, dict items in insertion order, object attributes in ``vars()`` order).
"""

from __future__ import annotations

import collections
import copy
import enum
import functools
import math
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .library_state import library_module, own_dict
from .user_code import library_base, plain_items, plain_pairs

__all__ = ["Step", "Path", "argname", "format_path", "held_values", "iter_leaves", "replace_tensors", "make_getter",
           "path_expression", "object_paths", "Computed", "attributes",
           "PLAIN_CALLABLES"]

# One step from a container to a part of it: ("arg", i), ("kw", name), ("item", i),
# ("key", k) or ("attr", name).
Step = tuple[str, Any]
Path = tuple[Step, ...]

class Computed:
    """A Python number forward computed from dynamic sizes (``x.shape[0]``, ``k / 2``), as code
    over the call's bound arguments ``args`` (``args[0].size(0) / 2``).

    With symbolic sizes, a number forward returns or writes is a symbol of the trace (``s93``),
    not the value eager would give for the next call: each call computes it from its own
    arguments instead (``fresh``). The code is the whole record, so it can be saved.
    """

    __slots__ = ("code", "_fn")

    def __init__(self, code: str) -> None:
        self.code = code
        self._fn: Callable[[tuple[Any, ...]], Any] = eval(
            f"lambda args: {code}", {"math": math, "torch": torch})  # the ShapeEnv printer's names

    def __call__(self, args: tuple[Any, ...]) -> Any:
        return self._fn(args)

    def __repr__(self) -> str:
        return f"Computed({self.code!r})"

    def __eq__(self, other: object) -> bool:
        return issubclass(type(other), Computed) and other.code == self.code

    def __hash__(self) -> int:
        return hash(self.code)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Computed, (self.code,))


_ATOMIC = (str, bytes, int, float, bool, complex, type(None), enum.Enum, torch.dtype,
           torch.device, torch.layout, torch.memory_format, type, torch.nn.Module,
           torch.SymInt, torch.SymFloat, torch.SymBool, Computed)


# Callables that are code, not objects holding state: keyed by identity, never looked into.
PLAIN_CALLABLES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                    types.BuiltinMethodType, functools.partial, types.ModuleType)


def _is_object_container(value: Any) -> bool:
    """A user object whose attributes we look into (dataclasses, plain and __slots__ classes,
    callable instances too)."""
    if issubclass(type(value), (*_ATOMIC, *PLAIN_CALLABLES)) or issubclass(type(value), torch.Tensor):
        return False
    return (own_dict(value) is not None or bool(_slot_names(type(value)))) and not issubclass(type(value), type)


def _slot_names(cls: type) -> tuple[str, ...]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if issubclass(type(slots), str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return tuple(names)


def attributes(value: Any) -> dict[str, Any]:
    """An object's attributes: its ``__dict__`` and its set ``__slots__``. Read past a user's
    ``__getattribute__`` (what the object holds; what that method answers is its code's read)."""
    own = type(value).__getattribute__  # (a C class's own, as ``threading.local``'s, answers as it should)
    get = _raw_get if issubclass(type(own), types.FunctionType) and not library_module(own.__module__) else getattr
    found = dict(get(value, "__dict__", {}))
    for name in _slot_names(type(value)):
        got = get(value, name, _UNSET)
        if got is not _UNSET:
            found[name] = got
    return found


_UNSET = object()


def _raw_get(value: Any, name: str, default: Any) -> Any:
    try:
        return object.__getattribute__(value, name)
    except AttributeError:
        return default


def argname(i: int, argnames: tuple[str, ...]) -> str:
    """Argument ``i``'s name, or ``args[i]`` past the named ones."""
    return argnames[i] if i < len(argnames) else f"args[{i}]"


def format_path(path: Path, argnames: tuple[str, ...] = ()) -> str:
    """``(("arg", 1), ("attr", "b"))`` -> ``weird.b`` (or ``args[1].b`` without names)."""
    out = ""
    for kind, key in path:
        if kind == "arg":
            out += argname(key, argnames)
        elif kind == "kw":
            out += str(key)
        elif kind == "item":
            out += f"[{key}]"
        elif kind == "key":
            out += f"[{key!r}]"
        else:
            out += f".{key}"
    return out


def iter_leaves(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Yield ``(path, leaf)`` for every leaf (tensor or other atom) below ``value``. A
    container met again below itself (a tree with parent links) is not entered again: a
    cycle holds no leaf its first visit did not yield."""
    return _iter_leaves(value, path, set())


def _iter_leaves(value: Any, path: Path, open_: set[int]) -> Iterator[tuple[Path, Any]]:
    if issubclass(type(value), torch.Tensor):
        yield path, value
        return
    children = held_values(value)
    if children is None:
        yield path, value
        return
    if id(value) in open_:
        return  # a cycle: already being walked above
    open_.add(id(value))
    try:
        for step, item in children:
            yield from _iter_leaves(item, path + (step,), open_)
    finally:
        open_.discard(id(value))


def held_values(value: Any) -> list[tuple[Step, Any]] | None:
    """What a container or user object holds, as (step, value) pairs (the steps paths are
    made of); None for a leaf (a tensor or another atom)."""
    if issubclass(type(value), torch.Tensor):
        return None
    if issubclass(type(value), (tuple, list)):  # (past a subclass's own methods: user_code)
        return [(("item", i), item) for i, item in enumerate(plain_items(value))]
    if issubclass(type(value), dict):
        return [(("key", k), item) for k, item in plain_pairs(value)]
    if _is_object_container(value):
        return [(("attr", k), item) for k, item in attributes(value).items()]
    return None


def object_paths(args: tuple[Any, ...]) -> dict[int, Path]:
    """Where each container and user object inside the arguments is (``("arg", i)`` first),
    by id: what forward returns of them is the caller's own object (``OutputSpec`` "arg")."""
    found: dict[int, Path] = {}
    todo = [((("arg", i),), v) for i, v in enumerate(args)]
    while todo:
        path, value = todo.pop()
        children = held_values(value)
        if children is None or id(value) in found or len(path) > 8:
            continue
        found[id(value)] = path
        # (a path is code, ``args[1]['k']``: a key that is no literal, an object, is left out)
        todo += [((*path, step), item) for step, item in children
                 if step[0] != "key" or type(step[1]) in (str, int, bool, type(None))]
    return found


_GETTERS: dict[Path, Callable[[tuple[Any, ...], dict[str, Any]], Any]] = {}


def _holds_object(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is, or a plain container in it holds, a user object."""
    if _is_object_container(value):
        return True
    if depth < 8 and issubclass(type(value), (tuple, list, set, frozenset)):
        return any(_holds_object(v, depth + 1) for v in plain_items(value))
    if depth < 8 and issubclass(type(value), dict):
        return any(_holds_object(v, depth + 1) for _, v in plain_pairs(value))
    return False


def _contains_tensor(value: Any) -> bool:
    return any(issubclass(type(leaf), torch.Tensor) for _, leaf in iter_leaves(value))


def replace_tensors(value: Any, fn: Callable[[Path, torch.Tensor], Any], path: Path = ()) -> Any:
    """A copy of ``value`` with each tensor ``t`` at ``path`` replaced by ``fn(path, t)``.

    Containers are rebuilt, user objects are shallow-copied; parts without tensors are kept
    as they are (same object), as eager would pass them. A cycle (a child linking back to
    its parent) is rebuilt as a cycle of the copies.
    """
    return _replace(value, fn, path, {})


def _replace(value: Any, fn: Callable[[Path, torch.Tensor], Any], path: Path,
             made: dict[int, Any]) -> Any:
    if issubclass(type(value), torch.Tensor):
        return fn(path, value)
    if id(value) in made:
        return made[id(value)]  # met again below itself: the copy being built
    if not _contains_tensor(value):
        return value
    if issubclass(type(value), tuple):  # (iterated past a subclass's own methods: user_code)
        items = [_replace(v, fn, path + (("item", i),), made) for i, v in enumerate(plain_items(value))]
        if hasattr(value, "_fields"):
            return type(value)(*items)
        return tuple(items) if type(value) is tuple else _same_class(value, tuple.__new__(type(value), items))
    if issubclass(type(value), list):
        new_list: list[Any] = [] if type(value) is list else _same_class(value, list.__new__(type(value)))
        made[id(value)] = new_list
        list.extend(new_list, (_replace(v, fn, path + (("item", i),), made) for i, v in enumerate(plain_items(value))))
        return new_list
    if issubclass(type(value), dict):
        base = library_base(type(value))
        if base is type(value):
            new = copy.copy(value)
        else:  # a user's subclass: made by its library base (its own methods are the user's code)
            new = _same_class(value, base.__new__(type(value)))
            if issubclass(type(value), collections.defaultdict):
                new.default_factory = value.default_factory
        made[id(value)] = new
        for k, v in plain_pairs(value):
            base.__setitem__(new, k, _replace(v, fn, path + (("key", k),), made))
        return new
    new_obj = _shallow(value)
    made[id(value)] = new_obj
    for k, v in attributes(value).items():
        # object.__setattr__ also works for frozen dataclasses.
        object.__setattr__(new_obj, k, _replace(v, fn, path + (("attr", k),), made))
    return new_obj


def _shallow(value: Any) -> Any:
    """A shallow copy of the user's object ``value`` made without its code: ``copy.copy`` asks
    it for ``__reduce_ex__``, ``__copy__`` and ``__setstate__``, which a class's ``__getattr__``
    answers (counting, or reading its own ``__dict__`` on the new object: recursing forever).
    ``object.__new__`` and its ``__dict__``; a class over a C type that needs its own
    ``__new__`` is copied by ``copy.copy``."""
    try:
        new = object.__new__(type(value))
    except TypeError:
        return copy.copy(value)
    try:
        object.__getattribute__(new, "__dict__").update(object.__getattribute__(value, "__dict__"))
    except AttributeError:
        pass  # (``__slots__`` only: set from ``attributes`` by the caller)
    return new


def _same_class(value: Any, new: Any) -> Any:
    """``new``, a copy of builtin subclass ``value`` made by the builtin (its class's own
    ``__new__``/``__init__`` are the user's code), given ``value``'s own attributes: the code
    sees the class it was passed (``isinstance(p, Pair)``)."""
    for k, v in attributes(value).items():
        object.__setattr__(new, k, v)
    return new


def make_getter(path: Path) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """A function ``(args, kwargs) -> value at path``, generated once for the hot path."""
    fn: Callable[[tuple[Any, ...], dict[str, Any]], Any] = eval(f"lambda args, kwargs: {path_expression(path)}")
    return fn


def path_expression(path: Path) -> str:
    """Python code for the value at ``path`` over ``args`` (and ``kwargs``)."""
    expr = ""
    for kind, key in path:
        if kind == "arg":
            expr = f"args[{int(key)}]"
        elif kind == "kw":
            expr = f"kwargs[{key!r}]"
        elif kind == "item":
            expr += f"[{int(key)}]"
        elif kind == "key":
            expr += f"[{key!r}]"
        elif str(key).isidentifier():
            expr += f".{key}"
        else:  # a module's child named by its index (nn.Sequential's "0"): not Python syntax
            expr = f"getattr({expr}, {str(key)!r})"
    return expr
