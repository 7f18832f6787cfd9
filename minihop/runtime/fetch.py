"""Fetching a call's fwd inputs out of the caller's arguments.

Place in the pipeline: runtime (``capture.py``'s runner and checks use it). Each fwd input has
an ``InputSource``: a path into the arguments, a size of one, a tensor fetched again from its
global, cell or attribute (``live``), or a constant. ``fetcher`` follows them all;
``fetch_positional`` is the common case's fast form (each input a whole positional argument
or a size of one, as one generated expression, or nothing at all).

Invariant: lifted tensors are handed to fwd detached (eager's Function never gives them a
gradient); what an input's source says is what is fetched, on every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..spec import LIFTED_FROM, InputSource
from ..structure import make_getter

__all__ = ["fetch_positional", "fetcher"]


def fetcher(inputs: tuple[InputSource, ...],
            for_run: bool = False) -> Callable[[tuple[Any, ...], dict[str, Any]], list[Any]]:
    """One generated function pulling every fwd input out of the caller's arguments. With
    ``for_run`` (the capture's own runner), a tensor only backward reads is None: fwd passes it
    through untouched and backward fetches it when it runs (``runtime.backwards.live_slots``)."""
    getters: list[Callable[[tuple[Any, ...], dict[str, Any]], Any]] = []
    for source in inputs:
        if for_run and source.read_in_backward:
            getters.append(lambda args, kwargs: None)
            continue
        if source.fetched:
            getters.append(lambda args, kwargs, get=source.place.get: _detached(get(args)))
            continue
        if source.path is None:
            constant = source.constant
            # Lifted tensors never receive gradients (eager's Function does not see them).
            value = _detached(constant) if constant is not None else constant
            getters.append(lambda args, kwargs, v=value: v)
            continue
        get = make_getter(source.path)
        if source.dim is not None:
            getters.append(lambda args, kwargs, g=get, d=source.dim: g(args, kwargs).size(d))
        elif source.lifted:
            getters.append(lambda args, kwargs, g=get: _detached(g(args, kwargs)))
        else:
            getters.append(get)
    gs = tuple(getters)

    def fetch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        return [g(args, kwargs) for g in gs]

    return fetch


def _detached(value: Any) -> Any:
    if issubclass(type(value), torch.Tensor) and value.requires_grad:
        detached = value.detach()
        setattr(detached, LIFTED_FROM, value)  # for backward() in backward (tracer.recompute)
        return detached
    return value


def _positional_picks(inputs: tuple[InputSource, ...]) -> tuple[str, ...] | None:
    """Each fwd input as an expression over ``args``, when each is a whole positional argument
    (``args[0]``; a tensor, or a dynamic int) or a size of one (``args[0].size(1)``, a size
    symbol). A one-step argument path is never a lifted tensor's."""
    picks = []
    for source in inputs:
        if source.fetched or source.path is None \
                or len(source.path) != 1 or source.path[0][0] != "arg":
            return None
        i = int(source.path[0][1])
        picks.append(f"args[{i}]" if source.dim is None else f"args[{i}].size({int(source.dim)})")
    return tuple(picks)


def fetch_positional(inputs: tuple[InputSource, ...], arity: int) -> Callable[[tuple[Any, ...]], Any] | None:
    """``args -> fwd inputs``, or None when the arguments are the fwd inputs."""
    picks = _positional_picks(inputs)
    if picks is None:
        fetch_any = fetcher(inputs, for_run=True)
        return lambda args: fetch_any(args, {})
    if picks == tuple(f"args[{i}]" for i in range(arity)):
        return None
    fetch: Callable[[tuple[Any, ...]], Any] = eval(f"lambda args: ({''.join(f'{p}, ' for p in picks)})")
    return fetch
