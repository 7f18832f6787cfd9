"""The graph contract for a forward/backward pair, checkable on anyone's graphs.

Place in the pipeline: rewire's postcondition, and a public tool (``check_consistent``) for
pairs produced by other systems (Dynamo's ``fwd_body``/``bwd_body`` included). Pure: it reads
the two GraphModules and raises ``InconsistentGraphsError`` listing every problem found.

The contract (see docs/graph_contract.md):
  (a) one bwd output per fwd input (``None`` where no gradient flows);
  (b) one bwd grad input per fwd tensor output;
  (c) fwd returns ``((outputs...), (saved...))`` and bwd takes ``(*grads, *saved)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from ..errors import InconsistentGraphsError

__all__ = ["check_consistent", "PairShape"]


@dataclasses.dataclass(frozen=True)
class PairShape:
    """What ``minihop.check_consistent`` returns for a consistent pair: ``num_inputs`` (fwd
    inputs = bwd outputs), ``num_outputs`` (fwd tensor outputs = bwd's leading grad inputs) and
    ``num_saved`` (values fwd saves = bwd's inputs after the grads)."""

    num_inputs: int
    num_outputs: int
    num_saved: int


def _graph(gm: fx.GraphModule | fx.Graph) -> fx.Graph:
    return gm if issubclass(type(gm), fx.Graph) else gm.graph


def _placeholders(gm: fx.GraphModule | fx.Graph) -> list[fx.Node]:
    return [n for n in _graph(gm).nodes if n.op == "placeholder"]


def _output_value(gm: fx.GraphModule | fx.Graph) -> Any:
    outputs = [n for n in _graph(gm).nodes if n.op == "output"]
    return outputs[0].args[0] if outputs else None


def _val(node: Any) -> Any:
    return node.meta.get("val", node.meta.get("example_value")) if issubclass(type(node), fx.Node) else None


def _same_meta(a: Any, b: Any) -> bool:
    if not (issubclass(type(a), torch.Tensor) and issubclass(type(b), torch.Tensor)):
        return True
    return a.shape == b.shape and a.dtype == b.dtype


def check_consistent(fwd: fx.GraphModule | fx.Graph, bwd: fx.GraphModule | fx.Graph) -> PairShape:
    """Check that ``fwd`` and ``bwd`` (GraphModules or graphs) form a consistent pair; return
    their counts, a ``PairShape``.

    >>> import torch, minihop
    >>> from minihop.demo import MySin
    >>> cap = minihop.capture(MySin, torch.randn(4, requires_grad=True))
    >>> minihop.check_consistent(cap.fwd, cap.bwd)
    PairShape(num_inputs=1, num_outputs=1, num_saved=1)

    Raises ``InconsistentGraphsError`` naming every violated point of the contract, with the
    expected and found counts or metadata.
    """
    problems: list[str] = []
    fwd_inputs = _placeholders(fwd)
    bwd_inputs = _placeholders(bwd)
    out = _output_value(fwd)
    if not (issubclass(type(out), (tuple, list)) and len(out) == 2
            and all(issubclass(type(part), (tuple, list)) for part in out)):
        raise InconsistentGraphsError(
            f"fwd returns {out!r}.",
            "(c) fwd must return ((outputs...), (saved...)): a pair of tuples.",
            "Rewire the forward graph's output into that form.")
    outs, saved = out
    grads_expected = len(outs) + len(saved)
    if len(bwd_inputs) != grads_expected:
        problems.append(
            f"(b)/(c) bwd takes {len(bwd_inputs)} inputs, expected {len(outs)} grads + "
            f"{len(saved)} saved = {grads_expected}")
    bwd_out = _output_value(bwd)
    if not issubclass(type(bwd_out), (tuple, list)):
        bwd_out = (bwd_out,)
    if len(bwd_out) != len(fwd_inputs):
        problems.append(
            f"(a) bwd returns {len(bwd_out)} values, expected one per fwd input "
            f"({len(fwd_inputs)}: {', '.join(n.name for n in fwd_inputs)})")
    for i, (o, g) in enumerate(zip(outs, bwd_inputs[: len(outs)])):
        if _val(g) is not None and not _same_meta(_val(o), _val(g)):
            problems.append(f"(b) grad input {i} ({g.name}) does not match fwd output {i} "
                            f"({_describe(_val(g))} vs {_describe(_val(o))})")
    for i, (s, p) in enumerate(zip(saved, bwd_inputs[len(outs):])):
        if not _same_meta(_val(s), _val(p)):
            problems.append(f"(c) saved {i}: bwd placeholder {p.name} is {_describe(_val(p))}, "
                            f"fwd saves {_describe(_val(s))}")
    for i, (x, g) in enumerate(zip(fwd_inputs, bwd_out)):
        xv, gv = _val(x), _val(g)
        if g is None or not issubclass(type(xv), torch.Tensor):
            if g is not None and xv is not None and not issubclass(type(xv), torch.Tensor):
                problems.append(f"(a) bwd output {i} is a gradient for fwd input {x.name}, "
                                f"which is a {type(xv).__name__}, not a tensor")
            continue
        if not (xv.dtype.is_floating_point or xv.dtype.is_complex):
            problems.append(f"(a) bwd output {i} is a gradient for {x.name}, an integer "
                            f"tensor ({xv.dtype}); it must be None")
        elif issubclass(type(gv), torch.Tensor) and gv.shape != xv.shape and gv.dim() < xv.dim():
            problems.append(f"(a) bwd output {i} has shape {list(gv.shape)}, fwd input "
                            f"{x.name} has {list(xv.shape)}")
    if problems:
        raise InconsistentGraphsError(
            f"The pair is inconsistent in {len(problems)} place(s):\n  - " + "\n  - ".join(problems),
            "autograd runs bwd with one grad per fwd output plus the saved values, and "
            "expects one gradient (or None) per fwd input.",
            "Fix the rewire that produced this pair; minihop's own pairs always pass.")
    return PairShape(len(fwd_inputs), len(outs), len(saved))


def _describe(v: Any) -> str:
    if issubclass(type(v), torch.Tensor):
        return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
    return type(v).__name__
