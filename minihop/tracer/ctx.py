"""The proxy ctx: what the user's forward and backward see as ``ctx``.

Place in the pipeline: tracer. It records, without acting on, every ctx call autograd would
act on: ``save_for_backward``, ``mark_non_differentiable``, ``mark_dirty``,
``set_materialize_grads``; it answers ``needs_input_grad`` with real booleans from the inputs;
any other attribute is stored as is (fake tensors stay fake, so backward can reach them).
The rewire turns what was recorded into graph structure and index lists.

A non-tensor given where eager takes tensors only is refused (``CtxArgumentError``) where and
when eager refuses it: ``save_for_forward`` at the call, the others once forward has returned
(``check_ctx_arguments``), ``save_for_backward`` only if a gradient can flow.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..errors import CtxArgumentError, UnsupportedOperationError
from .frames import format_frame, user_frame
from .handlers import note

__all__ = ["ASKED_WHAT", "CtxRecord", "ProxyCtx", "check_ctx_arguments"]

_LACKS = object()
# The ctx feature noted where the code asks what ctx is (its class, text or dict): under torch.func
# transforms eager's ctx is functorch's wrapper, so such a capture runs the user's Function there.
ASKED_WHAT = "what ctx is (its class, text or dict)"


@dataclasses.dataclass
class CtxRecord:
    """What the user's code told ctx while it was traced (mutable during tracing only)."""

    needs_input_grad: tuple[bool, ...]
    saved: tuple[Any, ...] | None = None
    non_differentiable: list[torch.Tensor] = dataclasses.field(default_factory=list)
    dirty: list[torch.Tensor] = dataclasses.field(default_factory=list)
    materialize_grads: bool = True
    # What the user's code used, in first-use order (for ``minihop.explain``).
    used: list[str] = dataclasses.field(default_factory=list)
    # ctx method -> the user's source line of its latest call (for messages).
    where: dict[str, str | None] = dataclasses.field(default_factory=dict)
    caller: dict[str, str] = dataclasses.field(default_factory=dict)  # method -> "F.forward"
    saved_reads: int = 0  # reads of saved_tensors (each unpacks every saved tensor in eager)
    reads_from: int = 0  # saved_reads when the backward being traced began
    # Attributes the user's code looked up and did not find (``getattr(ctx, "k", default)``):
    # in eager, the caller may set one on ``y.grad_fn`` before backward (``runtime.grad_fn``).
    missing: list[str] = dataclasses.field(default_factory=list)

    def use(self, feature: str) -> None:
        if feature not in self.used:
            self.used.append(feature)

    def called(self, method: str, caller: str) -> None:
        self.use(method)
        self.where[method] = format_frame(user_frame())
        self.caller[method] = caller


