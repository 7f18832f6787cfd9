"""Record torch-level calls on fake values into an fx graph.

Place in the pipeline: the tracer's engine. ``GraphRecorder`` (a ``torch.fx.Tracer``) owns one
``fx.Graph`` and the map from each fake value to the node that produced it; ``RecordingMode``
(a ``TorchFunctionMode``) sees every torch call the user's code makes, runs it on fake values
(so ``x.shape``, ``x.dtype`` and ``isinstance`` answer for real) and hands calls that produce
tensors to the active recorder. Its helpers, one job each: ``special_calls`` (the calls handled
by a table row instead of being run and recorded), ``call_forms`` (how a node is spelled),
``op_args`` (the tensors among a call's arguments), ``refusals`` (torch's exceptions turned into
minihop's) and ``frames`` (the user's source line).

Invariant: every fake tensor the user's code can reach maps to exactly one node of the graph
being recorded, or is resolved (lifted, or saved from forward) on first use.
"""

from __future__ import annotations

import operator
import threading
import types
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.functions import FloatTrueDiv, FloorDiv, IntTrueDiv, Mod, PythonMod
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.fx.experimental.proxy_tensor import PreDispatchTorchFunctionMode
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, free_unbacked_symbols
from torch.utils._sympy.symbol import SymT, symbol_is_type

from . import call_watch, handlers, messages, operators, recompute
from .frames import format_frame, stack_trace, user_frame, user_frame_object
from .call_forms import graph_call, passed_kwargs
from .names import DISCARD, STORE, UNPACK, result_use
from .op_args import any_leaf, is_tensor, map_plain, tensors_in, version_of
from .operators import Form
from .refusals import fake_data_missing, refusal_for
from .run_context import refuse_entered_dispatch_modes
from .special_calls import AUTOCAST_SWITCHES, COPY_READS, NOT_SPECIAL, SCALAR_READS, VALUE_READS, special_call
from .tensor_state import rewrite_autograd_call
from ..errors import MinihopError, UnsupportedOperationError
from ..fxgraph import append_node

__all__ = ["GraphRecorder", "RecordingMode", "tracing"]

_state = threading.local()


def tracing() -> bool:
    """Whether this thread is inside a minihop trace (user code running on fake values)."""
    return getattr(_state, "depth", 0) > 0


_SYMPY_OPS: dict[type, Callable[..., Any]] = {
    sympy.Add: operator.add, sympy.Mul: operator.mul, FloorDiv: operator.floordiv,
    Mod: operator.mod, PythonMod: operator.mod, FloatTrueDiv: operator.truediv,
    IntTrueDiv: operator.truediv, sympy.Eq: operator.eq, sympy.Ne: operator.ne,
    sympy.Lt: operator.lt, sympy.Le: operator.le, sympy.Gt: operator.gt, sympy.Ge: operator.ge,
    sympy.And: operator.and_, sympy.Or: operator.or_,
}


