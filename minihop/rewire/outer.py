"""The outer graph: one ``autograd_function_apply`` call on the pair, in Dynamo's layout.

Place in the pipeline: rewire (pure). It wraps a ``Pair`` into a GraphModule whose code reads
like the graphs in PyTorch's own tests (placeholders ``L_x_``, ``fwd_body_0``/``bwd_body_0``
submodules, the higher-order op call with its keyword metadata, ``getitem`` per output). The
call target is torch's own ``autograd_function_apply`` operator, so the outer graph is also
runnable by PyTorch itself: a cross-check of the pair against another implementation.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._functorch.autograd_function import autograd_function_apply

from .pair import Pair

__all__ = ["make_outer_graph"]


def _outer_name(name: str) -> str:
    return "L" + name[1:] if name.startswith("l_") else name


def make_outer_graph(pair: Pair) -> fx.GraphModule:
    """A runnable GraphModule ``(*fwd_inputs) -> (outputs...)`` calling the pair once."""
    root = torch.nn.Module()
    root.fwd_body_0 = pair.fwd
    root.bwd_body_0 = pair.bwd
    graph = fx.Graph()
    fwd_placeholders = [n for n in pair.fwd.graph.nodes if n.op == "placeholder"]
    inputs = []
    for node in fwd_placeholders:
        placeholder = graph.create_node("placeholder", _outer_name(node.name), name=node.name)
        placeholder.meta = dict(node.meta)
        inputs.append(placeholder)
    fwd_body = graph.get_attr("fwd_body_0")
    bwd_body = graph.get_attr("bwd_body_0")
    kwargs: dict[str, object] = {
        "non_differentiable_idx": list(pair.non_differentiable_idx),
        "saved_for_backward_idx": list(pair.saved_for_backward_idx),
    }
    if pair.dirty_idx:
        kwargs["dirty_idx"] = list(pair.dirty_idx)
    call = graph.call_function(autograd_function_apply, (fwd_body, bwd_body, *inputs), kwargs)
    outputs = [n for n in pair.fwd.graph.nodes if n.op == "output"][0].args[0][0]
    items = []
    for i, out in enumerate(outputs):
        item = graph.call_function(operator.getitem, (call, i))
        item.meta = {"val": out.meta.get("val")} if isinstance(out, fx.Node) else {}
        items.append(item)
    graph.output(tuple(items))
    return fx.GraphModule(root, graph, class_name="GraphModule")
