"""Python values the user's code takes out of tensor data while it is traced.

Place in the pipeline: tracer, called by ``RecordingMode`` when forward or backward calls
``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, ``float(t)`` or an op whose Python result
depends on values (``torch.equal``). Fake tensors have no values, so the value is computed for
real: the recorded ops that produce the tensor (its ancestors in the graph, see below) are copied into a small graph and run outside the
fake mode, on the real arguments of the capture (or on nothing, for a tensor made from Python
values only). Those ops are the value's ancestors and every in-place write into the memory of
one of them (through any view), with that write's own ancestors: an unrelated random or
``empty`` op elsewhere in the graph does not make the value unknown. The trace then continues with that Python value, and the capture records a
``DataRead``:

A tensor op whose output shape depends on values (``t[mask]``, ``tensor_split(t, idx)``) on
tensors made from Python values only is run the same way (``constant_result``) and recorded
with fakes of its real shapes.

- ``constant``: the graph has no inputs (``torch.tensor(dim)``, ``torch.arange(n)``). Its value
  is fixed by Python values that are guarded already (arguments' values are in the call key;
  globals and class attributes through ``pystate``), so it needs no guard of its own.
- ``guarded``: the graph reads fwd inputs. The runtime runs it on every call's inputs before
  the captured forward and compares the value (exactly); a different value is a guard
  mismatch (``minihop.apply`` captures again for it).
- ``guarded`` in backward: the graph reads what backward receives (grads, saved values).
  Traced at capture, it is computed from the capture's arguments (forward's values, run for
  real) and grads of ones: a guess the runtime checks before each backward, on that
  backward's real grads and saved values; a backward they do not fit traces backward again
  with them (``call_data``: the real values, for the ValueReader of that trace).

Anything else is refused (MH103) with the line, the op and the ways out: random or
uninitialised values, a read in a trace without real values to compute it from
(``minihop.trace``), or a call whose real result holds tensors (a data-dependent shape).

Invariant: every Python value given to the user's code from tensor data is a ``DataRead`` of
the capture, or tracing stopped with ``DataDependentError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.amp.autocast_mode import _enter_autocast, _exit_autocast
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import DataDependentError
from ..spec import DataRead, InputSource
from ..structure import make_getter

__all__ = ["ValueReader", "refuse_data_read"]

# Ops whose values are not a function of their inputs: random, or memory never written.
_NOT_FUNCTIONS = ("rand", "normal", "bernoulli", "multinomial", "dropout", "uniform",
                  "exponential", "cauchy", "geometric", "poisson", "empty")


def ancestors(roots: list[fx.Node]) -> set[fx.Node]:
    """``roots`` and every node they are computed from."""
    found: set[fx.Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n not in found:
            found.add(n)
            stack.extend(n.all_input_nodes)
    return found


def _storages(value: Any) -> set[Any]:
    found = set()
    for leaf in tree_flatten(value)[0]:
        if issubclass(type(leaf), torch.Tensor) and leaf.layout == torch.strided:
            found.add(StorageWeakRef(leaf.untyped_storage()))
    return found


def needed_for(mutations: list[tuple[fx.Node, tuple[torch.Tensor, ...]]], roots: list[fx.Node]) -> set[fx.Node]:
    """The recorded ops ``roots``' values depend on: their ancestors, and each in-place write
    (``mutations``: node, tensors written) into the memory of a tensor among them (a write
    through a view shares its base's storage), with its own ancestors, to a fixed point.
    Writes into other memory cannot change these values."""
    needed = ancestors(roots)
    pending = [(node, _storages(written)) for node, written in mutations]
    grew = True
    while grew:
        grew = False
        storages: set[Any] = set()
        for n in needed:
            storages |= _storages(n.meta.get("val"))
        for node, written in pending:
            if node not in needed and written & storages:
                needed |= ancestors([node])
                grew = True
    return needed


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
    """Answers value reads for one trace (``tracing``: the trace's ``session.Tracing``) and keeps the
    ``DataRead`` of each, in the order the user's code made them."""

    def __init__(self, tracing: Any, real_args: tuple[Any, ...] | None) -> None:
        self.t = tracing
        self.real_args = real_args  # None when traced from fake arguments only
        # A backward traced again for one backward call: its real grads (by fwd output) and
        # saved values (by fwd node).
        self.call_data: tuple[dict[int, Any], dict[fx.Node, Any]] | None = None
        self.reads: list[DataRead] = []

    def read(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], where: str | None) -> Any:
        """The real result of ``func(*args, **kwargs)`` (fake tensors in them), or MH103."""
        t = self.t
        op = _op_name(func)
        describe = t._describe()
        phase = "forward" if t.phase == "setup_context" else t.phase
        if t.mode.autocast_nodes or any(n.target in (_enter_autocast, _exit_autocast)
                                        for n in self.t.recorder().graph.nodes):
            raise refuse_data_read(describe, op, where,
                                   "its value is not computed under autocast here.")
        graph, inputs_of, clone = self._graph_for(func, args, kwargs, describe, op, where)
        sources = [s for s in inputs_of if issubclass(type(s), InputSource)]
        received = [s for s in inputs_of if issubclass(type(s), _Received)]
        if (sources and self.real_args is None) or any(s.value is None for s in received):
            raise refuse_data_read(describe, op, where,
                                   "this trace has no real arguments to compute it from.")
        with unset_fake_temporarily(), torch.no_grad():
            inputs = [s.value if issubclass(type(s), (_Known, _Received)) else self._real_input(s)
                      for s in inputs_of]
            if any(v is None for v in inputs):
                raise refuse_data_read(describe, op, where,
                                       "this trace has no real arguments to compute it from.")
            if clone:
                inputs = [v.clone() if issubclass(type(v), torch.Tensor) else v for v in inputs]
            value = graph(*inputs)
        if any(issubclass(type(v), torch.Tensor) for v in tree_flatten(value)[0]):
            raise refuse_data_read(describe, op, where,
                                   "its result is a tensor whose shape or contents come from "
                                   "tensor values.")
        guarded = bool(sources or received)
        bwd_inputs = tuple(s.ref if issubclass(type(s), _Received) else ("const", s.value)
                           for s in inputs_of) if received else ()
        self.reads.append(DataRead("guarded" if guarded else "constant", phase, op, value,
                                   where, graph if guarded else None, tuple(sources), clone,
                                   bwd_inputs))
        return value

    def constant_result(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The result of a tensor op whose output shape depends on values (a boolean mask,
        ``tensor_split`` at a tensor's indices, ``nonzero``), as fake tensors of its real
        shapes, when its tensor arguments are computed from Python values only (guarded
        already, so every call computes the same shapes); None otherwise (or when a random or
        unwritten op is among them). The caller records the op: the graphs compute it again."""
        t = self.t
        try:
            graph, inputs_of, clone = self._graph_for(func, args, kwargs, t._describe(),
                                                      _op_name(func), None)
        except DataDependentError:
            return None
        if inputs_of:
            return None
        with unset_fake_temporarily(), torch.no_grad():
            value = graph()
        leaves = tree_flatten(value)[0]
        if not any(issubclass(type(v), torch.Tensor) for v in leaves):
            return None
        return tree_map(lambda v: t.fake_mode.from_tensor(v, static_shapes=True)
                        if issubclass(type(v), torch.Tensor) else v, value)

    def _real_input(self, source: InputSource) -> Any:
        if source.fetched:
            value = source.place.get(self.real_args)
        elif source.path is None:
            value = source.constant
        else:
            value = make_getter(source.path)(self.real_args, {})
        if issubclass(type(value), FakeTensor):
            return None  # traced from fake arguments: no values (refused by the caller)
        if source.dim is not None:
            return value.size(source.dim)
        return value.detach() if issubclass(type(value), torch.Tensor) else value

    def _graph_for(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], describe: str,
                   op: str, where: str | None) -> tuple[fx.GraphModule, list[Any], bool]:
        """A graph computing ``func(*args, **kwargs)`` from the recorded ops, its inputs'
        sources, and whether it writes in place."""
        t = self.t
        backward = t.phase == "backward"
        rec = t.bwd if backward else t.fwd

        def node_of(value: Any) -> Any:
            if not issubclass(type(value), FakeTensor):
                return value
            if backward and id(value) not in rec.node_of and id(value) not in t.grad_of:
                constant, value_of = self._forward_of(t.fwd.node_for(value), describe, op, where)
                if constant:
                    # A forward constant backward has not used: read it without saving it.
                    return _Forward(value_of)
            return rec.node_for(value)  # in backward, a grad or saved value is a placeholder

        mapped = tree_map(node_of, (args, kwargs))
        graph = fx.Graph()
        env: dict[fx.Node, Any] = {}
        sources: list[Any] = []
        leaves = tree_flatten(mapped)[0]
        clone = self._copy_nodes(rec, [n for n in leaves if issubclass(type(n), fx.Node)], graph, env,
                                 describe, op, where, sources, backward)

        def graph_value(value: Any) -> Any:
            if issubclass(type(value), fx.Node):
                return env[value]
            if issubclass(type(value), _Forward):
                sources.append(_Known(value.value_of()))
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
        needed = needed_for(rec.mutations, roots)
        writes = any(n.meta.get("minihop_mutates") for n in needed)
        for n in rec.graph.nodes:
            if n not in needed:
                continue
            if n.op == "call_function" and any(s in _op_name(n.target) for s in _NOT_FUNCTIONS) or \
                    n.op == "call_method" and any(s in str(n.target) for s in _NOT_FUNCTIONS):
                raise refuse_data_read(describe, op, where,
                                       f"it is computed from {_op_name(n.target)}, whose values "
                                       "are random or unwritten, not known at capture.")
            if n.op == "placeholder":
                if backward:
                    sources.append(self._received(n, describe, op, where))
                else:
                    sources.append(self.t.placeholder_sources[n])
                env[n] = graph.placeholder(n.name)
                continue
            env[n] = graph.node_copy(n, lambda a: env[a])
        return writes

    def _received(self, placeholder: fx.Node, describe: str, op: str, where: str | None) -> Any:
        """What a bwd placeholder holds when backward runs: a grad or saved value (``_Received``,
        with its real value for this trace when known), or a forward constant (``_Known``)."""
        t = self.t
        index = next((i for i, node in t.grad_nodes.items() if node is placeholder), None)
        if index is not None:
            if self.call_data is not None:
                return _Received(("grad", index), self.call_data[0].get(index))
            if self.real_args is None:
                return _Received(("grad", index), None)
            # Traced at capture, before any grad exists: grads of ones (what ``out.sum()``
            # gives) are the guess; the runtime checks it on each backward's real grads.
            fake = placeholder.meta["val"]
            shape = _hinted(fake.shape)
            if None in shape:
                # A data-dependent size (an output of x[mask]): the output forward really
                # computed for the capture's arguments has the grad's real shape.
                shape = tuple(self._forward_of(t.fwd_outputs[index], describe, op, where)[1]().shape)
            with unset_fake_temporarily():
                return _Received(("grad", index), torch.ones(shape, dtype=fake.dtype, device=fake.device))
        fwd_node = next((f for b, f in t.bwd_saved if b is placeholder), None)
        if fwd_node is None:
            raise AssertionError(f"minihop bug: bwd placeholder {placeholder.name} is neither a "
                                 "grad nor a saved value")
        constant, value_of = self._forward_of(fwd_node, describe, op, where)
        if constant:
            return _Known(value_of())
        if self.call_data is not None:
            return _Received(("saved", fwd_node), self.call_data[1].get(fwd_node))
        if self.real_args is None:
            return _Received(("saved", fwd_node), None)
        return _Received(("saved", fwd_node), value_of())

    def _forward_of(self, fwd_node: fx.Node, describe: str, op: str,
                    where: str | None) -> tuple[bool, Callable[[], Any]]:
        """Whether forward computed ``fwd_node`` from Python values only, and how to compute
        its real value (a constant, or from the capture's real arguments: backward traced at
        capture reads a forward value)."""
        graph = fx.Graph()
        env: dict[fx.Node, Any] = {}
        sources: list[Any] = []
        clone = self._copy_nodes(self.t.fwd, [fwd_node], graph, env, describe, op, where, sources, False)
        graph.output(env[fwd_node])

        def value_of() -> Any:
            with unset_fake_temporarily(), torch.no_grad():
                inputs = [self._real_input(s) for s in sources]
                if clone:
                    inputs = [v.clone() if issubclass(type(v), torch.Tensor) else v for v in inputs]
                # Run once: interpreted, without generating a GraphModule's code.
                return fx.Interpreter(torch.nn.Module(), graph=graph).run(*inputs)

        return not sources, value_of


def _hinted(shape: Any) -> tuple[int | None, ...]:
    """A shape's sizes as ints (a symbolic size's value at capture; None for an unbacked
    one, which has none), adding no guard."""
    return tuple(s.node.hint if issubclass(type(s), torch.SymInt) else int(s) for s in shape)


class _Known:
    """An input of a value's graph known at capture (a forward constant backward reads)."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _Received:
    """An input of a backward value's graph that backward receives: ``ref`` is
    ``("grad", i)`` or ``("saved", fwd node)``; ``value`` its real value in this trace (None:
    unknown, refused)."""

    def __init__(self, ref: tuple[str, Any], value: Any) -> None:
        self.ref = ref
        self.value = value


class _Forward:
    """A forward constant backward reads for its data only (not saved: its value is known)."""

    def __init__(self, value_of: Callable[[], Any]) -> None:
        self.value_of = value_of
