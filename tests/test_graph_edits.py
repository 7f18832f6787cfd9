"""Editing a capture's graphs: one source of truth.

``cap.fwd``/``cap.bwd``/``cap.graph`` are copies: an edit (swap a node's target, ``recompile()``)
never changes what ``cap`` runs, prints or saves (before, ``cap(x)`` ran the old graph while
``print(cap)``, ``cap.graph`` and ``cap.save()`` showed the new one). ``minihop.with_graphs``
builds a capture that runs, prints and saves the edited pair, after the contract is checked.
"""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop


class Double(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def swap_mul_for_add(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    for node in gm.graph.nodes:
        if node.target is operator.mul:
            node.target = operator.add
    gm.recompile()
    return gm


def test_an_edited_copy_changes_nothing(tmp_path: Any) -> None:
    x = torch.randn(3, requires_grad=True)
    cap = minihop.capture(Double, x)
    before = str(cap)
    swap_mul_for_add(cap.fwd)
    swap_mul_for_add(cap.graph.fwd_body_0)
    assert str(cap) == before
    assert all(n.target is not operator.add for n in cap.fwd.graph.nodes)
    torch.testing.assert_close(cap(x), x * 2, rtol=0, atol=0)
    path = str(tmp_path / "cap.pt")
    cap.save(path)
    torch.testing.assert_close(minihop.load(path)(x), x * 2, rtol=0, atol=0)


def test_with_graphs_runs_prints_and_saves_the_edit(tmp_path: Any) -> None:
    x = torch.randn(3, requires_grad=True)
    cap = minihop.capture(Double, x)
    edited = minihop.with_graphs(cap, fwd=swap_mul_for_add(cap.fwd))
    out = edited(x)
    torch.testing.assert_close(out, x + 2, rtol=0, atol=0)
    assert "+ 2" in str(edited) and "+ 2" not in str(cap)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))  # bwd unchanged
    path = str(tmp_path / "edited.pt")
    edited.save(path)
    torch.testing.assert_close(minihop.load(path)(x), x + 2, rtol=0, atol=0)
    torch.testing.assert_close(cap(x), x * 2, rtol=0, atol=0)  # the original is untouched


def test_with_graphs_checks_the_contract() -> None:
    x = torch.randn(3, requires_grad=True)
    cap = minihop.capture(Double, x)
    fwd = cap.fwd
    out = [n for n in fwd.graph.nodes if n.op == "output"][0]
    (outs, saved) = out.args[0]
    placeholder = [n for n in fwd.graph.nodes if n.op == "placeholder"][0]
    out.args = ((outs, (*saved, placeholder)),)  # saves one more value than bwd takes
    fwd.recompile()
    with pytest.raises(minihop.InconsistentGraphsError):
        minihop.with_graphs(cap, fwd=fwd)
