"""Run a consistent pair as one differentiable op: an ``autograd.Function`` per capture.

Place in the pipeline: runtime (never imports the tracer). ``make_function`` builds, once per
capture, a ``torch.autograd.Function`` subclass whose forward calls the fwd GraphModule's
generated code and whose backward calls the bwd's. What eager autograd would do with the user's
ctx calls is done here with the real ctx: saved values go through ``ctx.save_for_backward``
(so version-counter checks and ``saved_tensors_hooks`` apply), ``mark_non_differentiable`` and
``mark_dirty`` use the capture's index lists.

Only top-level outputs (eager's outputs of the Function) are returned to autograd; tensors
nested inside returned objects travel through ``sink`` and never require grad, as in eager.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedOperationError
from ..rewire.pair import Pair

__all__ = ["make_function"]

_set_grad = torch._C._set_grad_enabled
_is_grad = torch.is_grad_enabled


def make_function(pair: Pair) -> type[torch.autograd.Function]:
    """The ``autograd.Function`` subclass that runs ``pair``. Apply as ``F.apply(sink, *inputs)``."""
    fwd_code = pair.fwd.forward
    bwd_code = pair.bwd.forward
    num_outputs = len(pair.top_level)
    top_idx = tuple(i for i, top in enumerate(pair.top_level) if top)
    nested_idx = tuple(i for i, top in enumerate(pair.top_level) if not top)
    position = {i: p for p, i in enumerate(top_idx)}
    nondiff_pos = tuple(position[i] for i in pair.non_differentiable_idx)
    dirty_pos = tuple(position[i] for i in pair.dirty_idx)
    via_ctx = tuple(pair.saved_for_backward_idx)
    stashed = tuple(i for i in range(pair.num_saved) if i not in set(via_ctx))
    num_saved = pair.num_saved
    materialize = pair.materialize_grads
    single_top = len(top_idx) == num_outputs

    def forward(ctx: Any, sink: list[Any], *inputs: Any) -> Any:
        grad_mode = _is_grad()
        try:
            outs, saved = fwd_code(*inputs)
        finally:
            _set_grad(grad_mode)  # the graph's own toggle restores True; keep autograd's mode
        if via_ctx:
            ctx.save_for_backward(*[saved[i] for i in via_ctx])
        if stashed:
            # Values eager keeps as plain ctx attributes: no version-counter check, as in eager.
            ctx.minihop_stash = [saved[i] for i in stashed]
        if single_top:
            result = tuple(outs)
        else:
            result = tuple(outs[i] for i in top_idx)
            sink.extend(outs[i] for i in nested_idx)
        if nondiff_pos:
            ctx.mark_non_differentiable(*[result[p] for p in nondiff_pos])
        if dirty_pos:
            ctx.mark_dirty(*[result[p] for p in dirty_pos])
        return result

    def backward(ctx: Any, *top_grads: Any) -> Any:
        if not materialize and any(g is None for g in top_grads):
            raise UnsupportedOperationError(
                f"{pair.function_name}.backward would receive None for an output's gradient "
                "(ctx.set_materialize_grads(False)).",
                "This capture's backward was traced with a tensor gradient for every output; "
                "running it on None could differ from eager.",
                "Use outputs' gradients in the loss, or keep grads materialized.")
        if single_top:
            grads = top_grads
        else:
            grads_list: list[Any] = [None] * num_outputs
            for p, i in enumerate(top_idx):
                grads_list[i] = top_grads[p]
            grads = tuple(grads_list)
        if stashed:
            saved: list[Any] = [None] * num_saved
            for i, value in zip(via_ctx, ctx.saved_tensors, strict=True):
                saved[i] = value
            for i, value in zip(stashed, ctx.minihop_stash, strict=True):
                saved[i] = value
        else:
            saved = list(ctx.saved_tensors) if via_ctx else []
        grad_mode = _is_grad()
        try:
            result = bwd_code(*grads, *saved)
        finally:
            _set_grad(grad_mode)
        return (None, *result)

    def setup(ctx: Any) -> None:
        ctx.set_materialize_grads(materialize)

    def forward_with_setup(ctx: Any, sink: list[Any], *inputs: Any) -> Any:
        setup(ctx)
        return forward(ctx, sink, *inputs)

    namespace = {
        "forward": staticmethod(forward if materialize else forward_with_setup),
        "backward": staticmethod(backward),
        "__qualname__": f"Captured[{pair.function_name}]",
        "__module__": __name__,
    }
    return type(f"Captured_{pair.function_name.replace('.', '_')}", (torch.autograd.Function,), namespace)
