"""Data-dependent sizes and scalars as unbacked symbols.

Place in the pipeline: tracer, called by ``RecordingMode`` when the user's code calls an op
whose output size depends on tensor values (``nonzero``, ``x[mask]``, ``masked_select``) or
takes a number out of a tensor (``.item()``, ``.tolist()``). Under a ``ShapeEnv`` that
allows them, fake tensors answer with unbacked symbols (``u0``, ``zuf0``), as Dynamo's
``capture_dynamic_output_shape_ops`` / ``capture_scalar_outputs`` do; the graphs carry them:
a number is its ``item``/``tolist`` node, a size is ``aten.sym_size.int`` of the tensor that
has it, made where it is first used (in backward: a saved value, as SymInts travel). The facts
the trace relied on (``torch._check``, a split's sizes summing to the length) are the
ShapeEnv's deferred runtime asserts; each becomes an ``aten._assert_scalar`` node, so every
call checks it.

A trace starts without a ShapeEnv (static captures pay none) and is run again with one when
it meets the first such op (``Retrace``). Where a number later decides Python control flow
(a guard on the symbol: ``if m > 0:``, ``float(m)``, returned as a Python number), or reaches
an op through float arithmetic (``m + 1``: its sympy form is reassociated and simplified, not
what Python computes), the trace is run again with that read answered by ``values.ValueReader`` (a value-guarded read) instead;
a data-dependent size has no such fallback and is refused (MH103) with the line and the ways
out.

Invariant: every unbacked symbol a graph uses is computed by a node of that graph or comes in
as a saved forward value; an assert whose symbols a graph cannot compute is torch's own
(inside an op, which checks it again when it runs).
"""

from __future__ import annotations

import dataclasses
import operator
import sys
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, free_unbacked_symbols
from torch.utils._sympy.symbol import SymT, symbol_is_type

from ..errors import DataDependentError
from ..spec import RANGE_CHECK, DataRead
from .frames import format_frame, user_frame
from .values import ancestors, refuse_data_read

