"""What one call of each benchmarked variant is: callers, compiled callers, fwd+bwd steps.

Place: bench/, shared by the measurements. Every variant of a case runs the same step: the
forward, ``loss.backward()`` where ``loss`` is the sum of ``.sum()`` of each output that
requires grad, then the grads of the leaf arguments cleared, so that only the call itself
differs between variants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["RecordingBackend", "compiled", "fresh_caller", "fwd_bwd", "loss_of", "ops_only",
           "grad_leaves"]


def grad_leaves(args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
    """The tensor arguments whose ``.grad`` a step fills (and then clears)."""
    return tuple(a for a in args if isinstance(a, torch.Tensor) and a.requires_grad)


def loss_of(out: Any) -> torch.Tensor:
    """Sum of ``.sum()`` over the tensor outputs that require grad."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    parts = [o.sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    loss = parts[0]
    for p in parts[1:]:
        loss = loss + p
    return loss


def fwd_bwd(call: Callable[[], Any], args: tuple[Any, ...]) -> Callable[[], None]:
    """One training-style step through ``call``: forward, backward, clear grads."""
    leaves = grad_leaves(args)

    def step() -> None:
        loss_of(call()).backward()
        for t in leaves:
            t.grad = None

    return step


def fresh_caller(fn_cls: type, tag: str) -> Callable[..., Any]:
    """``lambda *a: fn_cls.apply(*a)`` with a code object of its own, so that each compiled
    caller has its own Dynamo cache (no recompile limits, no sharing between backends)."""
    namespace: dict[str, Any] = {"F": fn_cls}
    source = "def call(*args):\n    return F.apply(*args)\n"
    exec(compile(source, f"<bench caller {fn_cls.__qualname__} {tag}>", "exec"), namespace)
    caller: Callable[..., Any] = namespace["call"]
    return caller


class RecordingBackend:
    """A Dynamo backend that records the graph and runs it as is (``backend="eager"``'s work)."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.graphs += 1
        return gm.forward


def compiled(fn_cls: type, backend: Any, tag: str) -> Callable[..., Any]:
    """``torch.compile`` of a fresh caller, ``fullgraph=True``."""
    return torch.compile(fresh_caller(fn_cls, tag), fullgraph=True, backend=backend)


class _PlainCtx:
    """Just enough of a ctx to run a Function's forward and backward by hand."""

    def __init__(self, num_inputs: int) -> None:
        self.saved_tensors: tuple[Any, ...] = ()
        self.needs_input_grad = (True,) * num_inputs

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *args: Any) -> None:
        pass

    def mark_dirty(self, *args: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def ops_only(fn_cls: Any, args: tuple[Any, ...]) -> Callable[[], None]:
    """The floor: the user's forward then backward called directly under ``no_grad`` (the same
    tensor ops, no autograd graph, no Function machinery)."""
    plain = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    with torch.no_grad():
        out = fn_cls.forward(_PlainCtx(len(args)), *plain)
        outs = out if isinstance(out, tuple) else (out,)
        grads = tuple(torch.ones_like(o) for o in outs)

    def step() -> None:
        with torch.no_grad():
            ctx = _PlainCtx(len(plain))
            fn_cls.forward(ctx, *plain)
            fn_cls.backward(ctx, *grads)

    return step
