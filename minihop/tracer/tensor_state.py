"""Calls on a tensor's autograd state while tracing: the ones a graph can hold, and the ones it cannot.

Place in the pipeline: tracer (``recorder.RecordingMode`` asks ``rewrite_autograd_call`` about
each torch call before running it). Two kinds of call change a tensor's autograd state rather
than make a tensor:

- ``t.requires_grad = True`` (the attribute setter) is the same program as
  ``t.requires_grad_(True)``, which the graph records as a node; the setter made no node, so a
  backward that recomputes and calls ``torch.autograd.grad`` lost it at run time. It is
  recorded as ``requires_grad_``.
- ``register_hook``, ``register_post_accumulate_grad_hook`` and ``retain_grad`` on a tensor
  that requires grad (a forward input, a tensor backward builds a graph on) act, in eager, on
  the caller's real tensor and the outer autograd graph. A graph has no such node: run on the
  fake tensor, the hook would be lost, silently. They are refused (MH104), so
  ``fallback="eager"`` runs the Function as eager does.

Invariant: every other call passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import UnsupportedOperationError

__all__ = ["rewrite_autograd_call"]

_REQUIRES_GRAD = torch._C.TensorBase.__dict__["requires_grad"]
_HOOKS = frozenset({"register_hook", "register_post_accumulate_grad_hook", "retain_grad"})


def rewrite_autograd_call(func: Any, args: tuple[Any, ...], describe: Callable[[], str],
                          where: Callable[[], str | None]) -> tuple[Any, tuple[Any, ...]]:
    """``(func, args)`` to run and record instead of this call (the same, for most calls)."""
    if getattr(func, "__self__", None) is _REQUIRES_GRAD and getattr(func, "__name__", "") == "__set__":
        return torch.Tensor.requires_grad_, (args[0], bool(args[1]))
    name = getattr(func, "__name__", None)
    if name in _HOOKS and args and isinstance(args[0], torch.Tensor) and args[0].requires_grad:
        raise UnsupportedOperationError(
            f"{describe()} calls {name}() on a tensor that requires grad.",
            "In eager it acts on the caller's real tensor and the outer autograd graph; a "
            "captured graph has no node for it, so on minihop's fake tensor it would be lost.",
            f"Call {name}() on the tensor outside the Function (before or after apply), or run "
            "this Function eagerly (minihop.function(F, fallback='eager')).",
            where=where())
    return func, args
