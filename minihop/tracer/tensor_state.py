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
- Every other setter of a tensor's own state (``t.grad = g``, ``t.data = v``, ``del t.grad``,
  ``t.real = v``, ``t._backward_hooks = ...``) on any tensor: no op makes it, so the graph has
  no node for it. Run on the fake tensor it would be lost for the caller's tensor (a ``.grad``
  set on an input, a global, a saved tensor) and for the phase's own (later reads of ``y``
  after ``y.data = v`` are the old value's node in the graph): refused (MH104).
- forward-mode AD's dual ops (``torch._make_dual``, ``_unpack_dual``), however reached: refused
  (MH104; ``kinds.refuse_torch_io`` refuses the level and hooks set up by name).
- ``torch.autograd.grad`` (and ``backward()``, see ``recompute``) over an autograd graph that
  holds another ``autograd.Function``'s node: the graph records that Function's forward ops
  inlined, so at run time autograd differentiates those ops and never calls its own
  ``backward`` (eager does). Refused (MH104) by ``refuse_inner_function_nodes``.

Invariant: every other call passes through unchanged.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from ..errors import UnsupportedOperationError

__all__ = ["refuse_inner_function_nodes", "rewrite_autograd_call"]

_REQUIRES_GRAD = torch._C.TensorBase.__dict__["requires_grad"]
_HOOKS = frozenset({"register_hook", "register_post_accumulate_grad_hook", "retain_grad"})
_SETTERS = frozenset({"__set__", "__delete__"})
_DUAL = frozenset({"_make_dual", "_unpack_dual"})


def rewrite_autograd_call(func: Any, args: tuple[Any, ...], describe: Callable[[], str],
                          where: Callable[[], str | None]) -> tuple[Any, tuple[Any, ...]]:
    """``(func, args)`` to run and record instead of this call (the same, for most calls)."""
    if getattr(func, "__self__", None) is _REQUIRES_GRAD and getattr(func, "__name__", "") == "__set__":
        return torch.Tensor.requires_grad_, (args[0], bool(args[1]))
    name = getattr(func, "__name__", None)
    if name in _SETTERS and issubclass(type(owner := getattr(func, "__self__", None)), types.GetSetDescriptorType) \
            and owner.__objclass__ is torch._C.TensorBase:
        spelled = f"del t.{owner.__name__}" if name == "__delete__" else f"t.{owner.__name__} = ..."
        raise UnsupportedOperationError(
            f"{describe()} sets a tensor's own `.{owner.__name__}` (`{spelled}`).",
            "No tensor operation makes that change, so a captured graph has no node for it: on "
            "minihop's fake tensor it is lost for the real one (a `.grad` set on an input, a "
            "global, a saved tensor stays unset), and the graph keeps using the value the "
            "tensor had before (`y.data = v`, then `y`).",
            "Make the change outside the Function (before or after apply), write it as an "
            "operation (`y = y.clamp(min=0)` for `y.data = y.data.clamp(min=0)`; return a "
            "gradient as an output), or run this Function eagerly "
            "(minihop.function(F, fallback='eager')).", where=where())
    if name in _DUAL and (getattr(func, "__module__", None) or "torch").split(".")[0] == "torch":
        # (forward AD reached through library code: the level it names is the trace's, gone when the graph runs)
        raise UnsupportedOperationError(
            f"{describe()} calls torch.{name}, forward-mode AD.",
            "Its dual tensors live at a forward-AD level entered while traced; the captured graph would "
            "name that level when it runs, where no such level is entered.",
            "Compute the tangent outside the Function, or run this Function eagerly "
            "(minihop.function(F, fallback='eager')).", where=where())
    if name in _HOOKS and args and issubclass(type(args[0]), torch.Tensor) and args[0].requires_grad:
        raise UnsupportedOperationError(
            f"{describe()} calls {name}() on a tensor that requires grad.",
            "In eager it acts on the caller's real tensor and the outer autograd graph; a "
            "captured graph has no node for it, so on minihop's fake tensor it would be lost.",
            f"Call {name}() on the tensor outside the Function (before or after apply), or run "
            "this Function eagerly (minihop.function(F, fallback='eager')).",
            where=where())
    if func is torch.autograd.grad and args:
        outputs = args[0]
        refuse_inner_function_nodes((outputs,) if issubclass(type(outputs), torch.Tensor) else tuple(outputs),
                                    describe(), where())
    return func, args


def refuse_inner_function_nodes(outputs: tuple[Any, ...], describe: str, where: str | None) -> None:
    """Raise MH104 if the autograd graph behind ``outputs`` holds a custom Function's node (a
    ``BackwardCFunction``: ``Inner.apply`` called where grad is enabled). The captured graph
    holds that Function's forward ops, not its backward: differentiated at run time, the
    graph's gradient would be the ops', where eager's calls the Function's own backward."""
    seen: set[int] = set()
    stack = [t.grad_fn for t in outputs if issubclass(type(t), torch.Tensor) and t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if issubclass(type(fn), torch.autograd.function.BackwardCFunction):
            raise UnsupportedOperationError(
                f"{describe} differentiates (torch.autograd.grad or backward()) through "
                f"{type(fn).__name__.removesuffix('Backward')}.apply, another autograd.Function.",
                "minihop records the inner Function's forward ops into the graph; differentiated "
                "when the graph runs, they give the ops' gradient, not the inner Function's own "
                "backward that eager calls.",
                "Call the inner Function's backward logic directly, or run this Function eagerly "
                "(minihop.function(F, fallback='eager')).", where=where)
        stack.extend(next_fn for next_fn, _ in fn.next_functions if next_fn is not None)
