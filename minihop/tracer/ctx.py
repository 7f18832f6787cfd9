"""The proxy ctx: what the user's forward and backward see as ``ctx``.

Place in the pipeline: tracer. It records, without acting on, every ctx call autograd would
act on: ``save_for_backward``, ``mark_non_differentiable``, ``mark_dirty``,
``set_materialize_grads``; it answers ``needs_input_grad`` with real booleans from the inputs;
any other attribute is stored as is (fake tensors stay fake, so backward can reach them).
The rewire turns what was recorded into graph structure and index lists.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["CtxRecord", "ProxyCtx"]


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

    def use(self, feature: str) -> None:
        if feature not in self.used:
            self.used.append(feature)


class ProxyCtx:
    """Stands in for ``torch.autograd.function.FunctionCtx`` during tracing."""

    _minihop_record: CtxRecord

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        object.__setattr__(self, "_minihop_record", CtxRecord(needs_input_grad))

    @property
    def needs_input_grad(self) -> tuple[bool, ...]:
        self._minihop_record.use("needs_input_grad")
        return self._minihop_record.needs_input_grad

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None:
        self._minihop_record.use("save_for_backward")
        self._minihop_record.saved = tuple(tensors)

    def save_for_forward(self, *tensors: torch.Tensor | None) -> None:
        # Forward-mode AD only; reverse mode (all minihop captures) never reads these.
        self._minihop_record.use("save_for_forward")

    @property
    def saved_tensors(self) -> tuple[Any, ...]:
        self._minihop_record.use("saved_tensors")
        return self._minihop_record.saved or ()

    saved_variables = saved_tensors

    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None:
        self._minihop_record.use("mark_non_differentiable")
        self._minihop_record.non_differentiable.extend(tensors)

    def mark_dirty(self, *tensors: torch.Tensor) -> None:
        self._minihop_record.use("mark_dirty")
        self._minihop_record.dirty.extend(tensors)

    def set_materialize_grads(self, value: bool) -> None:
        self._minihop_record.use(f"set_materialize_grads({bool(value)})")
        self._minihop_record.materialize_grads = bool(value)

    def __setattr__(self, name: str, value: Any) -> None:
        kind = "tensor" if isinstance(value, torch.Tensor) else type(value).__name__
        self._minihop_record.use(f"ctx.{name} ({kind})")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return "<minihop proxy ctx>"
