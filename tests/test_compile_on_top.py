"""torch.compile over code that calls minihop: no graph break (fullgraph=True), and outputs and
grads equal eager's. Under compilation minihop hands the compiler the Function itself
(``F.apply``), whichever entry point the code used.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import torch

import minihop
from shared_functions import MySin


class Scale(torch.autograd.Function):
    """Two outputs and a non-tensor argument."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor, k: float) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.k = k
        ctx.save_for_backward(x, y)
        return x * y * k, x + y

    @staticmethod
    def backward(ctx: Any, ga: torch.Tensor, gb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, y = ctx.saved_tensors
        return ga * y * ctx.k + gb, ga * x * ctx.k + gb, None


def leaves(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes]


def fresh(ts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in ts]


def program(sin: Any, scale: Any) -> Any:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = sin(x)
        r, s = scale(a, y, 0.5)
        return (r * s).sum() + a.mean()
    return f


def run(f: Any, args: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    out = f(*args)
    out.backward()
    return out.detach(), [a.grad for a in args]


EAGER = program(MySin.apply, Scale.apply)


def check(f: Any, backend: str) -> None:
    args = leaves((4, 5), (4, 5))
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    torch.testing.assert_close(run(compiled, fresh(args)), run(EAGER, fresh(args)))
    # A second call (Dynamo's cached code) and a changed shape (a recompile) still agree.
    torch.testing.assert_close(run(compiled, fresh(args)), run(EAGER, fresh(args)))
    other = leaves((3, 2), (3, 2))
    torch.testing.assert_close(run(compiled, fresh(other)), run(EAGER, fresh(other)))


@pytest.fixture(autouse=True)
def _reset() -> Any:
    torch.compiler.reset()
    minihop.reset()
    yield
    torch.compiler.reset()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
class TestCompileOnTop:
    def test_minihop_apply(self, backend: str) -> None:
        """minihop.apply inside a compiled function: fullgraph, equal to eager."""
        check(program(lambda x: minihop.apply(MySin, x), lambda *a: minihop.apply(Scale, *a)), backend)

    def test_capture(self, backend: str) -> None:
        """A Capture called inside a compiled function: fullgraph, equal to eager."""
        x, y = leaves((4, 5), (4, 5))
        sin = minihop.capture(MySin, x)
        scale = minihop.capture(Scale, x, y, 0.5)
        check(program(sin, scale), backend)

    def test_function_and_captured(self, backend: str) -> None:
        """minihop.function(F) and a @minihop.captured class inside a compiled function."""
        @minihop.captured
        class CapturedScale(Scale):
            pass

        check(program(minihop.function(MySin), CapturedScale.apply), backend)

    def test_same_code_uncompiled_uses_captures(self, backend: str) -> None:
        """The function compiled above, run without compiling, goes through minihop's captures."""
        f = program(lambda x: minihop.apply(MySin, x), lambda *a: minihop.apply(Scale, *a))
        args = leaves((4, 5), (4, 5))
        torch.testing.assert_close(run(f, fresh(args)), run(EAGER, fresh(args)))
        assert minihop.counters()["captures"] == 2
        before = minihop.counters()
        torch.compile(f, fullgraph=True, backend=backend)(*fresh(args))
        assert minihop.counters() == before  # compiled: minihop neither captured nor ran


def test_loaded_capture_under_compile_raises() -> None:
    """A capture loaded from an artifact has no Function class to hand over: minihop's error, not a wrong answer."""
    x = leaves((3,))[0]
    with tempfile.TemporaryDirectory() as d:
        minihop.capture(MySin, x).save(f"{d}/sin.mh")
        loaded = minihop.load(f"{d}/sin.mh")
    torch.testing.assert_close(loaded(x), x.sin())  # fine outside the compiler
    compiled = torch.compile(lambda t: loaded(t), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="loaded from an artifact"):
        compiled(x)