__all__ = ["Plan", "Retrace", "UnbackedValues"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one trace answers data-dependent ops: with a ShapeEnv (``unbacked``), and which
    scalar reads ((phase, index among that phase's reads)) are value reads instead."""

    unbacked: bool = False
    value_reads: frozenset[tuple[str, int]] = frozenset()


class Retrace(BaseException):
    """Trace again under ``plan``; ``refusal`` is the error where that is not possible.

    A ``BaseException``: it passes through the user's own ``except Exception`` unchanged.
    """

    def __init__(self, plan: Plan, refusal: DataDependentError) -> None:
        super().__init__(str(refusal))
        self.plan = plan
        self.refusal = refusal


@dataclasses.dataclass(frozen=True)
class _Origin:
    """Where an unbacked symbol came from: the read (phase, index), op and source line."""

    key: tuple[str, int] | None  # None: a size (no value-read fallback)
    op: str
    where: str | None


class UnbackedValues:
    """The unbacked symbols of one trace (``tracing``: its ``session.Tracing``) under ``plan``."""

    def __init__(self, tracing: Any, plan: Plan) -> None:
        self.t = tracing
        self.plan = plan
        self.counts = {"forward": 0, "backward": 0}
        self.origin: dict[sympy.Symbol, _Origin] = {}
        self.numbers: dict[int, Any] = {}  # id -> each number a scalar read gave
        self.asserted: dict[sympy.Basic, Any] = {}  # assert -> the recorder that checks it
        self.seen_asserts = 0

    def backward_again(self) -> None:
        """Backward is traced again (a new bwd recorder): its reads and asserts start over."""
        self.counts["backward"] = 0
        self.asserted = {e: rec for e, rec in self.asserted.items() if rec is self.t.fwd}
        self.seen_asserts = 0

    # -- the ops ---------------------------------------------------------------------------
    def scalar(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], where: str | None) -> Any:
        """``.item()``/``.tolist()``: unbacked symbols when the tensor depends on the inputs."""
        t = self.t
        phase = self._phase()
        key = (phase, self.counts[phase])
        self.counts[phase] += 1
        if key in self.plan.value_reads or not self._reads_inputs(args[0]):
            return t.values.read(func, args, kwargs, where)
        op = func.__name__
        if t.fake_mode.shape_env is None:
            raise self.missing_shape_env(func, where)
        result = func(*args, **kwargs)
        rec = self.t.recorder()
        node = rec.record(func, args, kwargs, result)
        for path, leaf in _leaves(result, ()):
            if issubclass(type(leaf), (torch.SymInt, torch.SymFloat, torch.SymBool)) and leaf.node.expr.is_Symbol:
                rec.defs[leaf.node.expr] = (node, path)
                self.numbers[id(leaf)] = leaf
                self.origin[leaf.node.expr] = _Origin(key, op, where)
        t.values.reads.append(DataRead("unbacked", phase, op, _symbols_of(result), where))
        self.flush(rec)
        return result

    def after_op(self, rec: Any, func: Any, result: Any) -> None:
        """A recorded op's result sizes that are new unbacked symbols get their definition."""
        items = result if issubclass(type(result), (tuple, list)) else (result,)
        for item in items:
            if not issubclass(type(item), torch.Tensor):
                continue
            for d, size in enumerate(item.shape):
                if issubclass(type(size), torch.SymInt):
                    expr = size.node.expr
                    if expr.is_Symbol and expr not in self.origin and free_unbacked_symbols(size):
                        rec.defs[expr] = (rec.node_of[id(item)], ("size", d))
                        op = getattr(func, "__name__", str(func))
                        where = format_frame(user_frame())
                        self.origin[expr] = _Origin(None, op, where)
                        self.t.values.reads.append(DataRead("unbacked", self._phase(), op,
                                                            str(expr), where))
        self.flush(rec)

    def missing_shape_env(self, func: Any, where: str | None) -> Retrace:
        """An op with a data-dependent output size in a trace without a ShapeEnv."""
        return self._retrace(dataclasses.replace(self.plan, unbacked=True),
                             getattr(func, "__name__", str(func)), where)

    # -- guards ----------------------------------------------------------------------------
    def on_guard(self, error: GuardOnDataDependentSymNode, where: str | None) -> DataDependentError:
        """Python decided something on an unbacked symbol: retrace with its reads as value
        reads (raises ``Retrace``), or the refusal for a size."""
        return self.escape(error.cond, where, "Python branches on it")

    def escape(self, expr: Any, where: str | None, how: str) -> DataDependentError:
        """``expr``'s unbacked symbols leave the graphs (``how``): their scalar reads become
        value reads (raises ``Retrace``); the refusal (MH103) when none can."""
        symbols = sorted((s for s in getattr(expr, "free_symbols", ()) if s in self.origin), key=str)
        keys = {self.origin[s].key for s in symbols} - {None}
        if keys:
            plan = dataclasses.replace(self.plan, value_reads=self.plan.value_reads | keys)
            origin = self.origin[symbols[0]]
            raise self._retrace(plan, origin.op, origin.where)
        describe = self.t._describe()
        if not symbols:
            return refuse_data_read(describe, "an op", where,
                                    f"{how}, on a size ({expr}) that comes from tensor values.")
        origin = self.origin[symbols[0]]
        made = f" ({origin.where})" if origin.where else ""
        return refuse_data_read(describe, origin.op, where,
                                f"its output size {symbols[0]} comes from tensor values{made}, "
                                f"and {how} ({expr}); a size has no value to guard on.")

    def _retrace(self, plan: Plan, op: str, where: str | None) -> Retrace:
        return Retrace(plan, refuse_data_read(self.t._describe(), op, where,
                                              "capturing it needs the trace run again (with a "
                                              "ShapeEnv, or with the value read), which this one "
                                              "cannot: it runs on an enclosing trace's fake "
                                              "arguments (minihop.trace), or is backward traced "
                                              "again alone."))

    # -- runtime asserts -------------------------------------------------------------------
    def flush(self, rec: Any) -> None:
        """The ShapeEnv's new deferred runtime asserts, as assert nodes in ``rec``'s graph."""
        env = self.t.fake_mode.shape_env
        if env is None or env.num_deferred_runtime_asserts == self.seen_asserts:
            return
        self.seen_asserts = env.num_deferred_runtime_asserts
        for asserts in list(env.deferred_runtime_asserts.values()):
            for ra in asserts:
                if self.asserted.get(ra.expr) in (rec, self.t.fwd):
                    continue  # checked already (forward's hold in backward too)
                if not all(self._can_compute(rec, s) for s in ra.expr.free_symbols):
                    continue  # inside an op (nonzero in index_put): the op checks it again
                if any(symbol_is_type(s, SymT.UNBACKED_FLOAT) for s in ra.expr.free_symbols):
                    # A check on a float (torch._check(m * 2 > 1)): its sympy form is not what
                    # Python computes, so the number is read as a value and checked at capture.
                    raise self.escape(ra.expr, format_frame(user_frame()), "a check is made on it")
                self.asserted[ra.expr] = rec
                cond = rec.node_for_expr(ra.expr)
                rec.create_node("call_function", torch.ops.aten._assert_scalar.default,
                                (cond, f"Runtime assertion failed for expression {ra.expr}"), {})

    def check_ranges(self, rec: Any) -> None:
        """Each size symbol ``rec``'s graph makes (``x[mask]``, ``nonzero``) is checked against
        its value range right where it is made: its ``aten.sym_size.int`` node (the one every
        use reads) moves there, then an assert per finite bound (``u0 >= 0``, ``u0 <= 20``).
        Dynamo's graphs carry these (torch.fx's ``insert_deferred_runtime_asserts``, which it
        runs on every body once traced), so the bodies agree strictly; the op cannot break
        them, so they change no result. Run once, when the phase's trace is done, so that the
        nodes' names are picked among the whole graph's, as that pass's are."""
        env = self.t.fake_mode.shape_env
        if env is None:
            return
        order = {node: i for i, node in enumerate(rec.graph.nodes)}
        made = sorted(((s, node, path) for s, (node, path) in rec.defs.items()
                       if path and path[0] == "size"), key=lambda d: order[d[1]])
        for symbol, node, path in made:
            bounds = env.var_to_range[symbol]
            upper = None if bounds.upper >= sys.maxsize - 1 else _finite(bounds.upper)
            lower = _finite(bounds.lower)
            if env._default_unspecified_value_range().issubset(bounds) or (lower, upper) == (None, None):
                continue
            size = rec.expr_nodes.get(symbol)
            if size is None:
                with rec.graph.inserting_after(node):
                    size = rec.node_for_expr(symbol)
            else:
                node.append(size)  # read once, where it is made (later uses keep reading it)
            size.meta[RANGE_CHECK] = True
            last = size
            for op, bound in ((operator.ge, lower), (operator.le, upper)):
                if bound is None:
                    continue
                expr = op(symbol, bound)
                with rec.graph.inserting_after(last):
                    cond = rec.create_node("call_function", op, (size, bound), {})
                with rec.graph.inserting_after(cond):
                    last = rec.create_node(
                        "call_function", torch.ops.aten._assert_scalar.default,
                        (cond, f"Runtime assertion failed for expression {expr} on node '{cond}'"), {})
                cond.meta.update(val=op(size.meta["val"], bound), stack_trace=node.meta.get("stack_trace"))
                cond.meta[RANGE_CHECK] = True
                last.meta.update(stack_trace=node.meta.get("stack_trace"))
                last.meta[RANGE_CHECK] = str(expr)

    def _can_compute(self, rec: Any, symbol: sympy.Symbol) -> bool:
        t = self.t
        if symbol in rec.defs or symbol in rec.expr_nodes or symbol in t.symbol_sources:
            return True
        return rec is t.bwd and (symbol in t.fwd.defs or symbol in t.fwd.expr_nodes)

    # -- helpers ---------------------------------------------------------------------------
    def _phase(self) -> str:
        return "backward" if self.t.phase == "backward" else "forward"

    def _reads_inputs(self, value: torch.Tensor) -> bool:
        """Whether ``value``'s data depends on the call (inputs, grads, forward's inputs), as
        opposed to Python values only (``torch.tensor(dim)``: a constant, read at capture)."""
        t = self.t
        if t.phase == "backward":
            node = t.bwd.node_of.get(id(value))
            if node is not None:
                return self._graph_reads(t.bwd, node)
            if id(value) in t.grad_of:
                return True
        node = t.fwd.node_of.get(id(value))
        return node is None or self._graph_reads(t.fwd, node)

    def _graph_reads(self, rec: Any, node: fx.Node) -> bool:
        if any(n.meta.get("minihop_mutates") for n in rec.graph.nodes):
            nodes: Any = list(rec.graph.nodes)  # a write may carry the inputs into any tensor
        else:
            nodes = ancestors([node])
        for n in nodes:
            if n.op != "placeholder":
                continue
            if rec is self.t.fwd:
                return True
            fwd_node = next((f for b, f in self.t.bwd_saved if b is n), None)
            if fwd_node is None or self._graph_reads(self.t.fwd, fwd_node):
                return True
        return False


def _finite(bound: Any) -> int | None:
    """A value range's bound as an int, None where it is infinite (no assert to write)."""
    return None if not bound.is_finite else int(bound)


def _leaves(value: Any, path: tuple[int, ...]) -> list[tuple[tuple[int, ...], Any]]:
    if issubclass(type(value), (list, tuple)):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, (*path, i))]
    return [(path, value)]


def _symbols_of(value: Any) -> Any:
    if issubclass(type(value), list):
        return [_symbols_of(v) for v in value]
    return str(value)
