"""``autograd_function_apply``: run any consistent (fwd, bwd) pair as a differentiable op.

Place in the pipeline: runtime, standalone. Unlike ``function.make_function`` (built from a
minihop ``Pair`` with all its metadata), this op takes nothing but the two GraphModules and the
index lists that PyTorch's own higher-order op takes, so it also runs pairs produced by another
system (torch 2.13 Dynamo's ``fwd_body_N``/``bwd_body_N``) — the two systems can be cross-run.

Contract (``rewire.contract``): ``fwd(*args) -> ((outs...), (saved...))``;
``bwd(*grads, *saved) -> one gradient (or None) per arg``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["autograd_function_apply"]

_set_grad = torch._C._set_grad_enabled
_is_grad = torch.is_grad_enabled

# One Function class per (fwd, bwd, index lists), reused by later calls; bounded, since the
# classes hold their graphs alive.
_classes: OrderedDict[tuple[Any, ...], type[torch.autograd.Function]] = OrderedDict()
_MAX_CLASSES = 64


def _make(fwd: Callable[..., Any], bwd: Callable[..., Any], non_differentiable_idx: tuple[int, ...],
          saved_for_backward_idx: tuple[int, ...] | None, dirty_idx: tuple[int, ...]) -> type[torch.autograd.Function]:
    def forward(ctx: Any, *args: Any) -> Any:
        grad_mode = _is_grad()
        try:
            outs, saved = fwd(*args)
        finally:
            _set_grad(grad_mode)
        outs = tuple(outs)
        via_ctx = [i for i, v in enumerate(saved) if issubclass(type(v), torch.Tensor)
                   and (saved_for_backward_idx is None or i in saved_for_backward_idx)]
        ctx.save_for_backward(*[saved[i] for i in via_ctx])
        # Non-tensors (sizes) and tensors not from save_for_backward: plain ctx attributes.
        ctx.minihop_layout = (len(saved), via_ctx, [(i, v) for i, v in enumerate(saved) if i not in via_ctx])
        if non_differentiable_idx:
            ctx.mark_non_differentiable(*[outs[i] for i in non_differentiable_idx])
        if dirty_idx:
            ctx.mark_dirty(*[outs[i] for i in dirty_idx])
        return outs

    def backward(ctx: Any, *grads: Any) -> Any:
        n, via_ctx, others = ctx.minihop_layout
        saved: list[Any] = [None] * n
        for i, value in zip(via_ctx, ctx.saved_tensors, strict=True):
            saved[i] = value
        for i, value in others:
            saved[i] = value
        grad_mode = _is_grad()
        try:
            result = bwd(*grads, *saved)
        finally:
            _set_grad(grad_mode)
        return tuple(result) if issubclass(type(result), (tuple, list)) else (result,)

    return type("AutogradFunctionApply", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def autograd_function_apply(fwd: Callable[..., Any], bwd: Callable[..., Any], *args: Any,
                            non_differentiable_idx: Sequence[int] = (),
                            saved_for_backward_idx: Sequence[int] | None = None,
                            dirty_idx: Sequence[int] = ()) -> tuple[Any, ...]:
    """Run ``fwd`` under autograd with ``bwd`` as its backward; returns fwd's outputs.

    ``saved_for_backward_idx`` lists the saved values that go through
    ``ctx.save_for_backward`` (version-checked); None means every saved tensor does.
    """
    key = (fwd, bwd, tuple(non_differentiable_idx),
           None if saved_for_backward_idx is None else tuple(saved_for_backward_idx), tuple(dirty_idx))
    fn_cls = _classes.get(key)
    if fn_cls is None:
        fn_cls = _make(fwd, bwd, key[2], key[3], key[4])
        _classes[key] = fn_cls
        if len(_classes) > _MAX_CLASSES:
            _classes.popitem(last=False)
    out = fn_cls.apply(*args)
    return out if issubclass(type(out), tuple) else (out,)
