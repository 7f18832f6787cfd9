"""What a traced graph read of the process's settings, found in the graph itself.

Place in the pipeline: runtime (``backwards`` and ``assumptions`` ask it of a capture's bwd). A
read the trace cannot see as a call (the default dtype, read inside torch's factory ops) is
found from what the ops made; one it can (``torch.is_grad_enabled()``) from the node the
tracer marked.
"""

from __future__ import annotations

import weakref

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from ..spec import READS_GRAD_MODE

__all__ = ["applied_functions", "reads_default_dtype", "reads_grad_mode"]


def reads_default_dtype(graph: fx.Graph, dtype: torch.dtype) -> bool:
    """Whether an op of ``graph`` (traced under default dtype ``dtype``) may have read it: it
    makes a tensor of that dtype (or its complex twin) from none of it (``torch.ones(n)``, an
    int tensor times a float), or runs a subgraph of its own. (Asked twice per capture, by the
    pipeline and the runtime: answered once per graph.)"""
    found = _ANSWERS.get(graph)
    if found is None or found[0] is not dtype:
        found = _ANSWERS[graph] = (dtype, _reads(graph, dtype))
    return found[1]


_ANSWERS: weakref.WeakKeyDictionary[fx.Graph, tuple[torch.dtype, bool]] = weakref.WeakKeyDictionary()


def _reads(graph: fx.Graph, dtype: torch.dtype) -> bool:
    made = {dtype, torch.complex128 if dtype == torch.float64 else torch.complex64}
    for node in graph.nodes:
        if node.op == "placeholder" or node.op == "output":
            continue
        if issubclass(type(node.target), torch._ops.HigherOrderOperator):
            return True
        val = node.meta.get("val")
        outs = (val,) if issubclass(type(val), torch.Tensor) else tree_leaves(val) if issubclass(type(val), (tuple, list)) else ()
        if any(issubclass(type(v), torch.Tensor) and v.dtype in made for v in outs) and not any(
                getattr(a.meta.get("val"), "dtype", None) in made for a in node.all_input_nodes):
            return True
    return False


def reads_grad_mode(graph: fx.Graph) -> bool:
    """Whether the user's backward read ``torch.is_grad_enabled()`` where it was entered (the
    graph, not ``Pair.bwd``: that GraphModule is built on first use, and a capture may never
    need it)."""
    return any(node.meta.get(READS_GRAD_MODE) for node in graph.nodes)


def applied_functions(graph: fx.Graph) -> list[str]:
    """The other Functions the user's backward applied (``tracer.grad_modes.watching_applies``:
    their forward's nodes are marked): under ``create_graph`` eager's double backward calls
    their backward, where this graph's ops would be differentiated."""
    return sorted({m for node in graph.nodes if issubclass(type(m := node.meta.get(READS_GRAD_MODE)), str)})
