"""Python values forward computes from sizes, after the automatic dynamic cache made them symbolic.

The first call is captured static; a second size makes the dimension symbolic, and from then
on ``x.shape[0]`` is a SymInt of the trace. Every number the caller receives -- returned, in a
dict, in a ``torch.Size``, in a dict set on an output, written to Python state -- must be the
call's own, of the type eager gives (``int``, ``float``, ``torch.Size``), and every container
a fresh object per call. Each case runs sizes 3, 5, 7, 9 through eager ``F.apply``, strict
``minihop.function(F)`` and ``minihop.function(F, fallback="eager")``; outputs, their types
and every ``.grad`` are compared.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.testing import clone_args

SIZES = (3, 5, 7, 9)
MODES = {"strict": {}, "fallback": {"fallback": "eager"}}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch.manual_seed(0)
    minihop.reset()


def same(eager: Any, mine: Any, where: str = "output") -> None:
    """Equal values of the same types, all the way down."""
    assert type(mine) is type(eager), f"{where}: eager {type(eager).__name__}, minihop {type(mine).__name__}"
    if isinstance(eager, torch.Tensor):
        torch.testing.assert_close(mine, eager, rtol=0, atol=0)
        assert mine.requires_grad == eager.requires_grad, where
        for k, v in vars(eager).items():
            same(v, vars(mine).get(k), f"{where}.{k}")
    elif isinstance(eager, (tuple, list)):
        assert len(mine) == len(eager), where
        for i, (e, m) in enumerate(zip(eager, mine, strict=True)):
            same(e, m, f"{where}[{i}]")
    elif isinstance(eager, dict):
        assert list(mine) == list(eager), where
        for k in eager:
            same(eager[k], mine[k], f"{where}[{k!r}]")
    else:
        assert mine == eager, f"{where}: eager {eager!r}, minihop {mine!r}"


def loss(out: Any) -> torch.Tensor:
    leaves = [v for v in (out if isinstance(out, (tuple, list)) else (out,))
              if isinstance(v, torch.Tensor) and v.requires_grad]
    return sum((v * (i + 1)).sum() for i, v in enumerate(leaves))  # type: ignore[return-value]


def run_sizes(fn_cls: type, make_args: Any, mode: str) -> list[Any]:
    """Every size through eager and minihop; returns minihop's outputs."""
    run = minihop.function(fn_cls, **MODES[mode])
    outs = []
    for n in SIZES:
        args = make_args(n)
        eager_args, mine_args = clone_args(args), clone_args(args)
        eager, mine = fn_cls.apply(*eager_args), run(*mine_args)
        same(eager, mine)
        loss(eager).backward()
        loss(mine).backward()
        for i, (e, m) in enumerate(zip(eager_args, mine_args, strict=True)):
            if isinstance(e, torch.Tensor) and e.requires_grad:
                torch.testing.assert_close(m.grad, e.grad, rtol=0, atol=0, msg=f"grad of argument {i}")
        outs.append(mine)
    assert run.stats.captures >= 2, "the sizes never made a symbolic capture"
    return outs


def vec(n: int) -> tuple[torch.Tensor]:
    return (torch.randn(n, requires_grad=True),)


class ReturnsSize(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, x.shape[0]

    @staticmethod
    def backward(ctx, g, _n):
        return g * 2


class ReturnsHalf(Function):
    @staticmethod
    def forward(ctx, x):
        k = x.shape[0]
        return x * 2, k / 2, k // 2, float(k) * 1.5

    @staticmethod
    def backward(ctx, g, *_):
        return g * 2


class ReturnsDict(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, {"n": x.shape[0], "half": x.shape[0] / 2, "list": [x.shape[0], 1]}

    @staticmethod
    def backward(ctx, g, _d):
        return g * 2


class ReturnsShape(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, x.shape, x.size()

    @staticmethod
    def backward(ctx, g, *_):
        return g * 2


class SetsInfo(Function):
    @staticmethod
    def forward(ctx, x):
        y = x * 2
        y.info = {"n": x.shape[0], "shape": list(x.shape)}
        return y

    @staticmethod
    def backward(ctx, g):
        return g * 2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn_cls", [ReturnsSize, ReturnsHalf, ReturnsDict, ReturnsShape, SetsInfo])
def test_numbers_from_sizes_are_the_calls(fn_cls: type, mode: str) -> None:
    run_sizes(fn_cls, vec, mode)


@pytest.mark.parametrize("mode", MODES)
def test_a_symbolic_size_is_never_returned(mode: str) -> None:
    outs = run_sizes(ReturnsSize, vec, mode)
    assert [type(n) for _, n in outs] == [int] * len(SIZES)
    assert [n for _, n in outs] == list(SIZES)


@pytest.mark.parametrize("mode", MODES)
def test_a_dict_set_on_an_output_is_fresh_per_call(mode: str) -> None:
    run = minihop.function(SetsInfo, **MODES[mode])
    first = run(torch.randn(3, requires_grad=True))
    first.info["n"] = 100
    first.info["shape"].append(0)
    for n in SIZES:
        assert run(torch.randn(n, requires_grad=True)).info == {"n": n, "shape": [n]}
    assert run(torch.randn(3, requires_grad=True)).info == {"n": 3, "shape": [3]}


COUNTS: dict[str, Any] = {}


class WritesSizes(Function):
    @staticmethod
    def forward(ctx, x):
        COUNTS["seen"] += x.shape[0]
        COUNTS["last"] = x.shape[0] * 2
        COUNTS["ratio"] = x.shape[0] / 4
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


@pytest.mark.parametrize("mode", MODES)
def test_sizes_written_to_python_state_are_the_calls(mode: str) -> None:
    run = minihop.function(WritesSizes, **MODES[mode])
    after: dict[str, list[Any]] = {}
    for name, call in (("eager", WritesSizes.apply), ("minihop", run)):
        COUNTS.clear()
        COUNTS.update(seen=0, last=None, ratio=None)
        states = []
        for n in SIZES:
            call(torch.randn(n, requires_grad=True))
            states.append(dict(COUNTS))
        after[name] = states
    same(after["eager"], after["minihop"], "COUNTS")


class Lin(Function):
    @staticmethod
    def forward(x, w):
        return x @ w

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w = inputs
        ctx.save_for_backward(x, w)
        ctx.n = x.shape[0]

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.t(), (x.t() @ g) * (ctx.n / ctx.n)


@pytest.mark.parametrize("mode", MODES)
def test_func_grad_after_two_sizes(mode: str) -> None:
    run = minihop.function(Lin, **MODES[mode])
    w = torch.randn(4, 3)
    for n in SIZES:
        x = torch.randn(n, 4)
        mine = torch.func.grad(lambda w: run(x, w).sum())(w)
        eager = torch.func.grad(lambda w: Lin.apply(x, w).sum())(w)
        torch.testing.assert_close(mine, eager, rtol=0, atol=0)
    assert run.stats.captures >= 2


class ReturnsAll(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, x.shape[0], x.shape[0] / 2, x.shape

    @staticmethod
    def backward(ctx, g, *_):
        return g * 2


def test_a_saved_capture_computes_its_numbers_per_call(tmp_path: Any) -> None:
    cap = minihop.capture(ReturnsAll, torch.randn(4), dynamic=True)
    path = str(tmp_path / "cap.pt")
    cap.save(path)
    loaded = minihop.load(path)
    for n in SIZES:
        x = torch.randn(n)
        same(ReturnsAll.apply(x), cap(x))
        same(ReturnsAll.apply(x), loaded(x))
