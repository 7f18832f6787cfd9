"""The one place minihop writes torch.fx's private fields: an adapter over ``fx.Graph``/``fx.Node``.

Place in the pipeline: beside ``structure``, below every stage (it imports nothing from
minihop). tracer and rewire build graphs node by node through ``append_node``, which calls
``insert_node``; rewire renames nodes through ``rename_node``. Everything else uses
fx's public API. Why private fields at all: ``Graph.create_node`` costs most of a capture's per
node time (a pytree walk of the arguments, the default name read off the target anew), and fx
has no public rename.

Invariant: a graph built here is the graph ``Graph.create_node`` would build (names, order,
``find_nodes``, ``len``), which ``tests/test_fxgraph.py`` checks on this torch, together with the
presence of every private field used (``PRIVATE_FIELDS``): a torch that renames one fails there,
not in a capture.
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

__all__ = ["PRIVATE_FIELDS", "append_node", "default_name", "insert_node", "rename_node"]

# Every private attribute used below, as (owner, attribute): the test checks each exists.
PRIVATE_FIELDS: tuple[tuple[type, str], ...] = (
    (fx.Graph, "_target_to_str"),
    (fx.Graph, "_graph_namespace"),
    (fx.Graph, "_insert"),
    (fx.Graph, "_find_nodes_lookup_table"),
    (fx.Graph, "_len"),
    (fx.Node, "_rename"),
)

_EMPTY_KWARGS = fx.immutable_collections.immutable_dict()


def default_name(graph: fx.Graph, target: Any) -> str:
    """The name fx gives a node calling ``target`` before it is made unique (``add``, ``sin``)."""
    return graph._target_to_str(target)


def insert_node(graph: fx.Graph, name: str, op: str, target: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> fx.Node:
    """Append a node to ``graph`` (not owned by a module) as ``create_node`` would, without its
    per-node argument walk; ``name`` is made unique in the graph's namespace first."""
    name = graph._graph_namespace.create_name(name, None)
    node = fx.Node(graph, name, op, target, args, kwargs or _EMPTY_KWARGS)
    graph._graph_namespace.associate_name_with_obj(name, node)
    graph._insert(node)
    graph._find_nodes_lookup_table.insert(node)
    graph._len += 1
    return node


def rename_node(node: fx.Node, name: str) -> None:
    """Give ``node`` the name ``name`` (made unique in its graph), as fx's own passes rename."""
    node._rename(name)


# (the target's name, whether the target is that name) -> fx's default node name for it.
_NODE_NAMES: dict[tuple[str, bool], str] = {}


def append_node(graph: fx.Graph, op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                name: str | None = None) -> fx.Node:
    """``graph.create_node(op, target, args, kwargs, name)`` for the graphs tracer and rewire
    build node by node: the same node, name and place, without what costs most of fx's own
    per node (a pytree walk of the arguments that warns of a raw SymInt, which minihop never
    passes, and reading the default name off the target anew each time). A graph owned by
    a module (which may have node hooks) goes through fx's own."""
    if graph.owning_module is not None:
        return graph.create_node(op, target, args, kwargs, name)
    if name is None:
        text = target if issubclass(type(target), str) else getattr(target, "__name__", None)
        key = (text, issubclass(type(target), str))  # a method's "__add__" reads "add", a function's not
        name = _NODE_NAMES.get(key) if issubclass(type(text), str) else None
        if name is None:
            name = default_name(graph, target)
            if issubclass(type(text), str):
                _NODE_NAMES[key] = name
    return insert_node(graph, name, op, target, args, kwargs)
