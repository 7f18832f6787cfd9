"""What a finished trace keeps of its call's argument objects: weak references.

Place in the pipeline: tracer. ``trace.py`` calls ``keep_weakly`` once a capture's trace is done,
on the fake arguments it keeps for tracing backward again (``backward.rerun_backward``,
``eager_backward.EagerBackward``) and on ctx (the attributes forward set, and their copy
``effects.ctx_as_forward_left_it`` puts back); ``rerun_backward`` asks ``live_arguments`` each time.

Eager keeps a call's argument objects (a config object, an ``nn.Module``, a user's sentinel) no
longer than the caller and the call's graph do: when the caller lets go, they die, running
their ``__del__`` and emptying weak references to them. A capture lives as long as its cache: had
it kept the objects of the call it was traced for, they would never die (and a module's
tensors never be freed). Unknown is unsafe: a backward traced again for a later call uses that
call's objects where the runtime has them (equal to the kept ones by the capture's key), the
kept ones while they live, and is refused (MH104) where neither is there.

Invariant: after ``keep_weakly``, no non-tensor argument object that takes weak references is
held by the capture's kept arguments or ctx; each is one ``WeakArgument``, the same object in
both (identity maps a ctx value to its argument).
"""

from __future__ import annotations

import types
import weakref
from typing import Any

import torch

from ..errors import UnsupportedOperationError
from .atoms import ATOMS

__all__ = ["WeakArgument", "keep_weakly", "live_arguments"]


class WeakArgument:
    """A kept argument object, held weakly."""

    __slots__ = ("ref", "position")

    def __init__(self, obj: Any, position: int) -> None:
        self.ref, self.position = weakref.ref(obj), position


def keep_weakly(fake_args: tuple[Any, ...], callers: tuple[bool, ...], ctx: Any, ctx_copies: Any = None) -> tuple[Any, ...]:
    """``fake_args`` with each of the caller's argument objects (``callers[i]``: the call's own
    object, not minihop's copy holding fake tensors; not a tensor, a constant, a class, a
    function or a module) a ``WeakArgument``, and the same on ``ctx`` and in ``ctx_copies`` (an
    ``effects.ctx_as_forward_left_it``'s saved attributes) where they hold it."""
    weak: dict[int, WeakArgument] = {}
    kept = []
    for i, a in enumerate(fake_args):
        if i >= len(callers) or not callers[i] or type(a).__weakrefoffset__ == 0 \
                or issubclass(type(a), (torch.Tensor, *ATOMS, type, types.FunctionType, types.ModuleType)):
            kept.append(a)
            continue
        kept.append(weak.setdefault(id(a), WeakArgument(a, i)))
    if weak:
        for name, value in list(vars(ctx).items()):
            if id(value) in weak:
                object.__setattr__(ctx, name, weak[id(value)])
        if ctx_copies is not None:
            ctx_copies.saved = [(k, weak.get(id(v), v), c) for k, v, c in ctx_copies.saved]
    return tuple(kept)


def live_arguments(kept: tuple[Any, ...], call_args: tuple[Any, ...], name: str) -> tuple[Any, ...]:
    """The argument objects a backward traced again uses: the call's (``call_args``, where the
    runtime has them), else the kept ones, alive; refused (MH104) where one died."""
    live = []
    for i, a in enumerate(kept):
        if type(a) is not WeakArgument:
            live.append(a)
        elif i < len(call_args):
            live.append(call_args[i])
        elif (obj := a.ref()) is not None:
            live.append(obj)
        else:
            raise UnsupportedOperationError(
                f"{name}.backward is traced again for a call, and the argument object at position {i} of "
                "the call the capture was made for is gone (the caller let go of it).",
                "minihop keeps a call's argument objects weakly, as eager does not keep them past the "
                "call's graph; tracing backward again needs one, and this capture's calls do not keep theirs.",
                f"Run it eagerly with minihop.function({name}, fallback='eager'), or keep the object alive.")
    return tuple(live)