class ProxyCtx:
    """Stands in for ``torch.autograd.function.FunctionCtx`` during tracing. What the user's
    code asks of what ctx is answers as eager's ctx (``F._backward_cls``, an ``FBackward``):
    its ``__class__`` (so ``isinstance(ctx, FunctionCtx)``), its text, and its ``__dict__``,
    which holds the user's attributes only (minihop's own live in slots)."""

    __slots__ = ("_minihop_record", "_minihop_describe", "_minihop_eager", "_minihop_shared", "__dict__",
                 "__weakref__")
    _minihop_record: CtxRecord

    def __init__(self, needs_input_grad: tuple[bool, ...],
                 describe: Callable[[], str] = lambda: "Function.forward", eager_cls: type | None = None) -> None:
        object.__setattr__(self, "_minihop_record", CtxRecord(needs_input_grad))
        # Names the method running now ("F.forward", "F.setup_context"), for messages.
        object.__setattr__(self, "_minihop_describe", describe)
        object.__setattr__(self, "_minihop_eager", eager_cls)  # (type(ctx) in eager: identity.TYPE)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # (``type(ctx)`` stays ProxyCtx: minihop's own code asks that)
        object.__getattribute__(self, "_minihop_record").use(ASKED_WHAT)  # (under torch.func, eager's differs)
        return object.__getattribute__(self, "_minihop_eager") or ProxyCtx

    @property
    def needs_input_grad(self) -> tuple[bool, ...]:
        self._minihop_record.use("needs_input_grad")
        return self._minihop_record.needs_input_grad

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None:
        self._minihop_record.called("save_for_backward", self._minihop_describe())
        self._minihop_record.saved = tuple(tensors)

    def save_for_forward(self, *tensors: torch.Tensor | None) -> None:
        # Forward-mode AD only; reverse mode (all minihop captures) never reads these. Eager
        # checks the arguments at once (an AssertionError), gradients or not.
        self._minihop_record.called("save_for_forward", self._minihop_describe())
        _refuse_non_tensors("save_for_forward", tensors, True, self._minihop_record)

    @property
    def saved_tensors(self) -> tuple[Any, ...]:
        record = self._minihop_record
        record.use("saved_tensors")
        record.saved_reads += 1
        forward_cls = getattr(object.__getattribute__(self, "_minihop_eager"), "_forward_cls", None)
        if record.saved_reads - record.reads_from > 1 and getattr(forward_cls, "clear_saved_tensors_on_access", False):
            # Eager's second read raises (a RuntimeError the user's code may catch and go on
            # from), and the runtime's unpack would raise where the trace's did not: refused.
            raise note(UnsupportedOperationError(
                f"{self._minihop_describe()} reads ctx.saved_tensors a second time, and "
                f"{forward_cls.__qualname__} sets clear_saved_tensors_on_access=True.",
                "Eager's autograd raises on that read (the saved tensors were cleared by the first); "
                "a capture's backward unpacks them once per read, in its own code.",
                "Read ctx.saved_tensors once and keep the tuple, or run it eagerly with "
                "minihop.function(F, fallback='eager')."))
        return record.saved or ()

    saved_variables = saved_tensors

    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None:
        self._minihop_record.called("mark_non_differentiable", self._minihop_describe())
        self._minihop_record.non_differentiable.extend(tensors)

    def mark_dirty(self, *tensors: torch.Tensor) -> None:
        self._minihop_record.called("mark_dirty", self._minihop_describe())
        self._minihop_record.dirty.extend(tensors)

    def set_materialize_grads(self, value: bool) -> None:
        self._minihop_record.use(f"set_materialize_grads({bool(value)})")
        self._minihop_record.materialize_grads = bool(value)

    def __setattr__(self, name: str, value: Any) -> None:
        kind = "tensor" if issubclass(type(value), torch.Tensor) else type(value).__name__
        self._minihop_record.use(f"ctx.{name} ({kind})")
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:  # only for names the ctx lacks
        eager = None if name.startswith(("__", "_minihop")) else object.__getattribute__(self, "_minihop_eager")
        found = inspect.getattr_static(eager, name, _LACKS) if eager is not None else _LACKS
        if issubclass(type(found), type):
            return found  # (``ctx._forward_cls``: the Function)
        if found is not _LACKS:  # (``ctx.to_save``, ``ctx.metadata``, ``ctx.name()``: autograd's node)
            raise UnsupportedOperationError(
                f"{self._minihop_describe()} reads ctx.{name}, an attribute of eager's ctx (a {eager.__name__}, "
                "autograd's node) that minihop's ctx does not model.",
                "While traced, ctx is minihop's recorder of what forward and backward tell it; autograd's "
                "own state of the node (what it saved, its hooks, its metadata, its name) is not there.",
                "Keep what the Function needs as ctx attributes of its own, or run it eagerly with "
                "minihop.function(F, fallback='eager').", where=format_frame(user_frame()))
        if not name.startswith(("__", "_minihop")):
            self._minihop_record.missing.append(name)
        raise AttributeError(f"'FunctionCtx' object has no attribute '{name}'")

    def __repr__(self) -> str:
        object.__getattribute__(self, "_minihop_record").use(ASKED_WHAT)
        eager = object.__getattribute__(self, "_minihop_eager")
        if eager is None:
            return "<minihop proxy ctx>"
        return f"<{eager.__module__}.{eager.__qualname__} object at {hex(id(self))}>"


# Eager's words for each refusal (``torch/csrc/autograd/python_function.cpp``'s checks).
_EAGER_SAYS = {
    "save_for_backward": "TypeError 'save_for_backward can only save variables, but argument "
                         "{i} is of type {kind}'",
    "save_for_forward": "AssertionError 'save_for_forward expects all arguments to be tensors'",
    "mark_dirty": "RuntimeError 'mark_dirty can only accept variables, but argument {i} is of "
                  "type {kind}'",
    "mark_non_differentiable": "RuntimeError 'mark_non_differentiable only accepts variable "
                               "arguments, but got {kind}'",
}


def _refuse_non_tensors(method: str, values: Any, none_ok: bool, record: CtxRecord) -> None:
    for i, value in enumerate(values):
        if issubclass(type(value), torch.Tensor) or (none_ok and value is None):
            continue
        kind = type(value).__name__
        raise CtxArgumentError(
            f"{record.caller.get(method, 'forward')} passes a value of type {kind} to "
            f"ctx.{method} (argument {i}).",
            f"ctx.{method} takes tensors{' or None' if none_ok else ''} only; eager raises "
            + _EAGER_SAYS[method].format(i=i, kind=kind) + " for this call.",
            "Keep non-tensor values as ctx attributes (ctx.k = k); pass only tensors to "
            f"ctx.{method}.",
            where=record.where.get(method))


def check_ctx_arguments(ctx: ProxyCtx, grad_can_flow: bool) -> None:
    """Refuse non-tensors given to ctx, in eager's order once forward has returned: dirty
    first, then non-differentiable, then saved (checked only when autograd records the call)."""
    record = ctx._minihop_record
    _refuse_non_tensors("mark_dirty", record.dirty, False, record)
    _refuse_non_tensors("mark_non_differentiable", record.non_differentiable, False, record)
    if grad_can_flow:
        _refuse_non_tensors("save_for_backward", record.saved or (), True, record)
