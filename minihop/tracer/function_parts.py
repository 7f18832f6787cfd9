"""The user's Function resolved into the callables autograd would call, and their names.

Place in the pipeline: tracer, first step of a trace (``trace.trace_function``) and asked by
the pipeline for a Function's names. ``function_parts`` reads forward, ``setup_context``,
backward (or ``vjp``) and the argument and grad names the way ``Function.apply`` does, and
unwraps ``@once_differentiable`` (the runtime re-applies its semantics).

Invariant: the parts are remembered per class only while its methods stay the same objects,
so rebinding ``F.backward`` between calls is seen.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import weakref
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction, once_differentiable

from ..errors import UnsupportedArgumentError
from ..arguments import uses_setup_context

__all__ = ["FunctionParts", "function_parts", "refuse_own_apply"]


@dataclasses.dataclass(frozen=True)
class FunctionParts:
    """The user's Function, resolved: the callables autograd would call, and their names."""

    name: str
    forward: Any
    setup_context: Any | None
    backward: Any
    argnames: tuple[str, ...]
    gradnames: tuple[str, ...] | None
    once_differentiable: bool


_ONCE_DIFFERENTIABLE_CODE = once_differentiable(lambda ctx: None).__code__


_parts_memo: "weakref.WeakKeyDictionary[type, tuple[tuple[Any, ...], FunctionParts]]" = \
    weakref.WeakKeyDictionary()


def function_parts(fn_cls: type) -> FunctionParts:
    """Resolve forward/setup_context/backward (or vjp) the way ``Function.apply`` does.

    Remembered per class while its methods stay the same objects (signatures are slow to read).
    """
    if issubclass(type(fn_cls), type) and issubclass(fn_cls, torch.autograd.Function):
        methods = (fn_cls.forward, fn_cls.backward, fn_cls.vjp, fn_cls.setup_context)
        found = _parts_memo.get(fn_cls)
        if found is not None and all(a is b for a, b in zip(found[0], methods, strict=True)):
            return found[1]
        parts = _function_parts(fn_cls)
        _parts_memo[fn_cls] = (methods, parts)
        return parts
    return _function_parts(fn_cls)


def _both_implemented(fn_cls: type) -> Any:
    def backward(ctx: Any, *grads: Any) -> Any:
        # (eager's own check, ``BackwardCFunction._get_user_fn``, raises its error from torch's code)
        return BackwardCFunction._get_user_fn(types.SimpleNamespace(_forward_cls=fn_cls))(ctx, *grads)
    return backward


def _function_parts(fn_cls: type) -> FunctionParts:
    if not (issubclass(type(fn_cls), type) and issubclass(fn_cls, torch.autograd.Function)):
        raise UnsupportedArgumentError(
            f"minihop.capture got {fn_cls!r}, which is not a torch.autograd.Function subclass.",
            "minihop captures the forward and backward of an autograd.Function.",
            "Pass the class itself (MyFunction), not an instance or MyFunction.apply.",
        )
    setup = fn_cls.setup_context
    uses_setup = uses_setup_context(fn_cls)
    # As autograd picks it when backward runs (``BackwardCFunction._get_user_fn``): vjp where the
    # class has its own, else backward; both its own (``vjp = backward`` too), eager's backward raises.
    backward, vjp = fn_cls.backward, fn_cls.vjp
    if backward is not torch.autograd.Function.backward and vjp is not torch.autograd.Function.vjp:
        backward = _both_implemented(fn_cls)
    elif vjp is not torch.autograd.Function.vjp:
        backward = vjp
    params = list(inspect.signature(fn_cls.forward).parameters.values())
    if not uses_setup:
        params = params[1:]  # ctx
    argnames = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    once = getattr(backward, "__code__", None) is _ONCE_DIFFERENTIABLE_CODE
    if once:
        # Trace the user's function itself; the runtime re-applies the decorator's semantics.
        backward = backward.__wrapped__
    bparams = list(inspect.signature(backward).parameters.values())[1:]
    gradnames = None if any(p.kind == p.VAR_POSITIONAL for p in bparams) else tuple(p.name for p in bparams)
    return FunctionParts(fn_cls.__qualname__, fn_cls.forward, setup if uses_setup else None,
                         backward, argnames, gradnames, once)


def refuse_own_apply(fn_cls: type, name: str) -> None:
    """Refuse (MH101) a class whose callers run an ``apply`` of its own (an override of torch's
    classmethod that changes the arguments, fills in defaults or counts calls around
    ``super().apply``; under ``@minihop.captured``, the one the decorator replaced): a capture
    runs forward and backward as torch's ``Function.apply`` does, so that code would not run."""
    # (by the classes' own dicts: torch's Function.apply is minihop's watcher while another thread traces)
    held = next((vars(k)["apply"] for k in fn_cls.__mro__ if "apply" in vars(k)
                 and k not in torch.autograd.Function.__mro__), None)
    cf = getattr(getattr(held, "__func__", None), "__self__", None)
    if cf is not None and hasattr(cf, "_inline_apply"):  # (@captured's: what it replaced)
        replaced = cf._inline_apply
        held = None if getattr(replaced, "__func__", None) is torch.autograd.Function.__dict__["apply"].__func__ \
            or getattr(replaced, "__qualname__", "").startswith("watching_applies") else replaced
    if held is None:
        return
    func = getattr(held, "__func__", held)
    raise UnsupportedArgumentError(
        f"{name} has an apply of its own ({getattr(func, '__qualname__', repr(func))}).",
        "A capture runs forward and backward as torch's Function.apply does: what the class's own apply "
        "does around super().apply (its arguments changed or filled in, its calls counted) would not run.",
        "Move that code into forward or outside the Function, or run it eagerly with "
        "minihop.function(F, fallback='eager'), which calls the class's own apply.")
