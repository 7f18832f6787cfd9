"""A ``GuardMismatchError`` for an argument names the part that changed, its value at capture and
now, never the key tuples (issue 28's "names the value that changed with its old and new value";
an object, module or container argument printed its whole key before round 9)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import minihop


class Cfg:
    def __init__(self) -> None:
        self.k = 2.0
        self.v = [1, 2]
        self.d = {"a": 1.0}


class Uses(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, m, s, cfg):
        return m(x) * s * cfg.k * len(cfg.v) * cfg.d["a"]

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None


def _message(change, args_of) -> str:
    mod, cfg = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1)), Cfg()
    x = torch.ones(4, requires_grad=True)
    cap = minihop.capture(Uses, x, mod, 2.0, cfg)
    change(mod, cfg)
    with pytest.raises(minihop.GuardMismatchError) as info:
        cap(*args_of(x, mod, cfg))
    text = str(info.value)
    assert "('M'" not in text and "('O'" not in text and "('V'" not in text, text
    return text.split("\n  Why:")[0].split("ones: ", 1)[1].split("\nWhy:")[0]


def _same(x, mod, cfg):
    return (x, mod, 2.0, cfg)


@pytest.mark.parametrize("change, args_of, expected", [
    (lambda m, c: setattr(m[1], "p", 0.3), _same,
     "argument 1 (m), submodule '1', attributes, p:\n  captured: 0.1\n  found:    0.3"),
    (lambda m, c: m.eval(), _same,
     "argument 1 (m), submodule '(itself)', training:\n  captured: True\n  found:    False"),
    (lambda m, c: setattr(m[0], "weight", nn.Parameter(torch.ones(4, 5))), _same,
     "argument 1 (m), tensors, 0.weight, shape:\n  captured: (4, 4)\n  found:    (4, 5)"),
    (lambda m, c: setattr(c, "k", 3.0), _same,
     "argument 3 (cfg), attributes, k:\n  captured: 2.0\n  found:    3.0"),
    (lambda m, c: c.v.append(3), _same,
     "argument 3 (cfg), attributes, v:\n  captured: [1, 2]\n  found:    [1, 2, 3]"),
    (lambda m, c: c.d.__setitem__("a", 3.0), _same,
     "argument 3 (cfg), attributes, d['a']:\n  captured: 1.0\n  found:    3.0"),
    (lambda m, c: None, lambda x, m, c: (x, m, 2, c),
     "argument 2 (s):\n  captured: 2.0 (float)\n  found:    2 (int)"),
    (lambda m, c: None, lambda x, m, c: (x, m, 2.0, (1, 2)),
     "argument 3 (cfg):\n  captured: a Cfg object (k=2.0, v=[1, 2], d={'a': 1.0})\n  found:    (1, 2)"),
], ids=["module attribute", "training", "parameter shape", "object attribute", "list grown", "dict item",
        "int for float", "another type"])
def test_the_part_that_changed_old_and_new(change, args_of, expected):
    assert _message(change, args_of) == expected
