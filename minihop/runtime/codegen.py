"""Python code to *run* an fx graph: a small emitter, used instead of building a GraphModule.

Place in the pipeline: runtime. A capture needs code for its two graphs at once, but a
``GraphModule`` (for reading: ``print_readable``, ``.code``) only when someone looks; fx's
code generator (type annotations, stack-trace comments, signature checks) is about a third of
a warm capture. This emitter writes the plain form: one line per node, every callable and
every constant that is not a plain literal passed by reference (never re-parsed from its
repr), arithmetic inlined as fx does, and each value dropped after its last use, as fx does, so
large intermediates are freed as early.

``emit(graph, skip=...)`` returns a function taking the placeholders positionally, or None when
the graph has a node this emitter does not handle (``get_attr``), for the caller to fall back
on a GraphModule.
"""

from __future__ import annotations

import functools
import linecache
import types
import math
import operator
from collections.abc import Callable
from itertools import count
from typing import Any

import torch.fx as fx

from .located import at_user_line

__all__ = ["compile_source", "emit"]

# Written as fx writes them (``a + b``, ``x[i]``): the same operations, no call overhead.
_INLINE: dict[Any, str] = {
    operator.add: "{} + {}", operator.sub: "{} - {}", operator.mul: "{} * {}",
    operator.truediv: "{} / {}", operator.floordiv: "{} // {}", operator.mod: "{} % {}",
    operator.pow: "{} ** {}", operator.matmul: "{} @ {}", operator.getitem: "{}[{}]",
    operator.neg: "-{}",
}
_files = count()


class _Unsupported(Exception):
    pass


def _holds_node(value: Any) -> bool:
    nodes: list[fx.Node] = []
    fx.map_arg(value, nodes.append)
    return bool(nodes)


class _Emitter:
    """One graph's source: lines, and the objects it refers to by name."""

    def __init__(self) -> None:
        self.consts: dict[str, Any] = {}

    def const(self, value: Any) -> str:
        key = f"_minihop_c{len(self.consts)}"
        self.consts[key] = value
        return key

    def fmt(self, value: Any) -> str:
        kind = type(value)
        if kind is fx.Node:
            return value.name
        if kind is tuple:
            return "(" + "".join(f"{self.fmt(v)}, " for v in value) + ")"
        if issubclass(type(value), list):  # fx stores lists as its immutable_list
            return "[" + ", ".join(self.fmt(v) for v in value) + "]"
        if issubclass(type(value), dict) and all(type(k) is str for k in value):
            return "{" + ", ".join(f"{k!r}: {self.fmt(v)}" for k, v in value.items()) + "}"
        if value is None or kind in (bool, int, str):
            return repr(value)
        if kind is float and math.isfinite(value):
            return repr(value)
        if _holds_node(value):
            raise _Unsupported  # a container fx knows and this emitter does not
        return self.const(value)  # dtypes, devices, slices, inf, callables, ...

    def lines(self, nodes: list[fx.Node], skip: Callable[[fx.Node], bool], name: str,
              params: list[fx.Node] | None, output: Any) -> list[str]:
        last_use: dict[fx.Node, fx.Node] = {}
        for node in nodes:
            for used in node.all_input_nodes:
                last_use[used] = node
        frees: dict[fx.Node, list[str]] = {}
        for used, user in last_use.items():
            frees.setdefault(user, []).append(used.name)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        if params is None:
            params = placeholders
        elif sorted(params, key=placeholders.index) != placeholders:
            raise ValueError("emit: params must be the graph's placeholders, in any order")
        lines = [f"def {name}({', '.join(p.name for p in params)}):"]
        for node in nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                lines.append(f"    return {self.fmt(node.args[0] if output is None else output)}")
                break
            if skip(node):
                if node.users:
                    raise ValueError(f"emit: skipped node {node.name} has users")
                continue
            args = [self.fmt(a) for a in node.args]
            kwargs = [f"{k}={self.fmt(v)}" for k, v in node.kwargs.items()]
            warns = node.meta.get("minihop_warns")
            if warns and node.op in ("call_function", "call_method"):
                # An op that warned while traced: called from the user's line, so that its
                # warning is located (and remembered by the ``default`` filter) as eager's.
                _, _, filename, line, module = warns[0]
                callee = self.const(node.target) if node.op == "call_function" else f"{args.pop(0)}.{node.target}"
                expr = f"{self.const(at_user_line(filename, line, module))}({', '.join([callee] + args + kwargs)})"
            elif node.op == "call_function":
                inline = _INLINE.get(node.target)
                if inline is not None and not kwargs and inline.count("{}") == len(args):
                    expr = "(" + inline.format(*args) + ")"
                else:
                    expr = f"{self.const(node.target)}({', '.join(args + kwargs)})"
            elif node.op == "call_method":
                expr = f"{args[0]}.{node.target}({', '.join(args[1:] + kwargs)})"
            else:
                raise _Unsupported  # get_attr, call_module: not in minihop's pairs
            lines.append(f"    {node.name} = {expr}" if node.users else f"    {expr}")
            for dead in frees.get(node, ()):
                lines.append(f"    {dead} = None")
        return lines


@functools.lru_cache(maxsize=1024)
def _compiled(source: str, name: str) -> types.CodeType:
    """``source`` compiled, once per distinct source: captures of one Function for other
    shapes (or again) emit the same code, and compiling is a tenth of a small capture. The
    constants it names come from each emit's own namespace."""
    filename = f"<minihop {name} {next(_files)}>"
    # Registered so that tracebacks through the generated code show its lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    return compile(source, filename, "exec")


def emit(graph: fx.Graph, *, skip: Callable[[fx.Node], bool] = lambda node: False,
         name: str = "graph", params: list[fx.Node] | None = None,
         output: Any = None) -> Callable[..., Any] | None:
    """Compile ``graph`` (minus the nodes ``skip`` selects, which must have no users).

    ``params`` takes the placeholders in another order; ``output`` returns another structure
    of the graph's values than its output node's (both for calling conventions the runtime
    chooses, e.g. saved values in the order the user saved them).
    """
    emitter = _Emitter()
    try:
        lines = emitter.lines(list(graph.nodes), skip, name, params, output)
    except _Unsupported:
        return None
    source = "\n".join(lines) + "\n"
    namespace: dict[str, Any] = dict(emitter.consts)
    exec(_compiled(source, name), namespace)
    function: Callable[..., Any] = namespace[name]
    return function


def compile_source(source: str, name: str, namespace: dict[str, Any], label: str) -> Callable[..., Any]:
    """The function ``name`` that ``source`` defines, compiled once per distinct source (as
    ``emit``'s code; ``label`` names it in tracebacks), over the objects in ``namespace``."""
    scope = dict(namespace)
    exec(_compiled(source, label), scope)
    function: Callable[..., Any] = scope[name]
    return function
