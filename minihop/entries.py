"""The ways a user calls a Function through minihop's cache: ``apply``, ``function``, ``@captured``.

Place in the pipeline: above it, over ``cache.CapturedFunction`` (one per user Function and
policy): ``apply`` uses the Function's default one (kept on the class), ``function`` makes one
with its own cache and policy (on a CUDA stream if asked), ``@captured`` routes ``F.apply``
itself through one; ``counters``, ``reset`` and ``clear_cache`` read and clear them all.

Invariant: every entry point goes through a ``CapturedFunction``'s one implementation; under
``torch.compile`` each runs ``F.apply`` itself (the compiler traces the user's Function).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from .cache import ALIVE, TOTALS, CacheStats, CapturedFunction, DynamicSpec, Fallback
from .pipeline import function_parts, run_on_stream

__all__ = ["apply", "captured", "clear_cache", "counters", "function", "reset"]

_is_compiling = torch.compiler.is_compiling
_NOTHING: dict[str, Any] = {}


_default: weakref.WeakSet[CapturedFunction] = weakref.WeakSet()  # those made by apply
_default_lock = threading.Lock()


def _default_for(fn_cls: type) -> CapturedFunction:
    # Kept on the class itself (not in a registry keyed by it): the two then form a cycle the
    # garbage collector frees when the user drops the class, captures included.
    if not issubclass(type(fn_cls), type):
        function_parts(fn_cls)  # raises minihop's error for a non-Function
    found = fn_cls.__dict__.get("_minihop_default")
    if found is None:
        with _default_lock:
            found = fn_cls.__dict__.get("_minihop_default")
            if found is None:
                found = CapturedFunction(fn_cls)
                type.__setattr__(fn_cls, "_minihop_default", found)
                _default.add(found)
    return found


def apply(fn_cls: type, *args: Any, **kwargs: Any) -> Any:
    """Drop-in for ``fn_cls.apply(*args, **kwargs)``: strict (unsupported Functions raise),
    captured once per distinct guard key.

    >>> import torch, minihop
    >>> from minihop.demo import MySin
    >>> x = torch.randn(4, requires_grad=True)
    >>> torch.allclose(minihop.apply(MySin, x), MySin.apply(x))   # captured, then cached
    True
    """
    if _is_compiling():
        return fn_cls.apply(*args, **kwargs)  # see CapturedFunction.apply
    found = getattr(fn_cls, "__dict__", _NOTHING).get("_minihop_default")
    return (found or _default_for(fn_cls))._apply(args, kwargs)


class _OnStream(CapturedFunction):
    """A ``CapturedFunction`` whose calls run on a given CUDA stream (``runtime.streams``)."""

    def __init__(self, fn_cls: type, stream: Any, **options: Any) -> None:
        super().__init__(fn_cls, **options)
        self.stream = stream

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        return run_on_stream(lambda: CapturedFunction.apply(self, *args, **kwargs),
                             (*args, *kwargs.values()), self.stream)

    __call__ = apply


def function(fn_cls: type, *, fallback: Fallback = "raise", dynamic: DynamicSpec | None = None,
             cache_limit: int = 8, stream: Any = None) -> CapturedFunction:
    """A ``CapturedFunction`` for ``fn_cls`` with its own cache and policy.

    ``stream``: a ``torch.cuda.Stream`` to run every call's forward (and so its backward) on,
    with the synchronisation that keeps inputs, outputs and saved tensors valid across it and
    the caller's stream (as docs/integration.md describes). By default calls run on the
    caller's current stream, as eager's would.

    >>> import torch, minihop
    >>> from minihop.demo import MySin
    >>> sin = minihop.function(MySin, fallback="eager", dynamic=True)
    >>> _ = sin(torch.randn(4, requires_grad=True)), sin(torch.randn(6, requires_grad=True))
    >>> sin.stats                 # one capture serves both sizes
    CacheStats(hits=1, captures=1, eager_calls=0, evictions=0)
    """
    options = dict(fallback=fallback, dynamic=dynamic, cache_limit=cache_limit)
    if stream is not None:
        return _OnStream(fn_cls, stream, **options)
    return CapturedFunction(fn_cls, **options)


def captured(fn_cls: type | None = None, *, fallback: Fallback = "raise", dynamic: DynamicSpec | None = None,
             cache_limit: int = 8) -> Any:
    """Class decorator: ``F.apply`` itself goes through minihop (``@captured`` or
    ``@captured(fallback="eager")``).

    >>> import torch, minihop
    >>> @minihop.captured
    ... class Double(torch.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         return x * 2
    ...     @staticmethod
    ...     def backward(ctx, g):
    ...         return g * 2
    >>> Double.apply(torch.ones(2, requires_grad=True))
    tensor([2., 2.], grad_fn=<...>)
    """

    def decorate(cls: type) -> type:
        if not (issubclass(type(cls), type) and issubclass(cls, torch.autograd.Function)):
            raise TypeError(f"@minihop.captured decorates autograd.Function subclasses, not {cls!r}")
        # The class as written, for torch.compile: same methods, torch's own apply. Made from
        # torch's Function with the user's classes' namespaces, not as a subclass of ``cls``: a
        # subclass would run a base's ``__init_subclass__`` (a registry of Functions would
        # list a class the user never wrote).
        space = {k: v for klass in reversed(cls.__mro__) if not _torch_class(klass)
                 for k, v in vars(klass).items() if k not in ("__dict__", "__weakref__")}
        twin = type(cls.__name__, (torch.autograd.Function,), {
            **space, "apply": torch.autograd.Function.__dict__["apply"], "__module__": cls.__module__,
            "__qualname__": cls.__qualname__})
        cf = CapturedFunction(cls, fallback=fallback, dynamic=dynamic, cache_limit=cache_limit,
                              eager_apply=cls.apply, compile_cls=twin)
        cls.apply = staticmethod(cf.apply)  # type: ignore[method-assign]
        cls.minihop = cf  # type: ignore[attr-defined]
        return cls

    return decorate(fn_cls) if fn_cls is not None else decorate


def _torch_class(klass: type) -> bool:
    """``torch.autograd.Function`` and the classes it is made of (``object`` too)."""
    return klass in torch.autograd.Function.__mro__


def counters() -> dict[str, int]:
    """Process-wide totals: ``captures``, ``cache_hits``, ``fallbacks`` (eager runs) and
    ``internal_errors`` (tracing that failed inside minihop's own code: its bugs, run eagerly)."""
    return dict(TOTALS)


def reset() -> None:
    """Clear every minihop cache and zero the counters."""
    clear_cache()
    for cf in list(ALIVE):
        cf.clear()
        cf.stats = CacheStats()
    for name in TOTALS:
        TOTALS[name] = 0


def clear_cache() -> None:
    """Forget every capture made by ``minihop.apply``."""
    with _default_lock:
        for cf in list(_default):
            cf.clear()
