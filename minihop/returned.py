"""What forward returned: its structure (``OutputSpec``), rebuilt for each call.

Place in the pipeline: the structure layer. The tracer describes what forward returned
(``describe_output``: tensors become flat output indices, the caller's own objects paths into
the arguments, the rest constants); the runtime rebuilds it from each call's flat outputs
(``OutputSpec.rebuild``), making anew what eager's forward makes anew on every call
(``fresh``: containers, a ``Computed`` number; ``_deep``: an object forward made).

Invariant: rebuilding runs no code of the user's. Eager's forward built the object with the
user's ``__init__``; minihop copies the traced one instead, and a copy through ``copy.copy`` or
``copy.deepcopy`` would run the class's ``__reduce_ex__``, ``__copy__``, ``__deepcopy__`` or
``__getattr__``: a tuple, list, dict or set of the user's class is made by its library base
(``_rebuilt``), an object by ``structure._shallow``.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from .library_state import library_module
from .errors import UnsupportedOutputError
from .structure import (_GETTERS, Computed, Path, held_values, _contains_tensor, _holds_object, _is_object_container, _shallow,
                        attributes, make_getter)
from .user_code import class_answering_refusal, library_base, plain_items, plain_pairs

__all__ = ["OutputSpec", "describe_output", "fresh", "has_computed", "spec_has_computed"]


def has_computed(value: Any) -> bool:
    """Whether a ``Computed`` is anywhere in the plain containers of ``value``."""
    if issubclass(type(value), Computed):
        return True
    if issubclass(type(value), (tuple, list, set, frozenset)):
        return any(has_computed(v) for v in plain_items(value))
    if issubclass(type(value), dict):
        return any(has_computed(v) for _, v in plain_pairs(value))
    return False


def fresh(value: Any, args: tuple[Any, ...], copy_containers: bool = True,
          _memo: dict[int, Any] | None = None) -> Any:
    """``value`` for one call: each ``Computed`` evaluated on ``args``; plain containers
    (dict, list, set, tuple, ``torch.Size``) rebuilt, as forward builds them anew on each eager
    call (a caller's edit to one call's dict must not show in the next); other objects as they
    are. With ``copy_containers=False`` only containers holding a ``Computed`` are rebuilt."""
    if issubclass(type(value), Computed):
        return value(args)
    if not copy_containers and not has_computed(value):
        return value
    memo = {} if _memo is None else _memo
    if id(value) in memo:
        return memo[id(value)]  # (a list that holds itself: its copy)
    if issubclass(type(value), torch.Size):
        return torch.Size([fresh(v, args, copy_containers, memo) for v in value])
    if issubclass(type(value), (list, dict)):  # (a subclass, OrderedDict or the user's, keeps its class: _rebuilt)
        new = memo[id(value)] = _rebuilt(value, [])
        if issubclass(type(value), list):
            list.extend(new, [fresh(v, args, copy_containers, memo) for v in plain_items(value)])
        else:
            for k, v in plain_pairs(value):
                library_base(type(value)).__setitem__(new, k, fresh(v, args, copy_containers, memo))
        return new
    if issubclass(type(value), (tuple, set, frozenset)) and not hasattr(value, "_fields"):
        return _rebuilt(value, [fresh(v, args, copy_containers, memo) for v in plain_items(value)])
    return value


_BUILTIN_CONTAINERS = frozenset({tuple, list, set, frozenset})


def _deep(value: Any, memo: dict[int, Any]) -> Any:
    """A deep copy of a constant forward made and returned (an ``Info`` object, a list of
    them), made without the user's code: an object of the user's by ``structure._shallow``
    with its attributes copied, a container by its class's library base; a library's object by
    ``copy.deepcopy`` (its own code); numbers, strings, functions and classes as they are."""
    if id(value) in memo:
        return memo[id(value)]
    if issubclass(type(value), (list, dict)):  # (made empty first: one may hold itself)
        new = memo[id(value)] = _rebuilt(value, [])
        if issubclass(type(value), list):
            list.extend(new, [_deep(v, memo) for v in plain_items(value)])
        else:
            for k, v in plain_pairs(value):
                library_base(type(value)).__setitem__(new, k, _deep(v, memo))
        return new
    if issubclass(type(value), (tuple, set, frozenset)) and not hasattr(value, "_fields"):
        return _rebuilt(value, [_deep(v, memo) for v in plain_items(value)])
    if _is_object_container(value) and not library_module(type(value).__module__ or ""):
        new = memo[id(value)] = _shallow(value)
        for k, v in attributes(value).items():
            object.__setattr__(new, k, _deep(v, memo))
        return new
    return copy.deepcopy(value, memo) if _holds_object(value) else value


# Constants rebuild returns as they are (immutable, no Computed inside).
_PLAIN_CONSTS = frozenset({int, float, bool, str, bytes, complex, type(None)})

# Values that are leaves even though they may have a __dict__.
@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """The shape of what forward returned, with tensors replaced by flat output indices.

    ``kind`` is ``"tensor"`` (``index`` into the flat outputs), ``"arg"`` (the call's own object
    at path ``value``; ``template`` the traced call's), ``"const"`` (``value``; a
    ``Computed`` value is computed from each call's arguments), ``"tuple"``, ``"size"`` (a
    ``torch.Size``), ``"list"``, ``"namedtuple"``, ``"dict"`` or ``"object"`` (``children``,
    with ``keys`` for dicts/objects and ``template`` for namedtuples/objects, and for a
    subclass of tuple, list or dict an empty one of its class: ``_rebuilt``).
    """

    kind: str
    index: int = -1
    value: Any = None
    keys: tuple[Any, ...] = ()
    children: tuple["OutputSpec", ...] = ()
    template: Any = None

    def rebuild(self, flat: tuple[Any, ...] | list[Any], args: tuple[Any, ...] = ()) -> Any:
        """Rebuild the user's structure from the flat tensor outputs (and, for ``Computed``
        values, the call's bound arguments)."""
        kind = self.kind
        if kind == "tensor":
            return flat[self.index]
        if kind == "arg":  # the caller's own object, as eager returns it
            if not args:
                return self.template
            getter = _GETTERS.get(self.value)
            if getter is None:
                getter = _GETTERS[self.value] = make_getter(self.value)
            return getter(args, {})
        if kind == "const":
            value = self.value
            if type(value) in _PLAIN_CONSTS:
                return value
            # An object forward made (``Info(n)``): eager makes a new one on every call, so a
            # caller's edit to one call's must not show in the next (one that existed before
            # the call is refused: ``outputs.refuse_returned_state``).
            return fresh(_deep(value, {}) if _holds_object(value) else value, args)
        items = [c.rebuild(flat, args) for c in self.children]
        if kind in ("tuple", "list", "dict") and self.template is not None:  # a subclass, as forward made it
            return _rebuilt(self.template, list(zip(self.keys, items, strict=True)) if kind == "dict" else items)
        if kind == "tuple":
            return tuple(items)
        if kind == "size":
            return torch.Size(items)
        if kind == "list":
            return items
        if kind == "namedtuple":
            return type(self.template)(*items)
        if kind == "dict":
            return dict(zip(self.keys, items, strict=True))
        obj = _shallow(self.template)
        for k, v in zip(self.keys, items, strict=True):
            object.__setattr__(obj, k, v)
        return obj


