"""A backward traced again for one call (the caller changed a value it reads between forward
and ``.backward()``) whose Python writes minihop cannot repeat on later calls (an object
appended to a log, a record kept): the trace ran the user's backward on this call's real
Python state, so its writes are this call's, as eager's are. They stay made, and the trace
serves that call only (``spec.ServedOnce``: never filed for another backward).

Before, strict mode and ``fallback="eager"`` alike raised MH106 when backward ran, where eager
raised nothing (fallback has no eager backward to fall back to once forward ran captured).
Each case runs eagerly and in strict, apply and fallback mode, comparing outputs, every
``.grad`` and the Python state after every call (``eager_modes.matches_eager``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import eager_modes

FLAGS = {"audit": False}
AUDIT: list[Any] = []


@dataclasses.dataclass
class Entry:
    """A record a backward keeps (an object: minihop cannot repeat its creation)."""

    size: int
    norm: float


class AuditsWhenAsked(torch.autograd.Function):
    """Backward keeps a record object when the caller turned auditing on before ``.backward()``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"]:
            AUDIT.append(Entry(int(g.shape[0]), float(g.norm())))
        return g * 2


class AuditsAndCounts(torch.autograd.Function):
    """The same, with a counter (replayable) and a dict of objects (not) in one backward."""

    calls = 0

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.n = x.shape[0]
        return x.sin()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        AuditsAndCounts.calls += 1
        if FLAGS["audit"]:
            AUDIT.append({"n": ctx.n, "entry": Entry(ctx.n, 0.0)})
        return g * 3


def _reset() -> None:
    FLAGS["audit"] = False
    AUDIT.clear()
    AuditsAndCounts.calls = 0


def _state() -> Any:
    return (AuditsAndCounts.calls, repr(AUDIT))


def _args(i: int) -> tuple[torch.Tensor]:
    return ((torch.arange(1.0, 4.0) * (i + 1)).requires_grad_(),)


@pytest.mark.parametrize("fn_cls", [AuditsWhenAsked, AuditsAndCounts])
@pytest.mark.parametrize("on", [(2,), (1, 3)], ids=["once", "twice"])
def test_backward_writes_it_cannot_repeat_stay_made_for_its_call(fn_cls: type, on: tuple[int, ...]) -> None:
    """The flag is off when forward runs (the capture's backward keeps no record) and on
    before ``.backward()`` of some calls: those backwards keep eager's records. (A flag on
    when forward is traced makes the trace's own backward keep one: refused, MH106; with
    ``fallback="eager"`` that call runs eagerly.)"""
    eager_modes.matches_eager(fn_cls, _args, mid=lambda i: FLAGS.update(audit=i in on), state=_state,
                              reset=_reset, between=lambda i: FLAGS.update(audit=False),
                              refusable=False, steps=5)


def test_twice_differentiated_with_retain_graph() -> None:
    """Two backwards of one call (``retain_graph=True``): each keeps its record, as in eager."""
    eager_modes.matches_eager(AuditsWhenAsked, _args, mid=lambda i: FLAGS.update(audit=i == 1),
                              between=lambda i: FLAGS.update(audit=False), state=_state, reset=_reset,
                              refusable=False, backwards=2)


class LogsItsSize(torch.autograd.Function):
    """Backward logs its grad's size (a Python int from a size) when the caller asks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"]:
            AUDIT.append(int(g.shape[0]))
        return g * 2


@pytest.mark.parametrize("mode", ["strict", "fallback"])
def test_size_read_by_backward_traced_again_under_dynamic_sizes_is_refused(mode: str) -> None:
    """Sizes change between calls (automatic dynamic shapes), and backward, traced again for
    a call, takes a Python int from a size: the trace sees the capture's size, not the call's
    (it logged 4 where eager logs 3, in strict and fallback mode alike). Now a coded refusal
    when backward runs in strict mode (MH104); under fallback="eager" the user's backward runs
    eagerly for that call, on a ctx rebuilt for it, and logs 3 with eager's gradient."""
    import minihop

    _reset()
    call = minihop.function(LogsItsSize, fallback="eager" if mode == "fallback" else "raise")
    for i in range(3):
        x = torch.arange(1.0, 4.0 + i % 2).requires_grad_()
        y = call(x)
        FLAGS["audit"] = i == 2
        if i < 2:
            y.sum().backward()
            continue
        if mode == "strict":
            with pytest.raises(minihop.MinihopError, match="Python value from a dynamic size"):
                y.sum().backward()
            assert AUDIT == []  # nothing logged with another call's size
        else:
            y.sum().backward()
            assert AUDIT == [3]  # the call's size, as eager logs it
            assert torch.equal(x.grad, torch.full((3,), 2.0))  # backward returns g * 2


class ChecksItsSize(torch.autograd.Function):
    """Backward branches on a size in a way every size answers alike (``n >= 0``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"] and g.shape[0] >= 0:
            AUDIT.append("seen")
        return g * 2


def test_size_answer_every_size_shares_is_not_refused() -> None:
    """A Python answer from a dynamic size that holds for every size (its own bounds decide it)
    is the call's answer too: traced again, backward matches eager in every mode."""
    eager_modes.matches_eager(ChecksItsSize, lambda i: (torch.arange(1.0, 4.0 + i % 2).requires_grad_(),),
                              mid=lambda i: FLAGS.update(audit=i == 2), state=_state, reset=_reset,
                              refusable=False, steps=5)


class WarnsWhenAsked(torch.autograd.Function):
    """Backward warns and logs, with the grad's norm, when the caller asks before ``.backward()``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FLAGS["audit"]:
            import warnings
            warnings.warn(f"grad norm {float(g.norm()):.3f}")
            eager_modes.LOG.info("backward of %d", g.shape[0])
        return g * 2


@pytest.mark.parametrize("on", [(2,), (1, 2, 3)], ids=["once", "thrice"])
def test_messages_of_a_backward_traced_again_are_sent_for_its_call(on: tuple[int, ...]) -> None:
    """The warning and the log line are sent when that backward runs, with its values, as
    eager sends them (was MH106 when backward ran, in fallback mode too)."""
    eager_modes.matches_eager(WarnsWhenAsked, _args, mid=lambda i: FLAGS.update(audit=i in on),
                              between=lambda i: FLAGS.update(audit=False), state=_state, reset=_reset,
                              refusable=False, steps=5)
