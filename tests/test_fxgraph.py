"""minihop's writes to torch.fx's private fields (``minihop/fxgraph.py``) still mean what they meant.

If a torch release renames or reshapes one of the fields the adapter writes, these tests fail
here, naming it, before any capture builds a malformed graph: each private attribute exists, a
graph built through the adapter equals the one ``Graph.create_node`` builds (names, order,
``len``, ``find_nodes``, lint), and a rename keeps names unique. The adapter is the only module
of minihop that touches a private attribute of an fx ``Graph`` or ``Node``.
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path

import pytest
import torch
import torch.fx as fx

from minihop import fxgraph
from minihop.fxgraph import append_node

PACKAGE = Path(__file__).resolve().parents[1] / "minihop"


@pytest.mark.parametrize(("owner", "field"), fxgraph.PRIVATE_FIELDS,
                         ids=[f"{o.__name__}.{f}" for o, f in fxgraph.PRIVATE_FIELDS])
def test_private_field_exists(owner: type, field: str) -> None:
    graph = fx.Graph()
    instance = graph if owner is fx.Graph else graph.placeholder("x")
    assert hasattr(instance, field), f"torch {torch.__version__} has no {owner.__name__}.{field}"


def build(make: object) -> fx.Graph:
    graph = fx.Graph()
    add = make  # (graph, op, target, args, kwargs, name) -> node
    x = add(graph, "placeholder", "x", (), {}, None)
    y = add(graph, "placeholder", "y", (), {}, "x")           # a clashing name: made unique
    s = add(graph, "call_method", "sin", (x,), {}, None)
    m = add(graph, "call_function", operator.mul, (s, y), {}, None)
    t = add(graph, "call_function", torch.sum, (m,), {"dim": 0}, None)
    n = add(graph, "call_function", operator.mul, (t, 2), {}, "mul")  # a second "mul"
    add(graph, "output", "output", ((n,),), {}, None)
    return graph


def test_adapter_builds_what_create_node_builds() -> None:
    ours = build(lambda g, op, target, args, kwargs, name: append_node(g, op, target, args, kwargs, name))
    theirs = build(lambda g, op, target, args, kwargs, name: g.create_node(op, target, args, kwargs, name))
    ours.lint()
    assert [(n.name, n.op, n.target, str(n.args), dict(n.kwargs)) for n in ours.nodes] == \
           [(n.name, n.op, n.target, str(n.args), dict(n.kwargs)) for n in theirs.nodes]
    assert len(list(ours.nodes)) == len(list(theirs.nodes)) == 7
    assert [n.name for n in ours.find_nodes(op="placeholder")] == ["x", "x_1"]
    assert [n.name for n in ours.find_nodes(op="call_function", target=operator.mul)] == ["mul", "mul_1"]
    gm = fx.GraphModule(torch.nn.Module(), ours)
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(gm(a, b)[0], (a.sin() * b).sum(dim=0) * 2)


def test_rename_keeps_names_unique() -> None:
    graph = build(lambda g, op, target, args, kwargs, name: append_node(g, op, target, args, kwargs, name))
    sin = next(iter(graph.find_nodes(op="call_method", target="sin")))
    fxgraph.rename_node(sin, "mul")      # taken: fx makes it unique
    assert sin.name not in {"mul", "sin"} and sin.name.startswith("mul")
    fxgraph.rename_node(sin, "renamed")
    assert sin.name == "renamed"
    graph.lint()
    assert "renamed" in fx.GraphModule(torch.nn.Module(), graph).code


def test_only_the_adapter_touches_private_fx_fields() -> None:
    """No other module reads or writes ``<graph or node>._field`` for a field the adapter lists."""
    fields = {field for _, field in fxgraph.PRIVATE_FIELDS}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "fxgraph.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in fields:
                raise AssertionError(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} uses .{node.attr}; "
                                     "go through minihop/fxgraph.py")
