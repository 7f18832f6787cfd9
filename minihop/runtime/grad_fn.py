"""What the caller sees of a capture's ``grad_fn``: the user's ctx attributes, as in eager.

Place in the pipeline: runtime, applied by ``function.make_function`` to each capture's
``autograd.Function``. Eager's ``y.grad_fn`` *is* the user's ctx: the caller can read what
forward left there (``y.grad_fn.scale``) and set it before ``.backward()``, which the user's
backward then reads. minihop's ``grad_fn`` is its own Function's ctx, and its bwd was traced
with forward's values.

Invariant: a read gives eager's value or a coded error, never an ``AttributeError`` eager
would not raise; a write that could change what backward reads is refused when backward runs
(MH106), never silently ignored. Under ``fallback="eager"`` neither is refused: the caller
reads and sets the user's ctx rebuilt for the call, and that call's backward runs the user's
backward on it (``eager_runs``). Reads cost nothing on the hot path (``__getattr__`` runs only
for names the object lacks); the write check runs once per backward, only for a Function whose
forward left attributes on ctx.
"""

from __future__ import annotations

import typing
from typing import Any

import torch

from ..errors import SideEffectError, UnsupportedOperationError
from ..spec import CTX_HELD, MISSING, PythonState
from .eager_runs import EagerRunner, saved_from_ctx
from .guards import value_key

__all__ = ["mirror_ctx"]

_RUN_EAGERLY = ("Pass the value as an argument of the Function instead, or call the Function "
                "itself (F.apply) where the caller reaches into y.grad_fn.")


def mirror_ctx(function: type[torch.autograd.Function], state: PythonState, name: str,
               eager: EagerRunner | None = None, layout: Any = None) -> None:
    """Give ``function``'s ctx class the user's ctx attributes forward left (``state.ctx_forward``)
    for the caller to read, and its backward a first check that the caller set none of them to
    another value. ``eager`` (``fallback="eager"``, with the capture's ``bodies.Layout``): where
    the caller read a tensor or container there, or set a value, that call's backward runs the
    user's backward eagerly on the ctx the caller touched, as eager's does, instead of refusing."""
    left = dict(state.ctx_forward)
    if not left and eager is None:
        return  # (under fallback, a backward run eagerly keeps its ctx for the call's next one)
    backward = function.backward
    ctx_class = function._backward_cls  # type: ignore[attr-defined]

    def rebuilt(ctx: Any, reason: str) -> Any:
        """The user's ctx for this call, rebuilt once (``eager_runs``) and kept on minihop's."""
        found = ctx.__dict__.get("minihop_rebuilt")
        if found is None:
            runner = typing.cast(EagerRunner, eager)
            call_args = ctx.minihop_args if layout.keeps_args else ()
            found = ctx.minihop_rebuilt = runner.ctx(call_args, saved_from_ctx(layout, ctx), reason)
            for attr, value in (ctx.__dict__.get("minihop_ctx") or {}).items():
                setattr(found, attr, value)  # what an earlier backward of the call left
        return found

    def __getattr__(ctx: Any, attr: str) -> Any:
        if left.get(attr, MISSING) is MISSING:
            raise AttributeError(f"'{type(ctx).__name__}' object has no attribute '{attr}'")
        if "minihop_rebuilt" in ctx.__dict__:  # the user's ctx itself, once rebuilt for the call
            return getattr(ctx.__dict__["minihop_rebuilt"], attr)
        after = ctx.__dict__.get("minihop_ctx")  # what an earlier backward of the call left
        if after is not None and attr in after:
            return after[attr]
        if left[attr] is CTX_HELD:
            if eager is not None:
                return getattr(rebuilt(ctx, f"the caller read y.grad_fn.{attr}"), attr)
            raise UnsupportedOperationError(
                f"The caller read y.grad_fn.{attr} of {name}: forward left a tensor, an object, a "
                "container or a number of dynamic sizes there.",
                "Eager's grad_fn is the user's ctx; minihop's is its own Function's, which holds "
                "the captured graphs' values, not the user's ctx attributes.",
                _RUN_EAGERLY)
        return left[attr]

    ctx_class.__getattr__ = __getattr__
    names = frozenset(left)

    def checked_backward(ctx: Any, *grads: Any) -> Any:
        held = ctx.__dict__
        if names.isdisjoint(held) and "minihop_rebuilt" not in held:
            return backward(ctx, *grads)
        now = {**left, **(held.get("minihop_ctx") or {})}  # as forward, or an earlier backward, left them
        changed = [attr for attr, value in held.items() if attr in left and _differs(now[attr], value)]
        if not changed and "minihop_rebuilt" not in held:
            # Set to forward's own values: the captured backward stands; they are dropped so
            # that reads after it see what it left (``minihop_ctx``), as eager's ctx shows.
            for attr in names.intersection(held):
                del held[attr]
            return backward(ctx, *grads)
        if eager is None:
            _refuse_caller_writes(ctx, left, name)  # (raises: a value differs)
            return backward(ctx, *grads)
        real_ctx = rebuilt(ctx, f"the caller set y.grad_fn.{changed[0]}" if changed else "")
        for attr in names.intersection(held):
            setattr(real_ctx, attr, held[attr])
        per_output: list[Any] = [None] * layout.num_outputs
        for p, i in enumerate(layout.top_idx):
            per_output[i] = grads[p]
        found = eager.run(real_ctx, per_output)
        for attr in names.intersection(held):  # what backward left there, as the caller reads it
            held[attr] = getattr(real_ctx, attr)
        return found if not layout.nested_idx else (None, *found)  # (no gradient for the sink)

    function.backward = staticmethod(checked_backward)  # type: ignore[method-assign]


def _differs(left: Any, value: Any) -> bool:
    """Whether a value the caller set differs from what forward left (``left``)."""
    return left is CTX_HELD or left is MISSING or value_key(value) != value_key(left)


def _refuse_caller_writes(ctx: Any, left: dict[str, Any], name: str) -> None:
    left = {**left, **(ctx.__dict__.get("minihop_ctx") or {})}
    for attr, value in ctx.__dict__.items():
        if attr in left and _differs(left[attr], value):
            forward_left = "its backward looks it up, and forward set none" if left[attr] is MISSING \
                else f"forward left {left[attr]!r}"
            raise SideEffectError(
                f"The caller set y.grad_fn.{attr} of {name} to {value!r} before .backward() "
                f"({forward_left}).",
                "Eager's grad_fn is the user's ctx, so its backward reads the value set there; "
                "minihop's backward was traced with the value forward left, and its grad_fn is "
                "its own Function's ctx.",
                _RUN_EAGERLY)
