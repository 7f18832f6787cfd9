"""``minihop.explain``: what a capture of a Function did with each thing it used.

Not part of the pipeline: it runs it (``pipeline.run_pipeline``) and reports, for a person,
every ctx feature the Function used and how minihop handled it (captured, specialised,
guarded, refused), the guards of the capture, and the size of its graphs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from .cache import CapturedFunction
from .errors import DataDependentError, MinihopError
from .pipeline import MAX_VALUE_VARIANTS, UNSET, refuse_shadowed_options, run_pipeline
from .spec import EFFECT

__all__ = ["Explanation", "explain"]

# How each ctx feature is handled; rules as data, keyed by the feature's name.
_HANDLING: dict[str, str] = {
    "save_for_backward": "captured: values backward reads are saved through the runtime ctx's "
                         "save_for_backward (version-checked, seen by saved_tensors_hooks)",
    "saved_tensors": "captured: each saved value backward reads becomes a bwd input",
    "needs_input_grad": "specialised: answered from the arguments' requires_grad, which is "
                        "part of the guard key",
    "mark_non_differentiable": "captured: non_differentiable_idx",
    "mark_dirty": "captured: dirty_idx; the runtime marks the input dirty as eager does",
    "set_materialize_grads(False)": "specialised: backward is retraced per pattern of None grads",
    "set_materialize_grads(True)": "captured: grads are materialised (the default)",
    "save_for_forward": "ignored: forward-mode AD only",
}


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The report ``explain`` prints; ``features`` pairs each use with its handling."""

    function: str
    captured: bool
    error: str | None
    features: tuple[tuple[str, str], ...] = ()
    guards: tuple[str, ...] = ()
    python_writes: tuple[str, ...] = ()  # Python state forward/backward change (replayed)
    effects: tuple[str, ...] = ()  # graph nodes kept for their effect (random state, .grad)
    # Each Python value taken out of tensor data: how it was handled, and its source line.
    data_values: tuple[str, ...] = ()
    fwd_inputs: tuple[str, ...] = ()
    # Each size symbol (a SymInt fwd input) and the argument dimension it is read from.
    symbols: tuple[str, ...] = ()
    saved: int = 0
    saved_values: tuple[str, ...] = ()
    graphs: str = ""
    fwd_ops: int = 0
    bwd_ops: int = 0
    capture_ms: float = 0.0

    def __repr__(self) -> str:
        # One line: ``explain`` has printed the report already, and a REPL shows the returned
        # value too; the report itself is ``str()`` (``print(explanation)``).
        if not self.captured:
            code = (self.error or "").split("]", 1)[0].lstrip("[") if (self.error or "").startswith("[") else "error"
            return f"Explanation({self.function}: refused, {code}; print() it for the report)"
        return (f"Explanation({self.function}: captured; fwd ops {self.fwd_ops}, bwd ops {self.bwd_ops}, "
                f"saved {self.saved}; print() it for the report)")

    def __str__(self) -> str:
        lines = [f"minihop.explain: {self.function}",
                 f"  captured: {'yes' if self.captured else 'no'}"]

        def section(title: str, items: Iterable[str], empty: str | None = None) -> None:
            items = list(items)
            lines.append(f"  {title}:")
            lines.extend(f"    {item}" for item in (items or ([empty] if empty else [])))

        if self.error:
            section("refused", self.error.splitlines())
            if self.data_values:
                section("data-dependent values", self.data_values)
            return "\n".join(lines)
        lines.append(f"  capture time: {self.capture_ms:.1f} ms; fwd ops {self.fwd_ops}, bwd ops "
                     f"{self.bwd_ops}, saved values {self.saved}")
        lines.append("  fwd inputs: " + ", ".join(self.fwd_inputs))
        if self.symbols:
            section("size symbols (dynamic dimensions; their guards are under guards)", self.symbols)
        section("saved for backward", self.saved_values, "(nothing)")
        section("ctx features", (f"{name}: {how}" for name, how in self.features), "(none)")
        section("guards (a call must match these to reuse the capture)", self.guards)
        if self.data_values:
            section("data-dependent values (Python values taken from tensor data)", self.data_values)
        if self.python_writes:
            section("Python state written (replayed on every call, as eager does it)", self.python_writes)
        if self.effects:
            section("torch state in the graphs (random state, .grad of recomputed leaves)", self.effects)
        section("graphs", self.graphs.splitlines())
        return "\n".join(lines)


def _handling(feature: str) -> str:
    if feature in _HANDLING:
        return _HANDLING[feature]
    if feature.startswith("ctx.") and feature.endswith(("(SymInt)", "(SymFloat)", "(SymBool)")):
        return "captured: a size symbol on ctx stays symbolic (saved for backward if it reads it)"
    if feature.startswith("ctx.") and feature.endswith("(tensor)"):
        return "captured: a tensor on ctx is saved if backward reads it (no version check, as eager)"
    if feature.startswith("ctx."):
        return "specialised: a Python value on ctx is a constant in the bwd graph"
    return "captured"


