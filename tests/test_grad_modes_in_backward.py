"""The user's grad-mode switches inside backward, under ``create_graph=True`` (double backward).

Issue 29: backward is traced with grad off, so a ``torch.no_grad()`` block there switched
nothing and was not recorded; under ``create_graph=True`` (grad on, as eager runs backward then)
the block's ops were differentiated again, and the end of an ``enable_grad()`` block turned
grad off for the rest of backward. ``tracer/grad_modes.py`` records them as eager acts in both
modes. Each case compares with eager ``F.apply``: the first-order gradient (plain and with
``create_graph``), whether it requires grad, the second derivative, and grad mode after the
call -- in strict ``minihop.function(F)``, ``fallback="eager"`` and ``minihop.apply``, over
several sizes (the automatic dynamic cache makes them symbolic by the last calls).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop

SIZES = (3, 5, 7)


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    torch.manual_seed(0)
    minihop.reset()
    yield
    torch.set_grad_enabled(True)


class NoGradBlock(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        with torch.no_grad():
            s = x * 3  # a constant to double backward, in eager
        return g * 2 * x + s * x


class EnableGradBlock(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        with torch.enable_grad():
            c = x.cos()
        return g * c * x  # after the block: differentiated again under create_graph


class SetGradOffCall(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        a = g * x * x
        torch.set_grad_enabled(False)  # a function call: off for the rest of backward
        return a + x * 3


class SetGradOffBlock(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        with torch.set_grad_enabled(False):
            scale = (w * w).sum()
        return g * w * scale, g * x * x


@torch.no_grad()
def _detached_norm(t):
    return t.pow(2).sum().sqrt()


class DecoratedHelper(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * x.exp() / _detached_norm(x)


class Nested(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        with torch.no_grad():
            a = x * 2
            with torch.enable_grad():
                b = x.tanh()
            c = a * b
        return g * 3 * x * x + c * x


FUNCTIONS = [NoGradBlock, EnableGradBlock, SetGradOffCall, SetGradOffBlock, DecoratedHelper, Nested]


def _runners(F: type) -> dict[str, Callable[..., Any]]:
    return {"strict": minihop.function(F), "fallback": minihop.function(F, fallback="eager"),
            "apply": lambda *a: minihop.apply(F, *a)}


def _args(F: type, n: int) -> tuple[torch.Tensor, ...]:
    count = 2 if F is SetGradOffBlock else 1
    return tuple(torch.randn(n, dtype=torch.double, requires_grad=True) for _ in range(count))


def _derivatives(apply: Callable[..., Any], args: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """Everything eager fixes: first-order grads (plain and create_graph), their requires_grad,
    the second derivative where there is one, and grad mode afterwards."""
    args = tuple(a.detach().clone().requires_grad_() for a in args)
    out = apply(*args)
    plain = torch.autograd.grad(out.sum(), args)
    out = apply(*args)
    firsts = torch.autograd.grad(out.sum(), args, create_graph=True)
    differentiable = [f.requires_grad for f in firsts]
    total = sum(f.sum() for f in firsts if f.requires_grad)
    seconds = (torch.autograd.grad(total, args, allow_unused=True)
               if any(differentiable) else None)
    return {"out": out.detach(), "plain": plain, "firsts": [f.detach() for f in firsts],
            "differentiable": differentiable, "seconds": seconds,
            "grad_mode": torch.is_grad_enabled()}


def _assert_same(mine: dict[str, Any], eager: dict[str, Any]) -> None:
    assert mine["differentiable"] == eager["differentiable"]
    assert mine["grad_mode"] == eager["grad_mode"]
    torch.testing.assert_close(mine["out"], eager["out"], rtol=0, atol=0)
    torch.testing.assert_close(mine["plain"], eager["plain"])
    torch.testing.assert_close(mine["firsts"], eager["firsts"])
    if eager["seconds"] is None:
        assert mine["seconds"] is None
    else:
        assert len(mine["seconds"]) == len(eager["seconds"])
        for m, e in zip(mine["seconds"], eager["seconds"], strict=True):
            assert (m is None) == (e is None)
            if e is not None:
                torch.testing.assert_close(m, e)


@pytest.mark.parametrize("mode", ["strict", "fallback", "apply"])
@pytest.mark.parametrize("F", FUNCTIONS, ids=lambda F: F.__name__)
def test_second_derivative_as_eager(F: type, mode: str) -> None:
    run = _runners(F)[mode]
    for n in SIZES:
        args = _args(F, n)
        _assert_same(_derivatives(run, args), _derivatives(F.apply, args))
    if mode == "strict":
        assert run.stats.eager_calls == 0


def test_no_grad_block_is_recorded_in_backward() -> None:
    """The block is in the bwd graph (Dynamo's ``_set_grad_enabled`` nodes), restoring the mode
    backward was entered with."""
    cap = minihop.capture(NoGradBlock, torch.randn(4, requires_grad=True))
    code = cap.bwd.code
    assert "torch._C._set_grad_enabled(False)" in code and "torch.is_grad_enabled()" in code
    assert "_set_grad_enabled(is_grad_enabled)" in code


def test_saved_capture_keeps_the_modes() -> None:
    """A loaded capture runs the same switches (and its body's toggles are still told apart
    from the user's: it differentiates under create_graph)."""
    cap = minihop.capture(NoGradBlock, torch.randn(4, dtype=torch.double, requires_grad=True))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cap.pt")
        cap.save(path)
        loaded = minihop.load(path)
    args = _args(NoGradBlock, 4)
    _assert_same(_derivatives(loaded, args), _derivatives(NoGradBlock.apply, args))


class ReadsGradMode(Function):
    """Passes the grad mode backward runs in on as create_graph (on exactly under
    create_graph=True in eager), read where backward was entered."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        create_graph = torch.is_grad_enabled()
        with torch.enable_grad():
            xd = x.detach().requires_grad_()
            gx, = torch.autograd.grad(xd.sin() * xd, xd, g, create_graph=create_graph)
        return gx


class ReadsGradModeInBlock(Function):
    """Reads grad mode inside its own enable_grad block: True in either run."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        with torch.enable_grad():
            scale = 2.0 if torch.is_grad_enabled() else 5.0
        return g * scale * x


@pytest.mark.parametrize("mode", ["strict", "fallback", "apply"])
def test_grad_mode_read_in_backward(mode: str) -> None:
    """Read where backward was entered: the plain backward is eager's; under create_graph
    backward is traced again with grad mode on, so its first derivative has a graph and its
    second derivative is eager's (before: MH104 when backward ran, also with fallback)."""
    run = _runners(ReadsGradMode)[mode]
    for n in SIZES:
        args = _args(ReadsGradMode, n)
        _assert_same(_derivatives(run, args), _derivatives(ReadsGradMode.apply, args))
    x = torch.randn(4, dtype=torch.double, requires_grad=True)
    (mine,) = torch.autograd.grad(run(x).sum(), x)
    (eager,) = torch.autograd.grad(ReadsGradMode.apply(x).sum(), x)
    torch.testing.assert_close(mine, eager)
    (eager,) = torch.autograd.grad(ReadsGradMode.apply(x).sum(), x, create_graph=True)
    (mine,) = torch.autograd.grad(run(x).sum(), x, create_graph=True)
    assert mine.requires_grad and eager.requires_grad
    torch.testing.assert_close(mine, eager)
    assert mine.grad_fn is not None and eager.grad_fn is not None
    # An ordinary backward after a create_graph one still takes the traced bwd.
    (mine,) = torch.autograd.grad(run(x).sum(), x)
    assert not mine.requires_grad


def test_grad_mode_read_in_backward_of_a_loaded_capture() -> None:
    """A loaded capture cannot trace backward again: under create_graph its graph raises
    MH104 where backward read the mode (never another program, silently)."""
    cap = minihop.capture(ReadsGradMode, torch.randn(4, dtype=torch.double, requires_grad=True))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cap.pt")
        cap.save(path)
        loaded = minihop.load(path)
    x = torch.randn(4, dtype=torch.double, requires_grad=True)
    (mine,) = torch.autograd.grad(loaded(x).sum(), x)
    torch.testing.assert_close(mine, torch.autograd.grad(ReadsGradMode.apply(x).sum(), x)[0])
    with pytest.raises(minihop.UnsupportedOperationError,
                       match=r"\[MH104\] ReadsGradMode\.backward reads torch\.is_grad_enabled\(\) at .*"
                             r"this backward runs with grad mode on"):
        torch.autograd.grad(loaded(x).sum(), x, create_graph=True)


@pytest.mark.parametrize("mode", ["strict", "fallback", "apply"])
def test_grad_mode_read_inside_own_block(mode: str) -> None:
    """A read the user's own switch fixes is eager's in both runs: captured, no check."""
    run = _runners(ReadsGradModeInBlock)[mode]
    for n in SIZES:
        args = _args(ReadsGradModeInBlock, n)
        _assert_same(_derivatives(run, args), _derivatives(ReadsGradModeInBlock.apply, args))


class BranchesOnGradMode(Function):
    """Backward takes another formula under create_graph (a debugging switch some code keeps)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        scale = 2.0 if torch.is_grad_enabled() else 3.0
        return g * scale * x


@pytest.mark.parametrize("mode", ["strict", "fallback", "apply"])
def test_a_branch_on_the_grad_mode_in_backward_takes_eagers_branch_in_both_modes(mode: str) -> None:
    run = _runners(BranchesOnGradMode)[mode]
    for create_graph in (False, True, False, True):
        x = torch.randn(3, dtype=torch.double, requires_grad=True)
        (eager,) = torch.autograd.grad(BranchesOnGradMode.apply(x).sum(), x, create_graph=create_graph)
        (mine,) = torch.autograd.grad(run(x).sum(), x, create_graph=create_graph)
        torch.testing.assert_close(mine, eager, rtol=0, atol=0)
        assert mine.requires_grad == eager.requires_grad
        if create_graph:
            torch.testing.assert_close(torch.autograd.grad(mine.sum(), x)[0], torch.autograd.grad(eager.sum(), x)[0])
