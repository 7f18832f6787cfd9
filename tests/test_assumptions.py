"""One assumption record (issue 28): every kind of assumption a capture makes is listed by
``explain`` (with its source line where the user's code read it), checked on a direct call
(``GuardMismatchError`` naming the place with its old and new value), and handled as eager
by ``minihop.apply`` and ``minihop.function(F, fallback="eager")`` after the change.

Each Function is written the way users write them: a global scale, a closure tensor, a branch
on a size or on data, a layout read, a run-time ``getattr``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import minihop
from minihop.errors import GuardMismatchError
from minihop.runtime.assumptions import backward_values, compile_fits

HERE = Path(__file__).read_text().splitlines()


def line_of(marker: str) -> str:
    """``line N`` of this file's only line ending in ``# marker``."""
    [n] = [i + 1 for i, text in enumerate(HERE) if text.rstrip().endswith(f"# {marker}")]
    return f"line {n}"


def r(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, requires_grad=grad)


def run_and_grads(call: Callable[..., Any], args: tuple[Any, ...]) -> tuple[torch.Tensor, list[Any]]:
    args = tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args)
    out = call(*args)
    if out.requires_grad:
        (out * torch.arange(1, out.numel() + 1, dtype=out.dtype).reshape(out.shape)).sum().backward()
    return out.detach(), [a.grad for a in args if isinstance(a, torch.Tensor)]


def same_as_eager(fn: Any, args: tuple[Any, ...], runners: tuple[Callable[..., Any], ...]) -> None:
    """Each of ``runners`` gives eager ``fn.apply``'s output and grads for ``args``."""
    expected, expected_grads = run_and_grads(fn.apply, args)
    for run in runners:
        out, grads = run_and_grads(run, args)
        torch.testing.assert_close(out, expected)
        for g, e in zip(grads, expected_grads, strict=True):
            assert (g is None) == (e is None)
            if g is not None:
                torch.testing.assert_close(g, e)


def modes(fn: Any) -> tuple[Callable[..., Any], ...]:
    """minihop.apply (strict, its own cache), and function(F, fallback='eager')."""
    return (lambda *a: minihop.apply(fn, *a), minihop.function(fn, fallback="eager"))


def warm(runners: tuple[Callable[..., Any], ...], args: tuple[Any, ...]) -> None:
    """Call each once before the change, so the change meets a cached capture."""
    for run in runners:
        run_and_grads(run, args)


def guard_with(report: Any, *parts: str) -> str:
    found = [g for g in report.guards if all(p in g for p in parts)]
    assert found, (parts, report.guards)
    return found[0]


def mismatch(cap: Any, *args: Any) -> str:
    with pytest.raises(GuardMismatchError) as info:
        cap(*args)
    return str(info.value)


SCALE = 2.0


class Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * SCALE  # forward reads SCALE

    @staticmethod
    def backward(ctx, g):
        return g * SCALE  # backward reads SCALE


class TestPythonValue:
    def test_forward_and_backward_read(self) -> None:
        global SCALE
        x = r(3)
        report = minihop.explain(Scaled, x, print_report=False)
        fwd = guard_with(report, "Python value SCALE read by forward", "2.0", line_of("forward reads SCALE"))
        bwd = guard_with(report, "SCALE read by backward", "when backward runs", line_of("backward reads SCALE"))
        assert fwd != bwd
        cap = minihop.capture(Scaled, x)
        runners = modes(Scaled)
        warm(runners, (x,))
        try:
            SCALE = 5.0
            text = mismatch(cap, x)
            assert "SCALE changed" in text and "it was 2.0, it is 5.0" in text, text
            assert line_of("forward reads SCALE") in text
            same_as_eager(Scaled, (x,), runners)
        finally:
            SCALE = 2.0

    def test_each_assumption_has_place_phase_seen_and_line(self) -> None:
        cap = minihop.capture(Scaled, r(3))
        found = {(a.place, a.phase): a for a in cap.assumptions}
        assert found["SCALE", "forward"].seen == "2.0"
        assert found["SCALE", "backward"].seen == "2.0"
        assert line_of("backward reads SCALE") in found["SCALE", "backward"].line
        assert found["grad mode", "call"].seen == "True"
        assert found["x", "call"].seen.startswith("Tensor[3] torch.float64")


