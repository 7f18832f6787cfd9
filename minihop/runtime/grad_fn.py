"""What the caller sees of a capture's ``grad_fn``: the user's ctx attributes, as in eager.

Place in the pipeline: runtime, applied by ``function.make_function`` to each capture's
``autograd.Function``. Eager's ``y.grad_fn`` *is* the user's ctx: the caller can read what
forward left there (``y.grad_fn.scale``) and set it before ``.backward()``, which the user's
backward then reads. minihop's ``grad_fn`` is its own Function's ctx, and its bwd was traced
with forward's values.

Invariant: a read gives eager's value or a coded error, never an ``AttributeError`` eager
would not raise; a write that could change what backward reads is refused when backward runs
(MH106), never silently ignored. Reads cost nothing on the hot path (``__getattr__`` runs only
for names the object lacks); the write check runs once per backward, only for a Function whose
forward left attributes on ctx.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import SideEffectError, UnsupportedOperationError
from ..spec import CTX_HELD, MISSING, PythonState
from .guards import value_key

__all__ = ["mirror_ctx"]

_RUN_EAGERLY = ("Pass the value as an argument of the Function instead, or call the Function "
                "itself (F.apply) where the caller reaches into y.grad_fn.")


def mirror_ctx(function: type[torch.autograd.Function], state: PythonState, name: str) -> None:
    """Give ``function``'s ctx class the user's ctx attributes forward left (``state.ctx_forward``)
    for the caller to read, and its backward a first check that the caller set none of them to
    another value."""
    left = dict(state.ctx_forward)
    if not left:
        return
    backward = function.backward
    ctx_class = function._backward_cls  # type: ignore[attr-defined]

    def __getattr__(ctx: Any, attr: str) -> Any:
        if left.get(attr, MISSING) is MISSING:
            raise AttributeError(f"'{type(ctx).__name__}' object has no attribute '{attr}'")
        after = ctx.__dict__.get("minihop_ctx")  # what an earlier backward of the call left
        if after is not None and attr in after:
            return after[attr]
        if left[attr] is CTX_HELD:
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
        if not names.isdisjoint(ctx.__dict__):
            _refuse_caller_writes(ctx, left, name)
        return backward(ctx, *grads)

    function.backward = staticmethod(checked_backward)  # type: ignore[method-assign]


def _refuse_caller_writes(ctx: Any, left: dict[str, Any], name: str) -> None:
    for attr, value in ctx.__dict__.items():
        if attr in left and (left[attr] is CTX_HELD or left[attr] is MISSING or value_key(value) != value_key(left[attr])):
            forward_left = "its backward looks it up, and forward set none" if left[attr] is MISSING \
                else f"forward left {left[attr]!r}"
            raise SideEffectError(
                f"The caller set y.grad_fn.{attr} of {name} to {value!r} before .backward() "
                f"({forward_left}).",
                "Eager's grad_fn is the user's ctx, so its backward reads the value set there; "
                "minihop's backward was traced with the value forward left, and its grad_fn is "
                "its own Function's ctx.",
                _RUN_EAGERLY)