def _rebuilt(template: Any, items: list[Any]) -> Any:
    """A new tuple, list, set or dict (``(key, value)`` items) of ``template``'s own class (a
    subclass forward returned, not at the top: eager hands it back as it is), made by its
    library base, with the template's attributes that hold no tensor."""
    cls = type(template)
    base = library_base(cls)
    if cls in _BUILTIN_CONTAINERS or cls is dict:
        return cls(items)
    if issubclass(type(template), (tuple, frozenset)):
        new = (tuple if issubclass(type(template), tuple) else frozenset).__new__(cls, items)
    elif issubclass(type(template), set):
        new = base.__new__(cls)
        set.update(new, items)
    else:
        new = base.__new__(cls)
        if issubclass(type(template), list):
            list.extend(new, items)
        else:
            if issubclass(type(template), collections.defaultdict):
                new.default_factory = template.default_factory
            for k, v in items:
                base.__setitem__(new, k, v)
    for k, v in attributes(template).items():
        if not _contains_tensor(v):
            object.__setattr__(new, k, v)
    return new


def describe_output(value: Any, on_tensor: Callable[[torch.Tensor, bool], int],
                    level: int = 0, from_args: dict[int, Path] | None = None) -> OutputSpec:
    """Build the ``OutputSpec`` of ``value``; ``on_tensor(t, top_level)`` returns t's flat index.

    ``top_level`` is True for a tensor returned directly or as an item of a returned tuple
    (``level`` 0 or 1): the only tensors eager autograd treats as outputs of the Function.
    ``from_args`` (``object_paths``): a container or object of the arguments is returned as
    the call's own ("arg").
    """
    if issubclass(type(value), torch.Tensor):
        return OutputSpec("tensor", index=on_tensor(value, level <= 1))
    refusal = class_answering_refusal("forward", (value,), "returned value") if level <= 1 else None
    if refusal is not None:
        raise refusal
    if from_args and id(value) in from_args and not issubclass(type(value), tuple):
        return OutputSpec("arg", value=from_args[id(value)], template=value)
    if issubclass(type(value), torch.Size) and level > 0:
        return OutputSpec("size", children=tuple(describe_output(v, on_tensor, 2, from_args) for v in value))
    if level > 0 and issubclass(type(value), (tuple, list, dict)) and _cyclic(value, set()):
        # A list, dict or tuple that holds itself (``loop.append(loop)``): a constant, copied
        # per call as a whole (``fresh``); one holding tensors too has no flat outputs to point at.
        if _contains_tensor(value):
            raise UnsupportedOutputError(
                "forward returns a list, dict or tuple that contains itself and holds tensors.",
                "A capture rebuilds what forward returned around its flat tensor outputs, and a "
                "structure that contains itself has no order in which to place them.",
                "Return the tensors in a structure without cycles, or run the Function eagerly "
                "with minihop.function(F, fallback='eager').")
        return OutputSpec("const", value=value)
    if issubclass(type(value), tuple):
        # Only the returned tuple itself spreads into outputs; deeper tuples are plain values.
        child_level = 1 if level == 0 else 2
        children = tuple(describe_output(v, on_tensor, child_level, from_args) for v in value)
        if hasattr(value, "_fields") and level > 0:
            # A returned namedtuple comes back from Function.apply as a plain tuple (eager).
            return OutputSpec("namedtuple", children=children, template=value)
        # (a subclass below the top keeps its class: the template; at the top eager's is a tuple)
        return OutputSpec("tuple", children=children, template=_rebuilt(value, []) if level > 0 and type(value) is not tuple else None)
    if issubclass(type(value), list):
        return OutputSpec("list", children=tuple(describe_output(v, on_tensor, 2, from_args) for v in plain_items(value)),
                          template=None if type(value) is list else _rebuilt(value, []))
    if issubclass(type(value), dict):
        pairs = list(plain_pairs(value))
        return OutputSpec("dict", keys=tuple(k for k, _ in pairs), children=tuple(
            describe_output(v, on_tensor, 2, from_args) for _, v in pairs), template=None if type(value) is dict else _rebuilt(value, []))
    if _is_object_container(value) and _contains_tensor(value):
        attrs = attributes(value)
        return OutputSpec("object", keys=tuple(attrs), template=value, children=tuple(
            describe_output(v, on_tensor, 2, from_args) for v in attrs.values()))
    return OutputSpec("const", value=value)


def _cyclic(value: Any, seen: set[int]) -> bool:
    """Whether ``value`` is among what its containers and objects hold (it holds itself)."""
    todo = [v for _, v in held_values(value) or ()]
    while todo:
        item = todo.pop()
        if item is value:
            return True
        if id(item) not in seen:
            seen.add(id(item))
            todo += [v for _, v in held_values(item) or ()]
    return False


def spec_has_computed(spec: OutputSpec) -> bool:
    """Whether rebuilding ``spec`` needs the call's arguments."""
    return has_computed(spec.value) or any(spec_has_computed(c) for c in spec.children)
