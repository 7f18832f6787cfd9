"""``minihop.testing.assert_pair_matches_eager`` and the seeding of ``assert_matches_eager``.

The pair helper runs another system's fwd/bwd pair on the fwd inputs in the graph contract's
order and compares it with eager ``F.apply``: it passes for torch.compile's bodies (lifted
inputs, unused arguments, non-differentiable outputs, random draws included), and fails, saying
why, for a pair that computes other grads, takes its inputs in another order, takes another
number of inputs, or breaks the contract.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import minihop
from minihop import demo
from minihop.testing import assert_matches_eager, assert_pair_matches_eager, dynamo_graphs

W = torch.randn(3)  # a global tensor forward reads: a lifted input


class Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        mask = (torch.rand_like(x) > 0.5).to(x.dtype)
        ctx.save_for_backward(mask)
        return x * mask * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (mask,) = ctx.saved_tensors
        return grad * mask * 2


class NoisyBackward(torch.autograd.Function):
    """Draws in backward too (a stochastic straight-through estimator)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.round()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * torch.rand_like(grad)


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        return x.sin() * y.sum() + W.sum()   # x is used first: fwd inputs (x, y, W)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.saved_tensors
        return grad * x.cos() * y.sum(), torch.zeros_like(y) + (grad * x.sin()).sum()


class ScaleSwapped(torch.autograd.Function):
    """``Scale`` with its arguments the other way round: its pair takes (y, x)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        return y.sum() * x.sin() + W.sum()   # y is used first: fwd inputs (y, x, W)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.saved_tensors
        return torch.zeros_like(y) + (grad * x.sin()).sum(), grad * x.cos() * y.sum()


def scale_args() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, requires_grad=True), torch.randn(3, requires_grad=True)


class TestSeeding:
    def test_dropout_matches_eager(self) -> None:
        """Both runs draw the same mask (without the seeding the masks differ and this fails)."""
        assert_matches_eager(Dropout, torch.randn(64, requires_grad=True))
        assert_matches_eager(Dropout, torch.randn(64, requires_grad=True), seed=5)

    def test_random_backward_matches_eager(self) -> None:
        assert_matches_eager(NoisyBackward, torch.randn(64, requires_grad=True))

    def test_callers_generator_is_left_as_it_was(self) -> None:
        x = torch.randn(8, requires_grad=True)
        torch.manual_seed(123)
        expected = torch.rand(3)
        torch.manual_seed(123)
        assert_matches_eager(Dropout, x)
        assert torch.equal(torch.rand(3), expected)


class TestPairMatchesEager:
    @pytest.mark.parametrize("fn_cls, make_args", [
        (demo.MySin, lambda: (torch.randn(5, requires_grad=True),)),
        (demo.ScaleShift, lambda: (torch.randn(2, 3, requires_grad=True),
                                   demo.Affine(torch.randn(3), torch.randn(3)), torch.randn(2))),
        (demo.WithArgmax, lambda: (torch.randn(3, 4, requires_grad=True),)),
        (demo.ExpTimesAndSquare, lambda: (torch.randn(4, requires_grad=True),)),
        (Scale, scale_args),
        (Dropout, lambda: (torch.randn(32, requires_grad=True),)),
    ], ids=["MySin", "ScaleShift-lifted-unused", "WithArgmax-nondiff", "ExpTimesAndSquare", "Scale-global", "Dropout"])
    def test_torch_compile_bodies_match_eager(self, fn_cls: type, make_args: Any) -> None:
        args = make_args()
        d = dynamo_graphs(fn_cls, *args)
        comparison = assert_pair_matches_eager(fn_cls, args, d.fwd, d.bwd)
        assert comparison.capture.name == fn_cls.__name__

    def test_graphs_as_well_as_modules(self) -> None:
        args = scale_args()
        cap = minihop.capture(Scale, *args)
        assert_pair_matches_eager(Scale, args, cap.fwd.graph, cap.bwd.graph)

    def test_wrong_grads_fail(self) -> None:
        args = scale_args()
        cap = minihop.capture(Scale, *args)
        bad_bwd = torch.fx.GraphModule(torch.nn.Module(), cap.bwd.graph)
        for node in bad_bwd.graph.nodes:
            if node.op == "call_function" and node.target is torch.zeros_like:
                node.target = torch.ones_like
        bad_bwd.recompile()
        with pytest.raises(AssertionError, match=r"grad of .*Tensor-likes are not close"):
            assert_pair_matches_eager(Scale, args, cap.fwd, bad_bwd)

    def test_inputs_in_another_order_fail_naming_both(self) -> None:
        x, y = scale_args()
        swapped = minihop.capture(ScaleSwapped, y, x)   # its fwd takes (y, x)
        with pytest.raises(AssertionError, match=r"fwd input 0: the pair's placeholder l_y_ is float32\[3\], "
                                                 r"but the contract's input 0 is l_x_ .*float32\[4\]"):
            assert_pair_matches_eager(Scale, (x, y), swapped.fwd, swapped.bwd)

    def test_another_number_of_inputs_fails_naming_the_order(self) -> None:
        x = torch.randn(5, requires_grad=True)
        other = minihop.capture(Scale, *scale_args())  # three fwd inputs (x, y, the global W)
        with pytest.raises(AssertionError, match=r"takes 3 inputs .* the graph contract gives MySin 1: l_x_"):
            assert_pair_matches_eager(demo.MySin, (x,), other.fwd, other.bwd)

    def test_inconsistent_pair_is_refused(self) -> None:
        x = torch.randn(5, requires_grad=True)
        sin = minihop.capture(demo.MySin, x)
        scale = minihop.capture(Scale, *scale_args())
        with pytest.raises(minihop.InconsistentGraphsError):
            assert_pair_matches_eager(demo.MySin, (x,), sin.fwd, scale.bwd)

    def test_fwd_inputs_follow_the_contract(self) -> None:
        x, y = scale_args()
        cap = minihop.capture(Scale, x, y)
        inputs = cap.fwd_inputs(x, y)
        assert [src.name for src in cap.inputs] == ["l_x_", "l_y_", "g_W_"]
        assert inputs[0] is x and inputs[1] is y and torch.equal(inputs[2], W)
