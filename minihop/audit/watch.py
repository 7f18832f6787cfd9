"""The audit's watcher: every ``torch.autograd.Function.apply`` a test suite makes, kept as copies.

The first half of ``pytest --minihop-audit`` (``minihop.audit``): while the suite runs,
``Function.apply`` is replaced by a wrapper that counts each call per Function class and,
for the first few distinct argument signatures (``N`` where an input requires grad, one where none
does; each budget looked for until 200 calls in a row bring it none), keeps a copy of the call's arguments (every
tensor cloned, detached, with its ``requires_grad``) and the grad mode it ran under. Nothing is
checked while the suite runs: ``check.py`` replays the copies after the last test.

Invariant: what the wrapper does is invisible to the suite. It runs no user code (no
``repr``, no ``__eq__``, no hashing of user objects), draws no random numbers, calls the
original ``apply`` exactly once with the caller's own arguments, and swallows its own failures.
A call it cannot copy faithfully (inside a functorch transform, under a dispatch or
torch-function mode, under autocast, with tensor subclasses or fake tensors, while Dynamo
compiles) is counted and its reason kept, never copied.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from typing import Any

import torch

from ..structure import iter_leaves
from ..testing import clone_args

__all__ = ["Call", "Seen", "Watcher"]

# Functions defined here are not the suite's: minihop's runtime runs its captures as
# autograd.Functions, and torch's own (checkpoint, parallel, ...) are torch's business.
_NOT_WATCHED = ("minihop", "torch")
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SCALARS = (int, float, bool, complex, str, bytes, type(None))
_PATIENCE = 200  # calls without a new signature after which a Function is only counted


@dataclasses.dataclass(frozen=True)
class Call:
    """One kept call: copies of its arguments, taken before ``apply`` ran, and its grad mode."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grad_enabled: bool
    signature: tuple[Any, ...]
    needs_grad: bool = True


@dataclasses.dataclass
class Seen:
    """What the suite did with one Function class."""

    fn_cls: type
    calls: int = 0
    kept: list[Call] = dataclasses.field(default_factory=list)
    signatures: set[tuple[Any, ...]] = dataclasses.field(default_factory=set)
    # per budget (True: calls needing a grad): calls since its last new signature; and whether
    # it is closed (spent, or no new signature for long): its calls are then only counted
    since_new: dict[bool, int] = dataclasses.field(default_factory=lambda: {True: 0, False: 0})
    closed: set[bool] = dataclasses.field(default_factory=set)
    # reason -> how many calls were not copied for it
    uncopied: Counter[str] = dataclasses.field(default_factory=Counter)


def signature(args: tuple[Any, ...], kwargs: dict[str, Any], grad_enabled: bool) -> tuple[Any, ...]:
    """What a capture depends on, read without running user code: each tensor's properties;
    a scalar's value; any other leaf's type (its value is the capture's guard's business)."""
    parts: list[Any] = [grad_enabled]
    for path, leaf in iter_leaves((args, kwargs)):
        if issubclass(type(leaf), torch.Tensor):
            parts.append((path, tuple(leaf.shape), leaf.stride() if leaf.layout == torch.strided else None,
                          leaf.dtype, leaf.device, leaf.requires_grad))
        elif type(leaf) in _SCALARS:
            parts.append((path, type(leaf), leaf))
        else:
            parts.append((path, type(leaf)))
    return tuple(parts)


def _requires_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a tensor argument requires grad: the top level first (cheap, the usual case)."""
    for a in args:
        if issubclass(type(a), torch.Tensor):
            if a.requires_grad:
                return True
        elif not issubclass(type(a), _SCALARS):
            break  # a container or object: walk everything
    else:
        if not kwargs:
            return False
    return any(issubclass(type(t), torch.Tensor) and t.requires_grad for _, t in iter_leaves((args, kwargs)))


def uncopyable(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why this call's arguments cannot be copied without the suite noticing, or None."""
    if torch._C._are_functorch_transforms_active():
        return "called inside a functorch transform (vmap, grad, ...)"
    if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
        return "called under a torch-function or dispatch mode (copying would show in the mode)"
    if torch.is_autocast_enabled() or torch.is_autocast_enabled("cpu"):
        return "called under autocast"
    if torch.is_inference_mode_enabled():
        return "called under inference_mode"
    for _, leaf in iter_leaves((args, kwargs)):
        if issubclass(type(leaf), torch.Tensor) and type(leaf) not in _PLAIN:
            return f"a {type(leaf).__name__} argument (tensor subclass)"
    return None


class Watcher:
    """Wraps ``Function.apply`` between ``install`` and ``uninstall``; ``seen`` is the result."""

    def __init__(self, signatures_per_function: int = 3) -> None:
        self.limit = signatures_per_function
        self.seen: dict[type, Seen] = {}
        self._lock = threading.Lock()
        self._original: Any = None

    def install(self) -> None:
        function = torch.autograd.function.Function
        self._original = function.__dict__["apply"]  # the classmethod object, to put back
        original_apply = self._original.__func__
        see = self.see

        def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # a failing test's traceback shows the user's call, as without us
            if not torch.compiler.is_compiling():
                see(cls, args, kwargs)
            return original_apply(cls, *args, **kwargs)

        apply.__doc__ = original_apply.__doc__
        apply.__qualname__ = original_apply.__qualname__  # Dynamo knows an aliased apply by name
        function.apply = classmethod(apply)  # type: ignore[assignment]

    def uninstall(self) -> None:
        if self._original is not None:
            torch.autograd.function.Function.apply = self._original  # type: ignore[method-assign]
            self._original = None

    def see(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Count the call; keep a copy of a new signature's arguments. Never raises."""
        try:
            module = getattr(cls, "__module__", "") or ""
            if module.split(".")[0] in _NOT_WATCHED:
                return
            with self._lock:
                seen = self.seen.get(cls)
                if seen is None:
                    seen = self.seen[cls] = Seen(cls)
                seen.calls += 1
                if len(seen.closed) == 2:
                    return
                grad_enabled = torch.is_grad_enabled()
                # The checks that matter most need a grad: the budget is N calls where an input
                # requires grad, plus one where none does (outputs only). Each budget closes when
                # spent, or when _PATIENCE calls in a row brought it no new signature: looking
                # walks the arguments, a closed budget costs a call only the check above.
                needs_grad = grad_enabled and _requires_grad(args, kwargs)
                if needs_grad in seen.closed:
                    return
                why = uncopyable(args, kwargs)
                if why is not None:
                    seen.uncopied[why] += 1
                    return
                sig = signature(args, kwargs, grad_enabled)
                if sig in seen.signatures:
                    seen.since_new[needs_grad] += 1
                    if seen.since_new[needs_grad] > _PATIENCE:
                        seen.closed.add(needs_grad)
                    return
                seen.since_new[needs_grad] = 0
                copies = clone_args((args, kwargs))
                seen.signatures.add(sig)
                seen.kept.append(Call(tuple(copies[0]), dict(copies[1]), grad_enabled, sig, needs_grad))
                if sum(c.needs_grad == needs_grad for c in seen.kept) >= (self.limit if needs_grad else 1):
                    seen.closed.add(needs_grad)
        except Exception as e:  # the suite must never see the audit fail
            try:
                self.seen[cls].uncopied[f"the arguments could not be copied ({type(e).__name__}: {e})"[:200]] += 1
            except Exception:
                pass
