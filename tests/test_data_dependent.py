"""Python values a Function's forward takes out of tensor data: constants, value guards, refusals."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import minihop


def clones(*args: Any) -> tuple[Any, ...]:
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args)


def check_apply(fn_cls: type, *args: Any) -> None:
    """minihop.apply on ``args`` gives eager's outputs and every .grad, exactly."""
    mine, ref = clones(*args), clones(*args)
    out = minihop.apply(fn_cls, *mine)
    expected = fn_cls.apply(*ref)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.sum().backward()
    expected.sum().backward()
    for a, b in zip(mine, ref, strict=True):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


class SameOrNot(torch.autograd.Function):
    """torch-struct/entmax style: a special case when both inputs are equal."""

    @staticmethod
    def forward(ctx, x1, x2):
        if torch.equal(x1, x2):
            return x1 * 2
        return x1 + x2

    @staticmethod
    def backward(ctx, g):
        return g * 2, g


class ScaleByMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        scale = x.abs().max().item()
        ctx.scale = scale
        return x / scale

    @staticmethod
    def backward(ctx, g):
        return g / ctx.scale


class ClampedScale(torch.autograd.Function):
    """The max read with .item() decides a Python branch: a value read, not a symbol."""

    @staticmethod
    def forward(ctx, x):
        scale = x.abs().max().item()
        if scale < 1:
            scale = 1.0
        ctx.scale = scale
        return x / scale

    @staticmethod
    def backward(ctx, g):
        return g / ctx.scale


class SavedDim(torch.autograd.Function):
    """torch.tensor(dim) saved for backward, and dim.item() read in backward."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.save_for_backward(torch.tensor(dim))
        return x.cumsum(dim)

    @staticmethod
    def backward(ctx, g):
        (dim,) = ctx.saved_tensors
        return g.flip(dim.item()).cumsum(dim.item()).flip(dim.item()), None


class LoopCount(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        n = torch.tensor(3)
        for _ in range(int(n)):
            x = x * 2
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 8


class Branch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.sum() > 0:
            return x * 2
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 2


class GradBranch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        if g.sum() > 0:
            return g * 2
        return g


class TestConstants:
    def test_loop_count(self) -> None:
        """int(torch.tensor(3)) as a loop count is a constant: captured, no value guard."""
        check_apply(LoopCount, torch.randn(4, requires_grad=True))
        cap = minihop.capture(LoopCount, torch.randn(4))
        assert [(r.kind, r.op, r.value) for r in cap.data_reads] == [("constant", "__int__", 3)]
        assert cap._value_checks == ()

    def test_saved_dim_item_in_backward(self) -> None:
        """A constant saved for backward carries its value into backward's trace."""
        for dim in (0, 1):
            check_apply(SavedDim, torch.randn(3, 4, requires_grad=True), dim)
        cap = minihop.capture(SavedDim, torch.randn(3, 4, requires_grad=True), 1)
        assert {(r.kind, r.phase) for r in cap.data_reads} == {("constant", "backward")}


class TestValueGuards:
    def test_branch_recaptures(self) -> None:
        """`if x.sum() > 0`: each branch is captured once; a change of branch recaptures."""
        minihop.reset()
        check_apply(Branch, torch.tensor([1.0, 2.0], requires_grad=True))
        check_apply(Branch, torch.tensor([3.0, 2.0], requires_grad=True))
        assert minihop.counters()["captures"] == 1
        check_apply(Branch, torch.tensor([-1.0, -2.0], requires_grad=True))
        assert minihop.counters()["captures"] == 2
        check_apply(Branch, torch.tensor([5.0, 2.0], requires_grad=True))
        assert minihop.counters()["captures"] == 2  # the first capture serves it again

    def test_torch_equal(self) -> None:
        """torch.equal(x1, x2) special-casing: both branches equal eager."""
        minihop.reset()
        a = torch.tensor([1.0, 2.0], requires_grad=True)
        check_apply(SameOrNot, a, a.detach().clone().requires_grad_())
        check_apply(SameOrNot, a, torch.tensor([1.0, 3.0], requires_grad=True))
        assert minihop.counters()["captures"] == 2

    def test_item_branched_on_is_guarded(self) -> None:
        """x.abs().max().item() that a Python branch then reads is guarded exactly (the
        unbacked symbol falls back to a value read)."""
        minihop.reset()
        check_apply(ClampedScale, torch.tensor([1.0, -4.0], requires_grad=True))
        check_apply(ClampedScale, torch.tensor([2.0, 4.0], requires_grad=True))
        assert minihop.counters()["captures"] == 1  # same max, same capture
        check_apply(ClampedScale, torch.tensor([1.0, 2.5], requires_grad=True))
        assert minihop.counters()["captures"] == 2
        check_apply(ClampedScale, torch.tensor([0.5, 0.25], requires_grad=True))  # other branch
        assert minihop.counters()["captures"] == 3
        cap = minihop.capture(ClampedScale, torch.tensor([1.0, 2.5]))
        assert [(r.kind, r.op, r.value) for r in cap.data_reads] == [("guarded", "item", 2.5)]

    def test_capture_raises_on_changed_value(self) -> None:
        """A capture called with data that changes a guarded value raises MH301 naming it."""
        cap = minihop.capture(Branch, torch.tensor([1.0, 2.0]))
        cap(torch.tensor([4.0, 2.0]))
        with pytest.raises(minihop.GuardMismatchError,
                           match=r"^\[MH301\] Capture of Branch: a value its forward read from "
                                 r"tensor data changed: __bool__ gave True at capture .*if x\.sum\(\) > 0:"):
            cap(torch.tensor([-4.0, 2.0]))

    def test_eager_past_limit(self) -> None:
        """With fallback='eager', values past cache_limit run eagerly, still equal to eager."""
        f = minihop.function(ClampedScale, fallback="eager", cache_limit=2)
        with pytest.warns(UserWarning, match="cache_limit=2"):
            for k in range(1, 5):
                x = torch.tensor([1.0, float(k)], requires_grad=True)
                torch.testing.assert_close(f(x), ClampedScale.apply(x.detach()), rtol=0, atol=0)
        assert f.stats.captures == 2 and f.stats.eager_calls == 2


class TestRefusals:
    def test_branch_on_grad(self) -> None:
        """A branch on a grad's values in backward stays refused, teaching the ways out."""
        with pytest.raises(minihop.DataDependentError,
                           match=r"(?s)^\[MH103\] GradBranch\.backward calls __bool__.*"
                                 r"if g\.sum\(\) > 0:.*torch\._check.*fallback=\"eager\""):
            minihop.capture(GradBranch, torch.randn(3, requires_grad=True))


class TestExplain:
    def test_lists_each_value(self) -> None:
        """explain lists each data-dependent value with its handling and source line."""
        report = minihop.explain(Branch, torch.tensor([1.0, 2.0]), print_report=False)
        assert len(report.data_values) == 1
        assert report.data_values[0].startswith("__bool__ in forward == True  (value-guarded")
        assert "if x.sum() > 0:" in report.data_values[0]
        const = minihop.explain(LoopCount, torch.randn(2), print_report=False)
        assert "(constant" in const.data_values[0] and "data-dependent values" in str(const)
        refused = minihop.explain(GradBranch, torch.randn(3, requires_grad=True), print_report=False)
        assert refused.data_values[0].startswith("refused: GradBranch.backward calls __bool__")
