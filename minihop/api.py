"""The public entry points: ``capture``, ``apply`` and their cache.

Place in the pipeline: the top. Each entry is a few lines: trace forward and backward
(tracer), make the pair consistent (rewire), build the runnable capture (runtime).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .errors import UnsupportedArgumentError, UnsupportedOperationError
from .rewire.outer import make_outer_graph
from .rewire.pair import Pair, make_pair
from .runtime.capture import Capture, live_key, make_capture
from .runtime.function import GradLayout, Retrace
from .runtime.guards import call_key
from .tracer.trace import GradSpec, TraceInputs, function_parts, trace_function

__all__ = ["capture", "apply", "clear_cache"]

_cache: dict[tuple[Any, ...], Capture] = {}
_cache_lock = threading.Lock()


def _bind(fn_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    if not kwargs:
        return args
    from .tracer.trace import _bind as bind_args

    return bind_args(function_parts(fn_cls), fn_cls, args, kwargs)


def capture(fn_cls: type, /, *args: Any, dynamic: bool | Mapping[int | str, Sequence[int]] = False,
            **kwargs: Any) -> Capture:
    """Capture ``fn_cls`` (an ``autograd.Function``) for arguments like ``args``.

    Tensors in ``args`` are only read for their properties (shape, dtype, device,
    requires_grad): tracing runs on fake tensors. The result runs with ``cap(*args)``.

    ``dynamic=True`` traces every dimension of every tensor argument with a symbolic size;
    ``dynamic={"x": [0]}`` (argument name or position -> dimensions) only those. One such
    capture serves every call whose sizes satisfy the guards recorded while tracing.
    """
    start = time.perf_counter()
    args = _bind(fn_cls, args, kwargs)
    dims = _dynamic_dims(fn_cls, args, dynamic)
    raw = trace_function(fn_cls, args, {}, dynamic=dims)
    pair = make_pair(raw)
    outer = make_outer_graph(pair)
    retrace = None
    if raw.grad_assumptions or not raw.materialize_grads:
        retrace = _backward_retracer(fn_cls, raw.inputs_for_retrace, pair)
    return make_capture(pair, outer, fn_cls, call_key(args, dims), time.perf_counter() - start,
                        retrace, dims, raw.shape_guards)


def _dynamic_dims(fn_cls: type, args: tuple[Any, ...],
                  dynamic: bool | Mapping[int | str, Sequence[int]]) -> dict[int, tuple[int, ...]]:
    """Normalise ``dynamic`` to {argument position: dimensions}."""
    if dynamic is False:
        return {}
    if dynamic is True:
        return {i: tuple(range(a.dim())) for i, a in enumerate(args)
                if isinstance(a, torch.Tensor) and a.dim() > 0}
    argnames = function_parts(fn_cls).argnames
    dims: dict[int, tuple[int, ...]] = {}
    for name, which in dynamic.items():
        index = argnames.index(name) if isinstance(name, str) and name in argnames else name
        if not isinstance(index, int) or not (0 <= index < len(args)) or not isinstance(args[index], torch.Tensor):
            raise UnsupportedArgumentError(
                f"dynamic names {name!r}, which is not a tensor argument of {fn_cls.__qualname__} "
                f"(arguments: {', '.join(argnames)}).",
                "Only dimensions of tensor arguments can be dynamic.",
                "Name a tensor argument by name or position, e.g. dynamic={'x': [0]}.")
        dims[index] = tuple(int(d) % args[index].dim() for d in which)
    return dims


def _backward_retracer(fn_cls: type, inputs: TraceInputs, pair: Pair) -> Retrace:
    """Trace backward again for grads unlike the ones it was traced with (see runtime)."""
    saved_index = {name: i for i, name in enumerate(pair.saved_names)}

    def retrace(layout: GradLayout) -> tuple[Any, tuple[int, ...]]:
        specs = tuple(None if g is None else GradSpec(g[0], g[1]) for g in layout)
        variant = make_pair(trace_function(fn_cls, (), {}, grad_specs=specs, retrace=inputs))
        missing = [n for n in variant.saved_names if n not in saved_index]
        if missing:
            raise UnsupportedOperationError(
                f"{pair.function_name}.backward, for the grads it received now, reads forward "
                f"values ({', '.join(missing)}) that forward did not save for the grads it "
                "was captured with.",
                "Forward has already run; it saved only what the captured backward needed.",
                "Make backward read the same forward values whatever its grads look like.")
        return variant.bwd, tuple(saved_index[n] for n in variant.saved_names)

    return retrace


def apply(fn_cls: type, *args: Any, **kwargs: Any) -> Any:
    """Drop-in for ``fn_cls.apply(*args, **kwargs)``: captures once per distinct call key."""
    args = _bind(fn_cls, args, kwargs)
    key = (fn_cls, call_key(args))
    cap = _cache.get(key)
    if cap is None or (cap.live_key and cap.live_key != live_key(cap.inputs)):
        with _cache_lock:
            cap = _cache.get(key)
            if cap is None or (cap.live_key and cap.live_key != live_key(cap.inputs)):
                cap = capture(fn_cls, *args)
                _cache[key] = cap
    return cap.run(args)


def clear_cache() -> None:
    """Forget every capture made by ``apply``."""
    with _cache_lock:
        _cache.clear()