class GraphRecorder:
    """One graph being recorded, and which node each fake value stands for.

    ``resolve`` is called for a fake tensor the graph has not seen: it returns the node to use
    (a placeholder for an input or a saved forward value) or raises. Nodes go straight into an
    ``fx.Graph`` (an ``fx.Tracer`` would add module scopes minihop has no use for, and its
    construction alone was a few percent of a capture).
    """

    def __init__(self, resolve: Callable[["GraphRecorder", torch.Tensor], fx.Node],
                 resolve_symbol: Callable[["GraphRecorder", sympy.Symbol], fx.Node]) -> None:
        self.graph = fx.Graph()
        self.resolve = resolve
        # Dynamic shapes: a size symbol the graph has not seen -> its placeholder.
        self.resolve_symbol = resolve_symbol
        self.expr_nodes: dict[sympy.Expr, Any] = {}
        # Unbacked symbols this graph makes: symbol -> (node, how to read it: () the node, (i, ...) its items, ("size", d)).
        self.defs: dict[sympy.Symbol, tuple[fx.Node, tuple[Any, ...]]] = {}
        # ``(expr, where, how) -> error`` for an unbacked expression the graph cannot compute.
        self.escape: Callable[[Any, str | None, str], Exception] | None = None
        # id -> the numbers .item()/.tolist() gave (kept alive): those reach ops as they are.
        self.numbers: dict[int, Any] = {}
        self.node_of: dict[int, fx.Node] = {}
        # Keeps every fake alive so ``id`` keys stay unique for the life of the recording.
        self.alive: list[Any] = []
        # Calls that wrote into a tensor argument (its version moved), in order: (node, tensors written), told to ``on_mutation``.
        self.mutations: list[tuple[fx.Node, tuple[torch.Tensor, ...]]] = []
        self.on_mutation: Callable[[fx.Node], None] | None = None
        # node -> the local the user's code stored it in as it was made (see names.result_use).
        self.stored: dict[fx.Node, str] = {}
        # (tensor, node): an op in an expression returned a tensor already named (``+x``,
        # ``y.mul_(2)`` before ``.add_(1)``); the next op reads that operand as this node.
        self.pending_alias: tuple[torch.Tensor, fx.Node] | None = None
        # Where a torch.Generator reached an op (refused at the phase's end: effects.py).
        self.generators: list[str | None] = []

    def let_go(self) -> None:
        """A failed trace: the values kept alive go while the watches run (a death may run the user's code)."""
        self.alive.clear()
        self.mutations.clear()
        self.pending_alias = None
        for node in self.graph.nodes:
            node.meta.pop("val", None)

    def _read_pending_alias(self, args: tuple[Any, ...], graph_args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The op right after an expression's aliasing result reads it there: the last operand
        that is that tensor (Python evaluates it last, just before this call) is its node."""
        tensor, alias = self.pending_alias  # type: ignore[misc]
        self.pending_alias = None
        for i in range(len(args) - 1, -1, -1):
            if args[i] is tensor:
                return (*graph_args[:i], alias, *graph_args[i + 1:])
        return graph_args

    def create_node(self, op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                    name: str | None = None) -> fx.Node:
        return append_node(self.graph, op, target, args, kwargs, name)

    def bind(self, value: torch.Tensor, node: fx.Node) -> None:
        self.node_of[id(value)] = node
        self.alive.append(value)
        node.meta["val"] = value

    def node_for(self, value: torch.Tensor) -> fx.Node:
        node = self.node_of.get(id(value))
        if node is None:
            node = self.resolve(self, value)
            self.bind(value, node)
        return node

    def placeholder(self, name: str, value: Any) -> fx.Node:
        node = self.create_node("placeholder", name, (), {}, name=name)
        node.meta["val"] = value
        return node

    def node_for_expr(self, expr: sympy.Expr) -> Any:
        """The graph value of a size expression: an int, a symbol's placeholder, or ops on them."""
        if expr.is_Integer:
            return int(expr)
        if expr.is_Number:
            return float(expr)
        if expr is sympy.true or expr is sympy.false:
            return bool(expr)
        node = self.expr_nodes.get(expr)
        if node is None:
            if expr in self.defs:
                node = self._read_def(*self.defs[expr])
            elif expr.is_Symbol:
                node = self.resolve_symbol(self, expr)
            else:
                node = self._build_expr(expr)
            self.expr_nodes[expr] = node
        return node

    def _read_def(self, node: fx.Node, path: tuple[Any, ...]) -> fx.Node:
        if path and path[0] == "size":
            size = self.create_node("call_function", torch.ops.aten.sym_size.int, (node, path[1]), {})
            size.meta["val"] = node.meta["val"].shape[path[1]]
            return size
        for i in path:
            item = self.create_node("call_function", operator.getitem, (node, i), {})
            item.meta["val"] = node.meta["val"][i]
            node = item
        return node

    def _build_expr(self, expr: sympy.Expr) -> fx.Node:
        op = _SYMPY_OPS.get(type(expr))
        if op is None and issubclass(type(expr), sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
            op = operator.pow
        if op is None and self.escape is not None and free_unbacked_symbols(expr):
            raise self.escape(expr, format_frame(user_frame()), f"it is used as {expr}, which minihop "
                              "does not write as graph arithmetic")
        if op is None:
            raise UnsupportedOperationError(
                f"A size expression {expr} ({type(expr).__name__}) reaches a graph op.",
                "minihop writes size arithmetic as +, *, //, % and integer powers only.",
                "Capture without dynamic shapes for this Function.")
        args = [self.node_for_expr(a) for a in expr.args]
        node = args[0]
        for arg in args[1:]:
            node = self.create_node("call_function", op, (node, arg), {})
        return node

    def note_mutation(self, node: fx.Node, written: tuple[torch.Tensor, ...]) -> None:
        """``node`` wrote into ``written`` in place: it is kept even when its result is unused
        (the write is its effect), and in its place in the order of ops."""
        node.meta["minihop_mutates"] = True
        self.mutations.append((node, written))
        if self.on_mutation is not None:
            self.on_mutation(node)

    def _graph_value(self, value: Any) -> Any:
        if issubclass(type(value), torch.Tensor):
            return self.node_for(value)
        if issubclass(type(value), torch.Generator):
            self.generators.append(format_frame(user_frame()))
        if issubclass(type(value), (torch.SymInt, torch.SymFloat, torch.SymBool)) and self.escape is not None \
                and id(value) not in self.numbers and free_unbacked_symbols(value) and \
                (not issubclass(type(value), torch.SymInt)
                 or any(symbol_is_type(s, SymT.UNBACKED_FLOAT) for s in value.node.expr.free_symbols)):
            # Not a number as read (.item()) but arithmetic on one: sympy keeps float arithmetic
            # reassociated and simplified ((m + 1e8) - 1e8 is m), not as Python evaluates it.
            raise self.escape(value.node.expr, format_frame(user_frame()),
                              "float arithmetic on it reaches a graph op")
        if issubclass(type(value), (torch.SymFloat, torch.SymBool)) and not free_unbacked_symbols(value):
            # Not written as graph arithmetic (yet): kept as a constant it would be a stale
            # symbol at run time, a silently wrong value.
            raise UnsupportedOperationError(
                f"A {type(value).__name__} ({value.node.expr}) computed from dynamic sizes "
                "reaches a graph op.",
                "minihop writes size arithmetic into the graph for integer sizes only (+, *, //, "
                "%, integer powers); a float or bool made from sizes (n / (n - 1)) is not.",
                "Capture without dynamic shapes for this Function (minihop.function(F) "
                "captures once per shape), or keep the arithmetic on integers.",
                where=format_frame(user_frame()))
        if issubclass(type(value), (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.node_for_expr(value.node.expr)  # a size, or a number read from data (.item())
        return value

    def to_graph_arg(self, value: Any) -> Any:
        return map_plain(self._graph_value, value)

    def record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
               form: Form | None = None) -> fx.Node:
        op, target, args = graph_call(func, args, kwargs, form)
        if kwargs and issubclass(type(func), types.FunctionType) and func.__module__ == "torch.nn.functional":
            kwargs = passed_kwargs(func, kwargs)
        graph_args = self.to_graph_arg(args)
        if self.pending_alias is not None:
            graph_args = self._read_pending_alias(args, graph_args)
        node = self.create_node(op, target, graph_args, self.to_graph_arg(kwargs))
        frame, direct = user_frame_object()
        use = None
        if frame is not None:
            node.meta["stack_trace"] = stack_trace(frame)
            if direct:
                use = result_use(frame)
        if issubclass(type(result), torch.Tensor):
            if direct and (use is None or use[0] == DISCARD) and id(result) in self.node_of:
                # The op returned a tensor the user names (``r.mul_(2)``, ``+x``), unstored: ``r``
                # still names its node (as Dynamo's later uses of ``r``), and only the expression
                # it is part of (``r.mul_(2).add_(1)``) reads this one.
                node.meta["val"] = result
                self.pending_alias = None if use is not None or not direct else (result, node)
                return node
            self.bind(result, node)
            if use is not None and use[0] == STORE:
                self.stored.setdefault(node, use[1])
            return node
        node.meta["val"] = result
        if issubclass(type(result), (tuple, list)):
            names = use[1] if use is not None and use[0] == UNPACK else ()
            for i, item in enumerate(result):
                if issubclass(type(item), torch.Tensor):
                    item_node = self.create_node("call_function", operator.getitem, (node, i), {})
                    item_node.meta["stack_trace"] = node.meta.get("stack_trace")
                    self.bind(item, item_node)
                    if i < len(names) and names[i] is not None:
                        self.stored[item_node] = names[i]
        return node


class RecordingMode(PreDispatchTorchFunctionMode):
    """Runs every torch call on fake values and records the ones that make tensors.

    Real tensors that reach a call (closed-over constants, module parameters) are turned into
    fake values first, through ``lift_real``, so the graph gets them as inputs.

    It is a ``PreDispatchTorchFunctionMode`` for one reason: ``torch.autocast`` tells only
    such modes when it is entered and exited (it is not an op), and minihop records both, as
    ``_enter_autocast``/``_exit_autocast`` nodes (Dynamo's form), so the graphs switch autocast
    where the user's code did (``custom_fwd(cast_inputs=...)`` included). Nothing else of that
    class is used.
    """

    def __init__(self, fake_mode: FakeTensorMode, lift_real: Callable[[torch.Tensor], torch.Tensor],
                 describe: Callable[[], str],
                 on_query: Callable[[Any, tuple[Any, ...], dict[str, Any], Any], None]) -> None:
        TorchFunctionMode.__init__(self)  # not PreDispatchTorchFunctionMode's (see above)
        self.fake_mode = fake_mode
        self.autocast_nodes: list[fx.Node] = []
        self.lift_real = lift_real
        self.describe = describe
        # Called for calls that make no tensor (metadata reads such as ``g.stride()``).
        self.on_query = on_query
        self.recorder: GraphRecorder | None = None
        # Answers a call whose Python result depends on tensor values (``.item()``,
        # ``bool(t)``, ``torch.equal``): ``(func, args, kwargs, where) -> value`` (see values).
        self.on_value: Callable[[Any, tuple[Any, ...], dict[str, Any], str | None], Any] | None = None
        # ``(func, args, kwargs) -> fake result or None``: a data-dependent-shape op on tensors
        # made from Python values only, computed for real (see values.constant_result).
        self.on_constant: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any] | None = None
        # Data-dependent sizes and scalars (``unbacked.UnbackedValues``), or None.
        self.unbacked: Any | None = None
        # ``(func, args, kwargs, attribute) -> answer or NOT_SPECIAL``: a read of one of
        # ``state_reads`` (a tensor's autograd state, storage, layout), which a fake copy may
        # answer with its own (``Tracing._on_state_read``).
        self.on_state_read: Callable[[Any, tuple[Any, ...], dict[str, Any], str], Any] | None = None
        self.state_reads: frozenset[str] = frozenset()
        # The code of the tracer's frame that calls the user's method: an op in a ``try``
        # between it and the op may be refused (``handlers.refuse_op_in_handler``).
        self.handler_stop: types.CodeType | None = None

    def where(self) -> str | None:
        """The user's source line running now, for an error raised from a handler."""
        return format_frame(user_frame())

    def _fakeify(self, value: Any) -> Any:
        if issubclass(type(value), torch.Tensor) and not issubclass(type(value), FakeTensor):
            return self.lift_real(value)
        return value

    def __enter__(self) -> "RecordingMode":
        _state.depth = getattr(_state, "depth", 0) + 1
        operators.hold()
        return super().__enter__()  # type: ignore[return-value]

    def __exit__(self, *exc: Any) -> None:
        _state.depth -= 1
        operators.release()
        super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        paused, outer = call_watch.pause(func), getattr(self, "_paused", None)  # (inline: the handler reads callers by depth)
        self._paused = paused
        try:
            return self._torch_function(func, types, args, kwargs)
        except MinihopError as e:
            handlers.note(e)  # (raised into the user's code, which may catch it: see handlers)
            raise
        finally:
            self._paused = outer
            call_watch.resume(paused)

    def _torch_function(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                        kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        form = operators.take_form()  # taken by this call whether or not it is recorded
        recorder = self.recorder
        if torch._C._len_torch_dispatch_stack() > 1:  # (a mode above the fake one: the phase's own)
            refuse_entered_dispatch_modes(self.fake_mode, self.describe(), self.where())
        # Autocast switches, grad mode, backward, numpy bridge, collectives (special_calls).
        special = special_call(func)
        if recorder is None:
            # Autocast has switched itself already: nothing to record, nothing to run.
            return None if special in AUTOCAST_SWITCHES else func(*args, **kwargs)
        if special is not None:
            on = call_watch.resume(self._paused)  # (code a row runs is watched as the call's)
            try:
                result = special(self, recorder, func, args, kwargs)
            finally:
                call_watch.pause_again(on)
            if result is not NOT_SPECIAL:
                return result
        func, args = rewrite_autograd_call(func, args, self.describe, lambda: format_frame(user_frame()))
        # Which arguments an op writes into is read off their version counters (each in-place
        # write bumps it, as in eager): that covers methods (``add_``), ``+=``, ``out=``,
        # ``inplace=True``, ``copy_`` and writes through a view, whatever the spelling.
        tensors = tensors_in(kwargs, tensors_in(args, [])) if kwargs else tensors_in(args, [])
        name = getattr(func, "__name__", None)
        if self.on_state_read is not None and tensors and args and args[0] is tensors[0]:
            # (a property's getter is named ``__get__``: its descriptor names the attribute)
            attr = getattr(getattr(func, "__self__", None), "__name__", None) if name == "__get__" else name
            if attr in self.state_reads:
                answer = self.on_state_read(func, args, kwargs, attr)
                if answer is not NOT_SPECIAL:
                    return answer
        if any(type(t) is not FakeTensor and not issubclass(type(t), FakeTensor) for t in tensors):
            args, kwargs = tree_map(self._fakeify, (args, kwargs))
            tensors = tensors_in(kwargs, tensors_in(args, []))
        versions = [version_of(t) for t in tensors]
        unbacked = self.unbacked
        setitem = func is torch.Tensor.__setitem__  # returns None but writes into its first argument
        try:
            if name in VALUE_READS:
                if unbacked is not None and name in SCALAR_READS:
                    return unbacked.scalar(func, args, kwargs, format_frame(user_frame()))
                raise DataDependentOutputException(func)
            heard = messages.op_begin()  # (messages the op gives: the graph's, once recorded)
            if heard is not None:  # (C++'s is located at this frame: the filters' memory of it here is not eager's)
                globals().pop("__warningregistry__", None)
            try:
                on = call_watch.resume(self._paused if type(func) not in call_watch.C_CODE else None)
                try:  # (a library's Python function, ``F.layer_norm``: its body is the call's code)
                    result = func(*args, **kwargs)
                finally:
                    call_watch.pause_again(on)
            finally:
                messages.op_end(heard)
        except Exception as e:
            if setitem and (type(e) is DataDependentOutputException or issubclass(type(e), GuardOnDataDependentSymNode)):
                # A write at a place read from data (``y[t[0].long()] = 1.0``): where it lands is
                # known when the graphs run, and no fake changes (the written tensor keeps its
                # shape). Recorded, not computed as a value read (that lost the write).
                recorder.note_mutation(recorder.record(operator.setitem, args, kwargs, None), (args[0],))
                messages.op_recorded()
                return None
            if self.on_constant is not None and name not in VALUE_READS and \
                    (type(e) in (DynamicOutputShapeException, DataDependentOutputException)
                     or fake_data_missing(e)):
                result = self.on_constant(func, args, kwargs)
                if result is not None:
                    recorder.record(func, args, kwargs, result, form)
                    messages.op_recorded()
                    return result
            if type(e) is DataDependentOutputException and self.on_value is not None \
                    and name not in COPY_READS:
                return self.on_value(func, args, kwargs, format_frame(user_frame()))
            if unbacked is not None and issubclass(type(e), GuardOnDataDependentSymNode):
                raise unbacked.on_guard(e, format_frame(user_frame())) from e
            if unbacked is not None and issubclass(type(e), DynamicOutputShapeException) \
                    and self.fake_mode.shape_env is None:
                raise unbacked.missing_shape_env(func, format_frame(user_frame())) from e
            refusal = refusal_for(e, self.describe(), func, format_frame(user_frame()))
            if refusal is None:
                raise  # the user's own, or eager's: unchanged
            raise refusal from e
        written = tuple(t for t, v in zip(tensors, versions, strict=True) if version_of(t) != v)
        located = messages.op_recorded() if setitem or issubclass(type(result), torch.Tensor) or \
            any_leaf(is_tensor, result) or written else ()
        if setitem:
            recorder.note_mutation(recorder.record(operator.setitem, args, kwargs, None), written or (args[0],))
            return result
        if issubclass(type(result), torch.Tensor) or any_leaf(is_tensor, result) or written:
            if self.handler_stop is not None:  # (an op inside the user's try/except: handlers)
                handlers.refuse_op_in_handler(self.describe(), self.handler_stop)
            node = recorder.record(func, args, kwargs, result, form)
            if located:  # (the warnings it gave while traced: the graph gives them from the user's line)
                node.meta["minihop_warns"] = located
            if written:
                recorder.note_mutation(node, written)
            if unbacked is not None and self.fake_mode.shape_env is not None:
                unbacked.after_op(recorder, func, result)
        else:
            self.on_query(func, args, kwargs, result)
        return result

