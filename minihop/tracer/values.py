"""Python values the user's code takes out of tensor data while it is traced.

Place in the pipeline: tracer, called by ``RecordingMode`` when forward or backward calls
``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, ``float(t)`` or an op whose Python result
depends on values (``torch.equal``). Fake tensors have no values, so the value is computed for
real: the recorded ops that produce the tensor (its ancestors in the graph, or the whole graph
so far when something was written in place) are copied into a small graph and run outside the
fake mode, on the real arguments of the capture (or on nothing, for a tensor made from Python
values only). The trace then continues with that Python value, and the capture records a
``DataRead``:

- ``constant``: the graph has no inputs (``torch.tensor(dim)``, ``torch.arange(n)``). Its value
  is fixed by Python values that are guarded already (arguments' values are in the call key;
  globals and class attributes through ``pystate``), so it needs no guard of its own.
- ``guarded``: the graph reads fwd inputs. The runtime runs it on every call's inputs before
  the captured forward and compares the value (exactly); a different value is a guard
  mismatch (``minihop.apply`` captures again for it).

Anything else is refused (MH103) with the line, the op and the ways out: a value read in
backward that depends on anything but constants (grads, forward's inputs), random or
uninitialised values, or a call whose real result holds tensors (a data-dependent shape).

Invariant: every Python value given to the user's code from tensor data is a ``DataRead`` of
the capture, or tracing stopped with ``DataDependentError``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.amp.autocast_mode import _enter_autocast, _exit_autocast
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import DataDependentError
from ..spec import DataRead, InputSource
from ..structure import make_getter

__all__ = ["ValueReader", "refuse_data_read"]

# Ops whose values are not a function of their inputs: random, or memory never written.
_NOT_FUNCTIONS = ("rand", "normal", "bernoulli", "multinomial", "dropout", "uniform",
                  "exponential", "cauchy", "geometric", "poisson", "empty")


def _op_name(func: Any) -> str:
    return getattr(func, "__name__", None) or str(func)


def refuse_data_read(describe: str, op: str, where: str | None, reason: str) -> DataDependentError:
    """MH103 for a value read minihop cannot answer: what, why (``reason``), the ways out."""
    return DataDependentError(
        f"{describe} calls {op}, whose result depends on tensor values.",
        f"minihop traces on fake tensors, which have no values; {reason}",
        "Compute with tensor ops instead (torch.where, masks), or state what the code relies "
        "on with torch._check and pass the number as a Python argument; or run this Function "
        "eagerly: minihop.function(F, fallback=\"eager\").",
        where=where)


class ValueReader:
    """Answers value reads for one trace (``tracing``: the trace's ``_Tracing``) and keeps the
    ``DataRead`` of each, in the order the user's code made them."""

    def __init__(self, tracing: Any, real_args: tuple[Any, ...] | None) -> None:
        self.t = tracing
        self.real_args = real_args  # None when traced from fake arguments only
        self.reads: list[DataRead] = []

    def read(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], where: str | None) -> Any:
        """The real result of ``func(*args, **kwargs)`` (fake tensors in them), or MH103."""
        t = self.t
        op = _op_name(func)
        describe = t._describe()
        phase = "forward" if t.phase == "setup_context" else t.phase
        if t.mode.autocast_nodes or any(n.target in (_enter_autocast, _exit_autocast)
                                        for n in self._recorder().graph.nodes):
            raise refuse_data_read(describe, op, where,
                                   "its value is not computed under autocast here.")
        graph, inputs_of, clone = self._graph_for(func, args, kwargs, describe, op, where)
        sources = [s for s in inputs_of if isinstance(s, InputSource)]
        if sources and phase != "forward":
            raise refuse_data_read(describe, op, where,
                                   "backward branches on values computed from grads or forward's "
                                   "inputs, which only the call itself knows.")
        if sources and self.real_args is None:
            raise refuse_data_read(describe, op, where,
                                   "this trace has no real arguments to compute it from.")
        with unset_fake_temporarily(), torch.no_grad():
            inputs = [s.value if isinstance(s, _Known) else self._real_input(s) for s in inputs_of]
            if any(v is None for v in inputs):
                raise refuse_data_read(describe, op, where,
                                       "this trace has no real arguments to compute it from.")
            if clone:
                inputs = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
            value = graph(*inputs)
        if any(isinstance(v, torch.Tensor) for v in tree_flatten(value)[0]):
            raise refuse_data_read(describe, op, where,
                                   "its result is a tensor whose shape or contents come from "
                                   "tensor values.")
        self.reads.append(DataRead("guarded" if sources else "constant", phase, op, value,
                                   where, graph if sources else None, tuple(sources), clone))
        return value

    def _recorder(self) -> Any:
        return self.t.fwd if self.t.phase != "backward" else self.t.bwd

    def _real_input(self, source: InputSource) -> Any:
        if source.live is not None:
            value = source.live()
        elif source.path is None:
            value = source.constant
        else:
            value = make_getter(source.path)(self.real_args, {})
        if isinstance(value, FakeTensor):
            return None  # traced from fake arguments: no values (refused by the caller)
        if source.dim is not None:
            return value.size(source.dim)
        return value.detach() if isinstance(value, torch.Tensor) else value

    def _graph_for(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], describe: str,
                   op: str, where: str | None) -> tuple[fx.GraphModule, list[Any], bool]:
        """A graph computing ``func(*args, **kwargs)`` from the recorded ops, its inputs'
        sources, and whether it writes in place."""
        t = self.t
        backward = t.phase == "backward"
        rec = t.bwd if backward else t.fwd

        def node_of(value: Any) -> Any:
            if not isinstance(value, FakeTensor):
                return value
            if backward:
                node = rec.node_of.get(id(value))
                if node is not None:
                    return node
                if id(value) in t.grad_of:
                    raise refuse_data_read(describe, op, where,
                                           "backward branches on the values of a grad.")
                # A forward value backward has not used: read it without saving it.
                return _Forward(t.fwd.node_for(value))
            return rec.node_for(value)

        mapped = tree_map(node_of, (args, kwargs))
        graph = fx.Graph()
        env: dict[fx.Node, Any] = {}
        sources: list[Any] = []
        leaves = tree_flatten(mapped)[0]
        clone = self._copy_nodes(rec, [n for n in leaves if isinstance(n, fx.Node)], graph, env,
                                 describe, op, where, sources, backward)

        def graph_value(value: Any) -> Any:
            if isinstance(value, fx.Node):
                return env[value]
            if isinstance(value, _Forward):
                sources.append(_Known(self._constant_of(value.node, describe, op, where)))
                return graph.placeholder(f"forward_{len(sources)}")
            return value

        call_args, call_kwargs = tree_map(graph_value, mapped)
        result = graph.create_node("call_function", func, tuple(call_args), dict(call_kwargs))
        graph.output(result)
        return fx.GraphModule(torch.nn.Module(), graph), sources, clone

    def _copy_nodes(self, rec: Any, roots: list[fx.Node], graph: fx.Graph, env: dict[fx.Node, Any],
                    describe: str, op: str, where: str | None, sources: list[Any],
                    backward: bool) -> bool:
        """Copy the recorded ops ``roots`` need into ``graph`` (``env``: old node -> new);
        returns whether they write in place. Placeholders become inputs (forward: their
        sources) or, in backward, constants of forward's values."""
        needed: set[fx.Node] = set()
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n not in needed:
                needed.add(n)
                stack.extend(n.all_input_nodes)
        writes = any(n.meta.get("minihop_mutates") for n in rec.graph.nodes)
        for n in rec.graph.nodes:
            if writes and n.op == "call_function" and n.target is torch._C._set_grad_enabled:
                continue
            if not (n in needed or (writes and n.op != "output")):
                continue
            if n.op == "call_function" and any(s in _op_name(n.target) for s in _NOT_FUNCTIONS) or \
                    n.op == "call_method" and any(s in str(n.target) for s in _NOT_FUNCTIONS):
                raise refuse_data_read(describe, op, where,
                                       f"it is computed from {_op_name(n.target)}, whose values "
                                       "are random or unwritten, not known at capture.")
            if n.op == "placeholder":
                if backward:
                    fwd_node = self._saved_fwd_node(n)
                    if fwd_node is None:
                        raise refuse_data_read(describe, op, where,
                                               "backward branches on the values of a grad.")
                    sources.append(_Known(self._constant_of(fwd_node, describe, op, where)))
                else:
                    sources.append(self.t.placeholder_sources[n])
                env[n] = graph.placeholder(n.name)
                continue
            env[n] = graph.node_copy(n, lambda a: env[a])
        return writes

    def _saved_fwd_node(self, bwd_placeholder: fx.Node) -> fx.Node | None:
        for bwd_node, fwd_node in self.t.bwd_saved:
            if bwd_node is bwd_placeholder:
                return fwd_node
        return None

    def _constant_of(self, fwd_node: fx.Node, describe: str, op: str, where: str | None) -> Any:
        """The real value of a forward node computed from Python values only (backward reads a
        forward value: only a constant is known without the call's inputs)."""
        graph = fx.Graph()
        env: dict[fx.Node, Any] = {}
        sources: list[Any] = []
        self._copy_nodes(self.t.fwd, [fwd_node], graph, env, describe, op, where, sources, False)
        if sources:
            raise refuse_data_read(describe, op, where,
                                   "backward branches on values computed from forward's inputs, "
                                   "which only the call itself knows.")
        graph.output(env[fwd_node])
        with unset_fake_temporarily(), torch.no_grad():
            return fx.GraphModule(torch.nn.Module(), graph)()


class _Known:
    """An input of a value's graph known at capture (a forward constant backward reads)."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _Forward:
    """A forward value backward reads for its data only (not saved: only a constant is)."""

    def __init__(self, node: fx.Node) -> None:
        self.node = node

