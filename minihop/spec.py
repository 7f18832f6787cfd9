"""Records passed down the pipeline: where each forward graph input comes from.

Shared vocabulary between tracer (which discovers inputs), rewire (which orders them) and runtime
(which fetches them from the caller's arguments on every call).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch

from .structure import Path, Step, format_path

__all__ = ["InputSource", "Location", "OutsideWrite", "bind_arguments", "uses_setup_context"]


@dataclasses.dataclass(frozen=True)
class InputSource:
    """One forward graph input and where its value comes from.

    ``path`` locates it in the caller's arguments (``None`` for a tensor forward reached
    through a closure, a global or a module: ``constant`` then holds that tensor).
    ``arg_index`` is set when the input *is* one of forward's tensor arguments: it receives
    the gradient the user's backward returns at that position. Lifted inputs (from objects,
    containers, closures) have ``arg_index is None`` and never receive a gradient, as in eager.
    With dynamic shapes, a size symbol is an input too: ``dim`` is then set. A tensor reached
    through a closure cell, a global or a module held there is fetched anew on every call
    (``live``), as eager would read it; one reached another way is held as ``constant``.
    """

    name: str
    description: str
    path: Path | None
    arg_index: int | None
    constant: torch.Tensor | None = None
    dim: int | None = None  # a size symbol: ``path``'s tensor's size along ``dim``
    # For a tensor reached through a closure, global or module: fetches its current value.
    live: Callable[[], Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def lifted(self) -> bool:
        return self.arg_index is None


# Where a location starts: ("arg", i) a call argument, ("global", name) / ("closure", name) a
# value forward reads from its globals or closure cells, ("output", i) fwd output i.
Root = tuple[str, Any]


@dataclasses.dataclass(frozen=True)
class Location:
    """A place outside forward's return value where forward put a value, found again per call.

    The place is ``root``, then ``path`` (attribute/item/key steps down to the container),
    then ``step``: ``("attr", name)`` sets an attribute, ``("key", k)`` sets a dict item,
    ``("append", None)`` appends to a list. ``fetch_root`` reads a global or closure root
    now (as eager would, after a rebinding); an ``arg`` root is read from each call's
    arguments, an ``output`` root is that call's fwd output.
    """

    root: Root
    path: Path
    step: Step
    fetch_root: Callable[[], Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    def describe(self, argnames: tuple[str, ...] = ()) -> str:
        """The user's spelling: ``sink.append(...)``, ``obj.cache``, ``_CACHE['k']``, ``out._soft``."""
        kind, key = self.root
        if kind == "arg":
            base = format_path(((kind, key), *self.path), argnames)
        else:
            base = (f"output[{key}]" if kind == "output" else str(key)) + format_path(self.path)
        step_kind, step_key = self.step
        if step_kind == "append":
            return f"{base}.append(...)"
        return base + format_path(((step_kind, step_key),))


@dataclasses.dataclass(frozen=True)
class OutsideWrite:
    """Forward put a value at ``location``; a capture repeats that on every call.

    ``output`` is the fwd output holding the tensor (a hidden output: not part of the
    user's return value, never differentiable); for a Python value it is None and ``value``
    is the value forward wrote (a constant of the capture, like every Python value it saw).
    """

    location: Location
    output: int | None
    value: Any = None


def uses_setup_context(fn_cls: type) -> bool:
    """Whether ``fn_cls`` is written in the ``setup_context`` style (forward without ctx)."""
    return fn_cls.setup_context is not torch.autograd.Function.setup_context  # type: ignore[comparison-overlap]


def bind_arguments(fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Arguments to positions, exactly as ``Function.apply`` binds them.

    With ``setup_context``, eager binds keywords and fills defaults (``inputs`` then holds
    them all). Without it, keywords fill positions in order and defaults are left to Python;
    a keyword that skips a position is eager's TypeError.
    """
    setup_style = uses_setup_context(fn_cls)
    if not kwargs and not setup_style:
        return args  # the common case, decided without inspecting signatures
    signature = inspect.signature(fn_cls.forward)
    if setup_style:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.args)
    bound = signature.bind(None, *args, **kwargs)
    if bound.kwargs:
        names = list(signature.parameters)[1:]
        missing = next(i for i, n in enumerate(names) if n not in bound.arguments)
        raise TypeError(f"forward() missing required argument: '{names[missing]}' (position {missing})")
    return tuple(bound.args[1:])