def explain(fn_cls: type, /, *args: Any, dynamic: Any = UNSET, print_report: Any = UNSET,
            **kwargs: Any) -> Explanation:
    """Capture ``fn_cls`` (or the class a ``minihop.function`` serves) for these arguments and
    report how each of its features was handled.

    Prints the report (``print_report=False`` does not) and returns it as an ``Explanation``,
    whose ``repr`` is one line (a REPL does not print the report twice). Defaults:
    ``dynamic=False``, ``print_report=True``; an option named like an argument of
    ``fn_cls.forward`` that ``args`` leave unfilled is refused, never shadowed.

    >>> import torch, minihop
    >>> from minihop.demo import MySin
    >>> report = minihop.explain(MySin, torch.randn(4, requires_grad=True), print_report=False)
    >>> report.captured, report.fwd_inputs
    (True, ('l_x_ <- x',))
    """
    if issubclass(type(fn_cls), CapturedFunction):  # (``minihop.function(F)``: the class it serves)
        fn_cls = fn_cls.fn_cls
    refuse_shadowed_options(fn_cls, args, {"dynamic": dynamic, "print_report": print_report})
    dynamic = False if dynamic is UNSET else dynamic
    print_report = True if print_report is UNSET else print_report
    name = getattr(fn_cls, "__qualname__", repr(fn_cls))
    try:
        raw, cap = run_pipeline(fn_cls, args, kwargs, dynamic)
    except MinihopError as e:
        refused = ()
        if issubclass(type(e), DataDependentError):
            refused = (f"refused: {e.found}" + (f"  [{e.where}]" if e.where else ""),)
        report = Explanation(name, False, str(e), data_values=refused)
    else:
        # The capture's own assumptions: exactly what a call is checked against (and what
        # backward checks when it runs), each with its value at capture and its source line.
        guards = [assumption.show() for assumption in cap.assumptions]
        state = cap.python_state
        writes = tuple(f"{w.describe()}  ({w.kind}, replayed each time {w.phase} runs"
                       + (f"; {w.line}" if w.line else "") + ")" for w in state.writes)
        saved_nodes = [n for n in cap.fwd.graph.nodes if n.op == "output"][0].args[0][1]
        report = Explanation(
            name, True, None,
            features=tuple((f, _handling(f)) for f in raw.ctx_features),
            guards=tuple(guards),
            python_writes=writes,
            effects=tuple(f"{phase}: {n.meta[EFFECT]}" for phase, gm in (("forward", cap.fwd), ("backward", cap.bwd))
                          for n in gm.graph.nodes if EFFECT in n.meta),
            data_values=tuple(_describe_read(r) for r in raw.data_reads),
            fwd_inputs=tuple(f"{s.name} <- {s.description}" for s in cap.inputs),
            symbols=tuple(f"{s.name} = {s.description}" for s in cap.inputs if s.dim is not None),
            saved=len(saved_nodes),
            saved_values=tuple(f"{n.name}: {_describe_value(n.meta.get('val'))}" for n in saved_nodes),
            graphs=str(cap),
            fwd_ops=sum(n.op.startswith("call") for n in cap.fwd.graph.nodes),
            bwd_ops=sum(n.op.startswith("call") for n in cap.bwd.graph.nodes),
            capture_ms=cap.capture_seconds * 1e3,
        )
    if print_report:
        print(report)
    return report


def _describe_read(read: Any) -> str:
    if read.kind == "unbacked":
        return (f"{read.op} in {read.phase} -> {read.value}  (unbacked: a symbol the graphs compute "
                "on every call; one capture serves every value)") + (f"  [{read.line}]" if read.line else "")
    if read.kind == "constant":
        how = "constant: computed from Python values only (guarded already)"
    elif read.phase == "backward":
        how = (f"value-guarded before each backward: recomputed from its grads and saved values; "
               f"another value traces backward again (at most {MAX_VALUE_VARIANTS} traces kept; "
               "traced at capture for grads of ones)")
    else:
        how = "value-guarded: recomputed from the inputs on every call; another value recaptures"
    return f"{read.op} in {read.phase} == {read.value!r}  ({how})" + (f"  [{read.line}]" if read.line else "")


def _describe_value(val: Any) -> str:
    if issubclass(type(val), torch.Tensor):
        size = val.numel() * val.element_size() if not any(issubclass(type(d), torch.SymInt) for d in val.shape) else None
        return (f"{str(val.dtype).removeprefix('torch.')}{list(val.shape)}"
                + (f" ({size} bytes)" if size is not None else ""))
    return f"{type(val).__name__} {val}"

