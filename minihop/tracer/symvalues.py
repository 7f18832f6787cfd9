"""Python numbers forward computed from symbolic sizes, made per-call values.

Place in the pipeline: tracer, at the end of a trace (``trace.trace_function``), before the
``RawCapture`` is made. With symbolic sizes (``dynamic=``, or the automatic dynamic cache),
``x.shape[0]`` is a ``torch.SymInt`` of the trace (``s93``) and ``x.shape[0] / 2`` a
``SymFloat``. Forward may hand such a number to the caller -- in its return value, in a dict
or ``torch.Size`` it returns, in a value it sets on an output (``y.info = {"n": n}``), or in a
write to Python state (``self.total += n``). Eager gives each call its own number; a capture
must too, never the symbol (whose ``int()`` is the trace's example size).

So each symbolic number is replaced by a ``structure.Computed``: the ShapeEnv's expression
printed as Python over the call's bound arguments (each size symbol becomes the argument's
``.size(d)``, a dynamic int argument itself). The runtime evaluates it on each call.

Invariant: no ``SymInt``/``SymFloat``/``SymBool`` leaves the tracer in a capture's output
spec, outside writes or Python-state writes; a symbol that no argument defines (none should
reach here) refuses the capture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import sympy
import torch
from torch.utils._sympy.printers import PythonPrinter

from ..errors import UnsupportedOutputError
from ..spec import OutsideWrite, PythonState
from ..library_state import own_dict
from ..structure import Computed, attributes, path_expression
from ..returned import OutputSpec

__all__ = ["resolve_symbolic"]

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def resolve_symbolic(name: str, symbol_sources: Mapping[sympy.Symbol, tuple[Any, Any, Any]], spec: OutputSpec,
                     writes: tuple[OutsideWrite, ...],
                     state: PythonState) -> tuple[OutputSpec, tuple[OutsideWrite, ...], PythonState]:
    """``spec``, ``writes`` and ``state`` with every symbolic number made a ``Computed``.

    ``symbol_sources`` maps each size symbol to ``(InputSource, dim, SymInt)`` (the tracer's
    record of where a symbol comes from).
    """
    places = {symbol: sympy.Symbol(_place_code(source, dim), **_assumptions(symbol))
              for symbol, (source, dim, _) in symbol_sources.items() if source.path is not None}

    def resolve(value: Any, where: str) -> Any:
        return _resolve(value, places, name, where)

    if _has_symbolic(spec):
        spec = _resolve_spec(spec, resolve)
    if any(w.output is None and _has_symbolic(w.value) for w in writes):
        writes = tuple(dataclasses.replace(w, value=resolve(w.value, "a value it sets outside its return value"))
                       if w.output is None else w for w in writes)
    if any(_has_symbolic(w.payload) for w in state.writes):
        state = dataclasses.replace(state, writes=tuple(
            dataclasses.replace(w, payload=resolve(w.payload, f"a value it writes to {w.place.description}"))
            for w in state.writes))
    return spec, writes, state


def _place_code(source: Any, dim: int | None) -> str:
    code = path_expression(source.path)
    return code if dim is None else f"{code}.size({int(dim)})"


def _assumptions(symbol: sympy.Symbol) -> dict[str, bool]:
    # Keep the symbol's integer/positive facts: the printer writes FloorDiv and friends by them.
    return {k: v for k, v in symbol.assumptions0.items() if k in ("integer", "positive", "nonnegative")}


def _has_symbolic(value: Any) -> bool:
    if issubclass(type(value), _SYMBOLIC):
        return True
    if issubclass(type(value), OutputSpec):
        return _has_symbolic(value.value) or any(_has_symbolic(c) for c in value.children)
    if issubclass(type(value), (tuple, list, set, frozenset)):
        return any(_has_symbolic(v) for v in value)
    if issubclass(type(value), dict):
        return any(_has_symbolic(v) for v in value.values())
    if own_dict(value) is not None and not issubclass(type(value), (type, torch.nn.Module, torch.Tensor)):
        return any(_has_symbolic(v) for v in attributes(value).values())
    return False


def _constant(value: Any) -> bool:
    """A SymInt the trace pinned to a number (``node.expr`` a constant): a plain number."""
    return bool(value.node.expr.is_number)


def _resolve_spec(spec: OutputSpec, resolve: Any) -> OutputSpec:
    if spec.kind == "const":
        return dataclasses.replace(spec, value=resolve(spec.value, "its return value"))
    return dataclasses.replace(spec, children=tuple(_resolve_spec(c, resolve) for c in spec.children))


def _resolve(value: Any, places: Mapping[sympy.Symbol, sympy.Symbol], name: str, where: str) -> Any:
    if issubclass(type(value), _SYMBOLIC):
        expr = value.node.expr
        if _constant(value):
            return _python_number(value, expr)
        missing = expr.free_symbols - places.keys()
        if missing:
            raise UnsupportedOutputError(
                f"{name}.forward puts a number computed from sizes in {where}, and minihop cannot "
                f"say which argument's sizes its symbols ({', '.join(sorted(map(str, missing)))}) are.",
                "With symbolic sizes such a number must be computed again for each call; for "
                "this one minihop does not know how.",
                "Capture with static sizes (dynamic=False), or return the number as a tensor.")
        return Computed(PythonPrinter().doprint(expr.xreplace(dict(places))))
    if issubclass(type(value), dict):
        new = type(value)() if type(value) is dict else value.copy()
        for k, v in value.items():
            new[k] = _resolve(v, places, name, where)
        return new
    if issubclass(type(value), torch.Size):
        return torch.Size([_resolve(v, places, name, where) for v in value])
    if issubclass(type(value), (tuple, list, set, frozenset)) and not hasattr(value, "_fields"):
        return type(value)(_resolve(v, places, name, where) for v in value)
    if _has_symbolic(value):
        # Inside a user object (or a namedtuple) we do not rebuild per call: refuse.
        raise UnsupportedOutputError(
            f"{name}.forward puts a number computed from symbolic sizes inside a "
            f"{type(value).__name__} in {where}.",
            "With symbolic sizes each call must compute that number again; minihop rebuilds "
            "plain containers (tuple, list, dict, torch.Size) per call, not other objects.",
            "Put the number in a plain container, or capture with static sizes (dynamic=False).")
    return value


def _python_number(value: Any, expr: Any) -> Any:
    if issubclass(type(value), torch.SymBool):
        return bool(expr)
    return int(expr) if issubclass(type(value), torch.SymInt) else float(expr)
