"""The public entry points: ``capture``, ``apply`` and their cache.

Place in the pipeline: the top. Each entry is a few lines: trace forward and backward
(tracer), make the pair consistent (rewire), build the runnable capture (runtime).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .rewire.outer import make_outer_graph
from .rewire.pair import make_pair
from .runtime.capture import Capture, make_capture
from .runtime.guards import call_key
from .tracer.trace import function_parts, trace_function

__all__ = ["capture", "apply", "clear_cache"]

_cache: dict[tuple[Any, ...], Capture] = {}
_cache_lock = threading.Lock()


def _bind(fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    if not kwargs:
        return args
    from .tracer.trace import _bind as bind_args

    return bind_args(function_parts(fn_cls), fn_cls, args, kwargs)


def capture(fn_cls: type, *args: Any, **kwargs: Any) -> Capture:
    """Capture ``fn_cls`` (an ``autograd.Function``) for arguments like ``args``.

    Tensors in ``args`` are only read for their properties (shape, dtype, device,
    requires_grad): tracing runs on fake tensors. The result runs with ``cap(*args)``.
    """
    start = time.perf_counter()
    args = _bind(fn_cls, args, kwargs)
    raw = trace_function(fn_cls, args, {})
    pair = make_pair(raw)
    outer = make_outer_graph(pair)
    return make_capture(pair, outer, fn_cls, call_key(args), time.perf_counter() - start)


def apply(fn_cls: type, *args: Any, **kwargs: Any) -> Any:
    """Drop-in for ``fn_cls.apply(*args, **kwargs)``: captures once per distinct call key."""
    args = _bind(fn_cls, args, kwargs)
    key = (fn_cls, call_key(args))
    cap = _cache.get(key)
    if cap is None:
        with _cache_lock:
            cap = _cache.get(key)
            if cap is None:
                cap = capture(fn_cls, *args)
                _cache[key] = cap
    return cap.run(args)


def clear_cache() -> None:
    """Forget every capture made by ``apply``."""
    with _cache_lock:
        _cache.clear()
