"""The heap watch walks everything a trace can reach, however deep, or refuses.

A snapshot that stopped at a depth limit left every object below it unwatched: a tensor forward
stored seven dicts down stayed a fake tensor of the trace in the caller's tree (in strict and in
fallback mode, nothing raised), and a counter there was incremented once, by the trace. Now the
walk has no depth limit (cycles are cut by identity); past ``heap.MAX_OBJECTS`` objects it stops
and the capture is refused (MH106), which ``fallback="eager"`` runs eagerly. Each case runs
against eager in strict, apply and fallback mode (``eager_modes.matches_eager``).
"""

from __future__ import annotations

import pytest
import torch

import minihop
from minihop.errors import SideEffectError
from minihop.tracer import heap
from eager_modes import matches_eager


def _x(i: int) -> torch.Tensor:
    return (torch.linspace(-1.0, 1.0, 4) + i).requires_grad_()


def _tree(depth: int) -> tuple[dict, dict]:
    root: dict = {}
    leaf = root
    for _ in range(depth):
        leaf["child"] = {"count": 0}
        leaf = leaf["child"]
    return root, leaf


def _leaf(tree: dict) -> dict:
    while "child" in tree:
        tree = tree["child"]
    return tree


class Node:
    def __init__(self, parent: "Node | None" = None) -> None:
        self.parent = parent
        self.child: Node | None = None
        self.count = 0


def _chain(depth: int) -> tuple[Node, Node]:
    root = node = Node()
    for _ in range(depth):
        node.child = Node(node)  # parent links: a cycle at every level
        node = node.child
    return root, node


DEEP: dict = {}


@pytest.mark.parametrize("depth", [3, 7, 12, 40])
@pytest.mark.parametrize("holder", ["argument dict", "global dict", "argument objects with parent links"])
@pytest.mark.parametrize("write", ["tensor", "counter"])
def test_a_write_far_down(depth: int, holder: str, write: str) -> None:
    box: dict = {}

    class Deep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, tree):
            if holder == "argument objects with parent links":
                leaf = tree
                while leaf.child is not None:
                    leaf = leaf.child
                if write == "tensor":
                    leaf.last = x * 2
                else:
                    leaf.count += 1
            else:
                leaf = _leaf(DEEP if holder == "global dict" else tree)
                if write == "tensor":
                    leaf["last"] = x * 2
                else:
                    leaf["count"] += 1
            return x.exp()

        @staticmethod
        def backward(ctx, g):
            return g * 1.5, None

    def reset() -> None:
        if holder == "argument objects with parent links":
            box["tree"], box["leaf"] = _chain(depth)
        else:
            box["tree"], box["leaf"] = _tree(depth)
            if holder == "global dict":
                DEEP.clear()
                DEEP.update(box["tree"])
                box["leaf"] = _leaf(DEEP)

    def state():
        leaf = box["leaf"]
        got = vars(leaf) if isinstance(leaf, Node) else leaf
        last = got.get("last")
        return (got.get("count"), None if last is None else last.detach())

    def make_args(i):
        return (_x(i), box["tree"] if holder != "global dict" else None)

    matches_eager(Deep, make_args, steps=3, reset=reset, state=state, refusable=False)
    DEEP.clear()


def test_more_than_the_watch_walks_is_refused_and_fallback_runs_eagerly() -> None:
    """A list of more objects than a snapshot walks: refused with where the walk stopped."""

    class Big(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, registry):
            registry[-1].count += 1
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2, None

    registry = [Node() for _ in range(heap.MAX_OBJECTS + 10)]
    with pytest.raises(SideEffectError, match=f"more than {heap.MAX_OBJECTS} objects") as info:
        minihop.function(Big)(torch.ones(3), registry)
    assert "registry[" in str(info.value)
    assert registry[-1].count == 0  # refused before it ran: nothing made
    out = minihop.function(Big, fallback="eager")(torch.ones(3), registry)
    assert out.tolist() == [2.0, 2.0, 2.0] and registry[-1].count == 1
