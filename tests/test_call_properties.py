"""Properties of a call that the capture's key did not hold (round 9 from outside), each against
eager in strict, apply and fallback mode (``eager_modes.matches_eager``):

- a tensor's storage offset and whether it is a view, where forward reads its layout
  (``x.storage_offset()``, ``x._is_view()``): strides alone were keyed;
- the default dtype (``torch.set_default_dtype``), which every op making a float without a dtype
  reads (``torch.ones(n)``, an int tensor times a float), at the call and when backward runs;
- autograd's own messages naming the Function (a view output modified in place, anomaly mode's
  NaN check): they named minihop's class, not the user's;
- forward-mode AD (a dual tensor, ``torch.func.jvp``): eager runs the user's ``jvp``; minihop
  raised torch's "you must implement jvp" in every mode, ``fallback="eager"`` included.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import minihop
from eager_modes import matches_eager
from minihop.errors import UnsupportedOperationError


def x_(i: int) -> torch.Tensor:
    return (torch.linspace(-1, 1, 4) + i).requires_grad_()


@pytest.fixture
def default_dtype():
    yield
    torch.set_default_dtype(torch.float32)


def test_storage_offset_read_by_forward():
    class ByOffset(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * (1 + x.storage_offset())

        @staticmethod
        def backward(ctx, g):
            return g

    def args(i):
        base = torch.randn(9)
        return (base[i % 3:i % 3 + 4].detach().requires_grad_(),)  # same strides, offsets 0, 1, 2

    matches_eager(ByOffset, args)


def test_is_view_read_by_forward():
    class ByView(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2 if x._is_view() else x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def args(i):
        base = torch.randn(4, requires_grad=True)
        return (base.view(4) if i % 2 else base * 1,)

    matches_eager(ByView, args, refusable=False)


def test_layout_mismatch_names_the_offset():
    class ByOffset(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * (1 + x.storage_offset())

        @staticmethod
        def backward(ctx, g):
            return g

    base = torch.randn(9)
    f = minihop.capture(ByOffset, base[:4].detach().requires_grad_())
    with pytest.raises(minihop.GuardMismatchError, match=r"were \(1,\) at capture, are \(1,\) at storage offset 2"):
        f(base[2:6].detach().requires_grad_())


def test_default_dtype_read_by_a_factory_in_forward(default_dtype):
    class Factory(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x + torch.ones(4).element_size() + torch.tensor(0.5).double().to(x.dtype)

        @staticmethod
        def backward(ctx, g):
            return g

    def between(i):
        torch.set_default_dtype(torch.float64 if i >= 2 else torch.float32)

    matches_eager(Factory, lambda i: (x_(i).detach().float().requires_grad_(),), between=between,
                  reset=lambda: torch.set_default_dtype(torch.float32), refusable=False)


def test_default_dtype_read_by_type_promotion(default_dtype):
    class Promote(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, n):
            return x * (n * 0.5).sum().element_size()

        @staticmethod
        def backward(ctx, g):
            return g, None

    def between(i):
        torch.set_default_dtype(torch.float64 if i % 2 else torch.float32)

    matches_eager(Promote, lambda i: (x_(i).detach().float().requires_grad_(), torch.arange(3)),
                  between=between, reset=lambda: torch.set_default_dtype(torch.float32), refusable=False)


def test_default_dtype_changed_before_backward(default_dtype):
    class BackwardFactory(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * torch.ones(4).element_size()

    def mid(i):
        torch.set_default_dtype(torch.float64 if i >= 2 else torch.float32)

    def args(i):
        torch.set_default_dtype(torch.float32)
        return (x_(i).detach().float().requires_grad_(),)

    matches_eager(BackwardFactory, args, mid=mid, reset=lambda: torch.set_default_dtype(torch.float32),
                  refusable=False)


def test_default_dtype_changed_before_a_backward_that_reads_no_global(default_dtype):
    class Promotes(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * (g.long() * 0.5).element_size()  # an int tensor times a float

    def mid(i):
        torch.set_default_dtype(torch.float64 if i >= 2 else torch.float32)

    def args(i):
        torch.set_default_dtype(torch.float32)
        return (x_(i),)

    matches_eager(Promotes, args, mid=mid, reset=lambda: torch.set_default_dtype(torch.float32),
                  refusable=False)


def test_a_backward_that_makes_no_float_runs_its_traced_bwd_directly(default_dtype):
    """The default dtype is no part of a backward whose ops make no tensor of it from none."""
    class Plain(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * x.cos()

    x = x_(0)
    f = minihop.function(Plain)
    y = f(x)
    assert "default_dtype" not in f.captures[0]._function.source
    torch.set_default_dtype(torch.float64)
    y.sum().backward()
    assert torch.equal(x.grad, x.detach().cos())


def test_default_dtype_in_explain(default_dtype):
    class Factory(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x + torch.ones(4).element_size()

        @staticmethod
        def backward(ctx, g):
            return g

    x = torch.zeros(4, requires_grad=True)
    f = minihop.capture(Factory, x)
    assert "torch.get_default_dtype() == torch.float32" in str(minihop.explain(Factory, x, print_report=False))
    torch.set_default_dtype(torch.float64)
    with pytest.raises(minihop.GuardMismatchError, match="default dtype: captured with torch.float32, called with torch.float64"):
        f(x)


def test_view_output_modified_in_place_names_the_function():
    class AsView(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view(-1)

        @staticmethod
        def backward(ctx, g):
            return g.view(2, 2)

    def call(x):
        y = AsView_apply(x)
        y.mul_(2)
        return y

    for AsView_apply in (AsView.apply, minihop.function(AsView), minihop.function(AsView, fallback="eager")):
        with pytest.raises(RuntimeError, match="Output 0 of AsView is a view and is being modified inplace"):
            call(torch.ones(2, 2, requires_grad=True) * 1)


def test_anomaly_nan_check_names_the_function():
    class MakesNan(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")

    for apply in (MakesNan.apply, minihop.function(MakesNan)):
        x = torch.ones(3, requires_grad=True)
        with pytest.warns(UserWarning), torch.autograd.set_detect_anomaly(True, check_nan=True):
            with pytest.raises(RuntimeError, match="Function 'MakesNanBackward' returned nan values in its 0th output"):
                apply(x).sum().backward()
    assert type(minihop.function(MakesNan)(x).grad_fn).__name__ == type(MakesNan.apply(x).grad_fn).__name__


class WithJvp(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * x.cos()

    @staticmethod
    def jvp(ctx, t):
        return t * 2.0  # (not sin's: the user's jvp, whatever it computes, is what eager runs)


def _dual_tangent(apply):
    with fwAD.dual_level():
        return fwAD.unpack_dual(apply(fwAD.make_dual(torch.ones(3), torch.ones(3)))).tangent


@pytest.mark.parametrize("how", ["dual tensor", "torch.func.jvp"])
def test_forward_mode_ad_strict_refuses_and_fallback_is_eager(how):
    run = _dual_tangent if how == "dual tensor" else (
        lambda apply: torch.func.jvp(apply, (torch.ones(3),), (torch.ones(3),))[1])
    eager = run(WithJvp.apply)
    assert torch.equal(eager, torch.full((3,), 2.0))
    with pytest.warns(minihop.MinihopWarning, match="dual tensor"):
        assert torch.equal(run(minihop.function(WithJvp, fallback="eager")), eager)
    for strict in (minihop.function(WithJvp), lambda x: minihop.apply(WithJvp, x)):
        with pytest.raises(UnsupportedOperationError, match="called with a dual tensor"):
            run(strict)


def test_forward_ad_level_without_a_dual_argument_is_captured():
    f = minihop.function(WithJvp)
    with fwAD.dual_level():
        x = torch.ones(3, requires_grad=True)
        out = f(x)
        assert fwAD.unpack_dual(out).tangent is None
    assert f.stats.captures == 1 and torch.equal(out, WithJvp.apply(x))
