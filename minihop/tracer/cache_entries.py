"""What an ``lru_cache`` helper's cache holds for a call, beside what the trace computed.

Place in the pipeline: tracer, asked by ``hidden.ReadWatch`` each time the user's code calls an
``lru_cache``/``functools.cache`` helper while traced. The trace bypasses the cache (it must
never keep a fake tensor) and the graphs compute the helper's result afresh, which equals
eager's only while the cache's entry is what the helper makes. A mutable object the cache hands
out (a config dict, a list, an object: ``get_config()["lr"] = 0.1`` from anywhere) may have been
changed since it was made, and may be again between calls. So where the result holds no tensor
and the call's arguments are plain values, the cache's own entry is fetched (the call eager
makes) and compared with the trace's: a difference is refused, and the capture is single-use
(the object may change before the next call).

Invariant: the trace's answer is the cache's, or the capture is refused; never the fresh one
where they differ. (A tensor the cache holds, written in place by the caller, is not compared:
docs/reads.md, Open.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..errors import SideEffectError
from .atoms import CONSTANTS, holds_tensor
from .effects import held
from .routes import state_named

__all__ = ["NOT_FETCHED", "cached_entry", "stale_cache_check"]

NOT_FETCHED = object()


def _plain(value: Any) -> bool:
    if issubclass(type(value), (tuple, frozenset)):
        return all(_plain(v) for v in value)
    return type(value) in CONSTANTS or value is None


def cached_entry(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], fresh: Any, what: str,
                 where: str) -> Any:
    """The object ``fn``'s cache holds for ``args`` (the call eager makes, made now), where the
    trace's ``fresh`` result is a mutable object without tensors; ``NOT_FETCHED`` otherwise
    (a tensor, a constant, arguments of the trace's). Refused where the two differ."""
    if _plain(fresh) or holds_tensor(fresh) or not all(_plain(a) for a in (*args, *kwargs.values())):
        return NOT_FETCHED
    with unset_fake_temporarily(), torch._C.DisableTorchFunction():
        entry = fn(*args, **kwargs)
    if held(entry) != held(fresh):
        raise SideEffectError(
            f"The object {what} (an lru_cache helper) returned was changed since its cache made it.",
            "Eager gets that very object from the cache, as changed; a capture computes the "
            "helper's result afresh in its graphs, so it would read the object as first made.",
            "Pass what the Function reads of it as an argument, or run it eagerly with "
            "minihop.function(F, fallback='eager').", where=where)
    return entry


def stale_cache_check(fn: Any, what: str, where: str, result: str = "tensor") -> None:
    """An lru_cache helper returned a ``result`` (a tensor, or a value: a number, a tuple...): the capture
    computes it (the graphs, or a constant in them), where eager gets what its cache holds,
    computed when that entry was made. Equal only if it is a function of its arguments alone;
    one that reads state outside them (a global tensor, a number, an object, a class) is
    refused, since its cache may hold a value computed from that state as it was."""
    read = state_named(fn.__wrapped__)
    if read is not None:
        raise SideEffectError(
            f"{what} (an lru_cache helper) returned a {result} computed from {read}, which is "
            "not one of its arguments.",
            f"Eager gets the {result} its cache holds, computed from "
            f"{read} as it was when that entry was made; a capture computes it again from "
            f"{read} as it is now, and the two differ once {read} changes (its cache is not "
            "keyed by it).",
            f"Pass {read} to the cached function as an argument, compute the {result} outside "
            "the Function and pass it in, or run it eagerly with minihop.function(F, "
            "fallback='eager').",
            where=where)