class TestArguments:
    def test_shape_and_grad_mode(self) -> None:
        x = r(3)
        report = minihop.explain(Scaled, x, print_report=False)
        guard_with(report, "x: Tensor[3] torch.float64", "requires_grad=True")
        guard_with(report, "grad mode enabled == True")
        cap = minihop.capture(Scaled, x)
        text = mismatch(cap, r(4))
        assert "argument 0 (x)" in text and "captured: Tensor(shape=[3]" in text and "found:    Tensor(shape=[4]" in text
        with torch.no_grad():
            text = mismatch(cap, x)
        assert "grad mode: captured with True, called with False" in text, text
        same_as_eager(Scaled, (r(4),), modes(Scaled))

    def test_value_argument(self) -> None:
        class Power(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, p):
                ctx.save_for_backward(x)
                ctx.p = p
                return x ** p

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * ctx.p * x ** (ctx.p - 1), None

        x = r(3)
        guard_with(minihop.explain(Power, x, 2, print_report=False), "p: == 2")
        cap = minihop.capture(Power, x, 2)
        text = mismatch(cap, x, 3)
        assert "captured: 2" in text and "found:    3" in text, text
        runners = modes(Power)
        warm(runners, (x, 2))
        same_as_eager(Power, (x, 3), runners)


def make_closure() -> tuple[type, Callable[[torch.Tensor], None]]:
    w = [torch.ones(3, dtype=torch.float64)]
    weight = w[0]

    class Closure(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * weight

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def rebind(t: torch.Tensor) -> None:
        nonlocal weight
        weight = t

    return Closure, rebind


class TestLiveTensor:
    def test_closure_tensor_rebound(self) -> None:
        fn, rebind = make_closure()
        x = r(3)
        guard_with(minihop.explain(fn, x, print_report=False), "read anew each call", "weight")
        cap = minihop.capture(fn, x)
        runners = modes(fn)
        warm(runners, (x,))
        rebind(torch.full((1,), 3.0, dtype=torch.float64))
        text = mismatch(cap, x)
        assert "changed since it was captured" in text, text
        assert "it was a tensor of shape [3]" in text and "it is a tensor of shape [1]" in text, text
        same_as_eager(fn, (x,), runners)


class ByLayout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.is_contiguous():
            return x * 2
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 2


class TestLayout:
    def test_strides(self) -> None:
        x = r(3, 2)
        guard_with(minihop.explain(ByLayout, x, print_report=False), "strides of x == (2, 1)")
        cap = minihop.capture(ByLayout, x)
        t = r(2, 3).t()
        text = mismatch(cap, t)
        assert "laid out differently" in text and "strides of x were (2, 1) at capture, are (1, 3)" in text, text
        same_as_eager(ByLayout, (t,), modes(ByLayout))


class SizeBranch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.shape[0] > 4:
            return x * 2
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g


class TestShapeGuards:
    def test_dynamic_sizes(self) -> None:
        x = r(6)
        guard_with(minihop.explain(SizeBranch, x, dynamic=True, print_report=False), "dynamic sizes: ", "T[0]")
        cap = minihop.capture(SizeBranch, x, dynamic=True)
        assert cap(r(9)).shape == (9,)  # a size the guards admit
        text = mismatch(cap, r(3))
        assert "dynamic sizes outside what it was traced for" in text, text
        assert "T = [(3,)]" in text and "captured with T = [(6,)]" in text, text
        runners = (minihop.function(SizeBranch, dynamic=True), minihop.function(SizeBranch, fallback="eager",
                                                                                dynamic=True))
        warm(runners, (x,))
        same_as_eager(SizeBranch, (r(3),), runners)


class Branch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.sum() > 0:  # forward reads data
            return x * 2
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 2


class TestDataRead:
    def test_value_from_data(self) -> None:
        x = torch.ones(3, dtype=torch.float64, requires_grad=True)
        guard_with(minihop.explain(Branch, x, print_report=False), "in forward == True",
                   line_of("forward reads data"))
        cap = minihop.capture(Branch, x)
        runners = modes(Branch)
        warm(runners, (x,))
        neg = -x.detach().requires_grad_()
        text = mismatch(cap, neg)
        assert "a value its forward read from tensor data changed" in text, text
        assert "gave True at capture" in text and "gives False now" in text, text
        same_as_eager(Branch, (neg,), runners)


class Settings:
    scale = 2.0
    shift = 1.0


class TestSingleUse:
    def test_runtime_getattr(self) -> None:
        names = ["scale"]

        class ByName(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * getattr(Settings, names[0])  # run-time getattr

            @staticmethod
            def backward(ctx, g):
                return g

        x = r(3)
        guard_with(minihop.explain(ByName, x, print_report=False), "single-use", line_of("run-time getattr"))
        cap = minihop.capture(ByName, x)
        runners = modes(ByName)
        warm(runners, (x,))
        cap(x)
        names[0] = "shift"
        text = mismatch(cap, x)
        assert "single-use and has served its call" in text, text
        same_as_eager(ByName, (x,), runners)


class TestOneRecord:
    def test_fits_is_the_assumptions(self) -> None:
        """``fits`` is compiled from the assumptions: it agrees with each assumption's own
        check on calls that break one of them, and on one that breaks none."""
        global SCALE
        x = r(3)
        cap = minihop.capture(Scaled, x)
        calls: list[tuple[Any, ...]] = [(x,), (r(4),), (x.detach(),), (r(3, 1),)]
        for call in calls:
            each = all(a.check(call) for a in cap.assumptions if a.phase != "backward")
            assert cap.fits(call) is each and compile_fits(cap.assumptions)(call) is each, call
        try:
            SCALE = 3.0
            assert not cap.fits((x,)) and not all(a.check((x,)) for a in cap.assumptions if a.phase != "backward")
        finally:
            SCALE = 2.0

    def test_explain_lists_exactly_the_assumptions(self) -> None:
        x = r(3)
        report = minihop.explain(Scaled, x, print_report=False)
        cap = minihop.capture(Scaled, x)
        assert list(report.guards) == [a.show() for a in cap.assumptions]
        assert all(re.search(r"\S", a.description) for a in cap.assumptions)


class TestBackwardPhase:
    def test_backward_read_changed_between_forward_and_backward(self) -> None:
        """Backward's re-check is the record's: SCALE changed after forward takes eager's value
        in backward (a bwd traced again), in strict direct calls and both modes."""
        global SCALE
        x = r(3)
        cap = minihop.capture(Scaled, x)
        [value] = backward_values(cap.assumptions)
        assert (value.place, value.key) == ("SCALE", cap._function.backwards.state_base[0])
        runners = (cap, *modes(Scaled))
        for run in runners:
            mine, eager = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
            try:
                out_m, out_e = run(mine), Scaled.apply(eager)
                SCALE = 7.0
                out_m.sum().backward()
                out_e.sum().backward()
            finally:
                SCALE = 2.0
            torch.testing.assert_close(mine.grad, eager.grad)
            torch.testing.assert_close(mine.grad, torch.full_like(x, 7.0))

    def test_grad_mode_read_in_backward(self) -> None:
        class ModeAware(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x * x

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                if torch.is_grad_enabled():
                    return g * 2 * x
                return g * 2 * x.detach()

        report = minihop.explain(ModeAware, r(3), print_report=False)
        guard_with(report, "backward read torch.is_grad_enabled() == False", "create_graph=True")
        x = r(3)
        for run in (minihop.capture(ModeAware, x), *modes(ModeAware)):
            mine, eager = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
            (gm,) = torch.autograd.grad(run(mine).sum(), mine, create_graph=True)
            (ge,) = torch.autograd.grad(ModeAware.apply(eager).sum(), eager, create_graph=True)
            assert gm.requires_grad == ge.requires_grad
            torch.testing.assert_close(gm, ge)
