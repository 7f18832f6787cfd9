"""The outer graph: one ``autograd_function_apply`` call on the pair, in Dynamo's layout.

Place in the pipeline: rewire (pure). It wraps a ``Pair`` into a GraphModule whose code reads
like the graphs in PyTorch's own tests (placeholders ``L_x_``, ``fwd_body_0``/``bwd_body_0``
submodules, the higher-order op call with its keyword metadata, ``getitem`` per output). The
call target is torch's own ``autograd_function_apply`` operator, so the outer graph is also
runnable by PyTorch itself: a cross-check of the pair against another implementation.

A bwd traced for values backward read from its grads or saved values holds only for those
values (the runtime picks or traces a bwd per value); in the outer graph its ``bwd_body_0``
first recomputes each value and raises ``GuardMismatchError`` for another, never giving a
stale gradient.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._functorch.autograd_function import autograd_function_apply

from ..errors import GuardMismatchError
from ..graph_names import outer_input_name
from ..spec import DataRead, Pair, same_value

__all__ = ["make_outer_graph", "value_guard", "with_value_guards"]


def value_guard(value: Any, expected: Any, what: str) -> None:
    """Raise unless ``value`` is exactly ``expected`` (a value the bwd was traced for)."""
    if not same_value(value, expected):
        raise GuardMismatchError(
            f"This bwd_body_0 was traced for {what} == {expected!r}; this backward gives {value!r}.",
            "Backward took that value into Python (a branch, a loop count): other values may "
            "take other code, which this graph does not hold.",
            "Run the Capture itself (or minihop.apply): it traces backward again for other values.")


def with_value_guards(bwd: fx.GraphModule, reads: Sequence[DataRead], num_outputs: int) -> fx.GraphModule:
    """A copy of ``bwd`` that first recomputes each value in ``reads`` (guarding backward; their
    ``bwd_inputs`` index this pair's grads and saved values) and checks it (``value_guard``)."""
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    nodes = list(bwd.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    for node in placeholders:
        env[node] = graph.node_copy(node, env.__getitem__)
    for read in reads:
        inputs = [ref if kind == "const" else env[placeholders[ref if kind == "grad" else num_outputs + ref]]
                  for kind, ref in read.bwd_inputs]
        if read.clone_inputs:  # the value's graph writes in place: never into backward's values
            inputs = [graph.call_method("clone", (v,)) if issubclass(type(v), fx.Node) else v for v in inputs]
        inner: dict[fx.Node, Any] = {}
        params = iter(inputs)
        for node in read.graph.graph.nodes:
            if node.op == "placeholder":
                inner[node] = next(params)
            elif node.op == "output":
                what = f"{read.op} in backward" + (f" ({read.line})" if read.line else "")
                graph.call_function(value_guard, (inner[node.args[0]], read.value, what))
            else:
                inner[node] = graph.node_copy(node, inner.__getitem__)
    for node in nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, env.__getitem__)
    return fx.GraphModule(bwd, graph, class_name=type(bwd).__name__)


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    return fx.GraphModule(gm, graph, class_name=type(gm).__name__)


def make_outer_graph(pair: Pair, bwd_reads: Sequence[DataRead] = ()) -> fx.GraphModule:
    """A runnable GraphModule ``(*fwd_inputs) -> (outputs...)`` calling the pair once;
    ``bwd_reads``: the values the pair's bwd was traced for (see ``with_value_guards``)."""
    root = torch.nn.Module()
    # Copies: an edit of the outer graph's bodies must not reach the pair (rewire is pure).
    root.fwd_body_0 = _copy(pair.fwd)
    root.bwd_body_0 = with_value_guards(pair.bwd, bwd_reads, len(pair.top_level)) if bwd_reads else _copy(pair.bwd)
    graph = fx.Graph()
    fwd_placeholders = [n for n in pair.fwd.graph.nodes if n.op == "placeholder"]
    inputs = []
    for node in fwd_placeholders:
        placeholder = graph.create_node("placeholder", outer_input_name(node.name), name=node.name)
        placeholder.meta = dict(node.meta)
        inputs.append(placeholder)
    fwd_body = graph.get_attr("fwd_body_0")
    bwd_body = graph.get_attr("bwd_body_0")
    call = graph.call_function(autograd_function_apply, (fwd_body, bwd_body, *inputs), pair.apply_kwargs())
    outputs = [n for n in pair.fwd.graph.nodes if n.op == "output"][0].args[0][0]
    items = []
    for i, out in enumerate(outputs):
        item = graph.call_function(operator.getitem, (call, i))
        item.meta = {"val": out.meta.get("val")} if issubclass(type(out), fx.Node) else {}
        items.append(item)
    graph.output(tuple(items))
    return fx.GraphModule(root, graph, class_name="GraphModule")
