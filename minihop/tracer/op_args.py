"""The tensors among a call's arguments and results, and mapping over them, made fast.

Place in the pipeline: tracer, used by ``recorder`` on every call the user's code makes while
traced (which tensors a call may write into, whether it made a tensor, its arguments as graph
values). Tuples, lists, dicts and slices are walked by hand: pytree's general machinery costs
tens of microseconds an op, a large part of a capture. Anything else (namedtuples, other
pytree nodes) goes to pytree.

Invariant: the same leaves as pytree, in pytree's order (slices' bounds included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["any_leaf", "is_tensor", "map_plain", "tensors_in", "version_of"]

_PLAIN = (tuple, list, dict)


def is_tensor(value: Any) -> bool:
    return issubclass(type(value), torch.Tensor)


def version_of(t: torch.Tensor) -> int:
    """``t._version``, or -1 for an inference tensor, which keeps no counter (torch raises on
    ``_version``; eager refuses an in-place write into one outside inference mode anyway)."""
    try:
        return t._version
    except RuntimeError:
        return -1


def tensors_in(value: Any, found: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors among an op's arguments (in plain containers too: ``_foreach_add_``)."""
    kind = type(value)
    if kind is tuple or kind is list:
        for v in value:
            tensors_in(v, found)
    elif kind is dict:
        for v in value.values():
            tensors_in(v, found)
    elif issubclass(type(value), torch.Tensor):
        found.append(value)
    elif issubclass(type(value), _PLAIN):
        found.extend(v for v in tree_flatten(value)[0] if issubclass(type(v), torch.Tensor))
    return found


def any_leaf(test: Callable[[Any], bool], value: Any) -> bool:
    kind = type(value)
    if kind is tuple or kind is list:
        return any(any_leaf(test, v) for v in value)
    if kind is dict:
        return any(any_leaf(test, v) for v in value.values())
    if issubclass(type(value), _PLAIN):  # a subclass: namedtuple, OrderedDict, ...
        return any(test(v) for v in tree_flatten(value)[0])
    return test(value)


def map_plain(fn: Callable[[Any], Any], value: Any) -> Any:
    kind = type(value)
    if kind is tuple:
        return tuple(map_plain(fn, v) for v in value)
    if kind is list:
        return [map_plain(fn, v) for v in value]
    if kind is dict:
        return {k: map_plain(fn, v) for k, v in value.items()}
    if kind is slice:
        # x[:n] with a symbolic n: the bound must be the size's node, not the SymInt itself
        # (which would be replayed as the size it had while tracing).
        return slice(map_plain(fn, value.start), map_plain(fn, value.stop), map_plain(fn, value.step))
    if issubclass(type(value), _PLAIN):
        return tree_map(fn, value)
    return fn(value)

