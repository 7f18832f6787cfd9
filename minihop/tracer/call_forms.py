"""How a torch call the user made is written as a graph node: as the user wrote it.

Place in the pipeline: tracer, asked by ``recorder.GraphRecorder.record`` for each call it
records. The node is an operator with the operands in source order when the user's syntax
meant one (``operators``' form), a method as a method, a tensor property as ``getattr``, and a
``torch.nn.functional`` call with only the keywords the user passed: Dynamo's forms, so the
printed body reads like the user's code and compares with ``torch.compile``'s.

Invariant: the form chosen never changes what the node computes, only how it is spelled.
"""

from __future__ import annotations

import functools
import inspect
import operator
import types
from typing import Any

from .operators import Form

__all__ = ["graph_call", "passed_kwargs"]


def graph_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               form: Form | None) -> tuple[str, Any, tuple[Any, ...]]:
    """Choose how a call is written in the graph: (op, target, args), as the user wrote it
    (``form``: the Python operator their syntax meant, see operators), in Dynamo's forms."""
    if form is not None and not kwargs:
        target, reflected = form
        return "call_function", target, (args[1], args[0]) if reflected else args
    name = getattr(func, "__name__", None)
    owner = getattr(func, "__qualname__", "").split(".")[0]
    if owner in ("TensorBase", "Tensor") and name is not None:
        if name == "__getitem__":
            return "call_function", operator.getitem, args
        return "call_method", name, args
    if name == "__get__" and hasattr(func, "__self__"):
        # A tensor property such as ``x.T`` or ``x.real``.
        return "call_function", getattr, (args[0], func.__self__.__name__)
    return "call_function", func, args



@functools.lru_cache(maxsize=512)
def _defaults(func: types.FunctionType) -> dict[str, Any]:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def passed_kwargs(func: types.FunctionType, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A ``torch.nn.functional`` function (``F.relu``, ``F.softmax``) hands every keyword to the
    mode, its defaults filled in (``inplace=False``, ``_stacklevel=3``); the user passed only
    the others, and Dynamo records only those. A constant equal to its default is dropped."""
    defaults = _defaults(func)
    return {k: v for k, v in kwargs.items()
            if not (k in defaults and type(v) is type(defaults[k])
                    and issubclass(type(v), (bool, int, float, str, type(None))) and v == defaults[k])}

