"""A call's arguments as autograd sees them: bound to positions, and the marks Dynamo left on them.

Place in the pipeline: below every stage, beside ``structure`` (it imports nothing from
minihop). ``bind_arguments`` binds a call's arguments to forward's positions exactly as
``Function.apply`` does (the tracer traces, the cache keys and the runtime runs with the same
tuple); ``marks`` reads the dimensions ``torch._dynamo.mark_dynamic`` and its kin marked on a
tensor argument, without importing Dynamo.

Invariant: binding raises exactly eager's ``TypeError`` where eager's ``apply`` refuses a call.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = ["STRICT_MARKS", "bind_arguments", "is_dynamo_mark", "marks", "uses_setup_context"]


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
        _refuse_keyword_only(bound.kwargs)
        return tuple(bound.args)
    bound = signature.bind(None, *args, **kwargs)
    _refuse_keyword_only(bound.kwargs)
    if bound.kwargs:
        names = list(signature.parameters)[1:]
        missing = next(i for i, n in enumerate(names) if n not in bound.arguments)
        raise TypeError(f"forward() missing required argument: '{names[missing]}' (position {missing})")
    return tuple(bound.args[1:])


def _refuse_keyword_only(kwargs: dict[str, Any]) -> None:
    """A keyword-only forward parameter that gets a value: eager's ``Function.apply`` passes it
    as a keyword to the C++ apply, which refuses it with this TypeError (with
    ``setup_context`` even when only its default fills it)."""
    if kwargs:
        raise TypeError(f"forward() got an unexpected keyword argument '{next(iter(kwargs))}'")


# The attributes Dynamo's mark_dynamic, maybe_mark_dynamic and mark_static set on a tensor.
STRICT_MARKS = "_dynamo_dynamic_indices"


def is_dynamo_mark(name: str) -> bool:
    """A tensor attribute Dynamo's ``mark_dynamic`` and its kin set (read on their own:
    not one of the Python attributes a capture carries and keys)."""
    return name.startswith("_dynamo") or name in ("_specialize_on", "_specialized_on", "_has_dynamo_dim_marking")


_MARKS = (STRICT_MARKS, "_dynamo_weak_dynamic_indices", "_dynamo_static_indices")


def marks(value: Any) -> tuple[frozenset[int], frozenset[int], frozenset[int]] | None:
    """The dimensions Dynamo's ``mark_dynamic``, ``maybe_mark_dynamic`` and ``mark_static``
    marked on a tensor (plain attributes it carries; read without importing Dynamo), as
    non-negative indices; None for an unmarked value."""
    if not issubclass(type(value), torch.Tensor) or not hasattr(value, "_has_dynamo_dim_marking"):
        return None
    n = value.dim()
    return tuple(frozenset(int(d) % n for d in getattr(value, attr, ()) if -n <= int(d) < n)  # type: ignore[return-value]
                 for attr in _MARKS)
