"""A memo forward fills and backward empties (``M["tab"] = t`` in forward, ``M.pop("tab")`` in
backward), as activation-stash and checkpoint-style Functions write it: after each call the
container is as eager leaves it.

Each case runs eagerly and in strict, apply and fallback mode (``eager_modes.matches_eager``),
comparing outputs, every ``.grad`` and the container after every call, also with the caller
emptying or replacing the stash between forward and ``.backward()`` (eager's backward then
raises ``KeyError``, takes pop's default, or reads the caller's tensor).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import eager_modes
import minihop

STASH: dict[str, torch.Tensor] = {}


class PopsStash(torch.autograd.Function):
    """Forward stashes a tensor in a global dict; backward pops it (eager: the dict ends empty)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["tab"] = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * STASH.pop("tab")


class PopsWithDefault(torch.autograd.Function):
    """Backward pops with a default: a caller that emptied the stash first gets the default."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["tab"] = x.detach() + 1
        return x * 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        t = STASH.pop("tab", None)
        return g * 3 if t is None else g * t


class ReadsThenDeletes(torch.autograd.Function):
    """Backward reads the stash, then deletes the entry (``t = M[k]; del M[k]``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["tab"] = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        t = STASH["tab"]
        del STASH["tab"]
        return g * t


class ReadsWhileThere(torch.autograd.Function):
    """Backward uses the stash only while it is there (``if k in M``), and leaves it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["tab"] = x.detach() + 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * (STASH["tab"] if "tab" in STASH else 5.0)


class RebindsStash(torch.autograd.Function):
    """Backward replaces what forward stashed: no value to repeat but the traced one (refused)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        STASH["tab"] = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        t = STASH["tab"]
        STASH["tab"] = t * 0.5
        return g * t


def _args(i: int) -> tuple[torch.Tensor]:
    return (torch.arange(1.0, 4.0 + i % 2).requires_grad_(),)


def _state() -> Any:
    return sorted((k, v.tolist()) for k, v in STASH.items())


EMPTIERS = [PopsStash, PopsWithDefault, ReadsThenDeletes]


@pytest.mark.parametrize("fn_cls", EMPTIERS)
def test_memo_emptied_by_backward_matches_eager(fn_cls: type) -> None:
    """The stash is empty after every call, as in eager (was left holding forward's tensor;
    ``ReadsThenDeletes`` raised MH104 when backward ran, in fallback mode too)."""
    eager_modes.matches_eager(fn_cls, _args, state=_state, reset=STASH.clear, refusable=False)


def _cleared(i: int) -> None:
    if i == 2:
        STASH.clear()


def _replaced(i: int) -> None:
    if i == 1:
        STASH["tab"] = torch.full((3 + i % 2,), 7.0)
    if i == 3:
        STASH["tab"] = torch.ones(3 + i % 2, dtype=torch.float64)  # another dtype: another bwd


@pytest.mark.parametrize("mid", [_cleared, _replaced], ids=["cleared", "replaced"])
@pytest.mark.parametrize("fn_cls", [*EMPTIERS, ReadsWhileThere])
def test_caller_changing_the_stash_before_backward_matches_eager(fn_cls: type, mid: Any) -> None:
    """The caller empties or replaces the stash between forward and ``.backward()``: backward
    reads what is there then, as eager's does (``KeyError``, pop's default, the caller's
    tensor). Was forward's tensor, silently, for ``pop``."""
    eager_modes.matches_eager(fn_cls, _args, state=_state, reset=STASH.clear, mid=mid, refusable=False)


@pytest.mark.parametrize("fn_cls", [*EMPTIERS, ReadsWhileThere])
def test_memo_read_in_backward_is_not_traced_again(fn_cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """Backward's reads of a memo are keyed as backward found it (forward's entry there), so
    a backward that finds forward's entry again runs the captured bwd (every backward was
    traced again: the key was taken after the trace had taken forward's entry out)."""
    import minihop.tracer.trace as trace_module

    traced: list[int] = []
    rerun = trace_module.rerun_backward
    monkeypatch.setattr(trace_module, "rerun_backward", lambda *a, **k: traced.append(1) or rerun(*a, **k))
    STASH.clear()
    minihop.reset()
    f = minihop.function(fn_cls)
    for i in range(4):
        x = torch.arange(1.0, 4.0).requires_grad_()
        eager_x = x.detach().clone().requires_grad_()
        f(x).sum().backward()
        fn_cls.apply(eager_x).sum().backward()
        torch.testing.assert_close(x.grad, eager_x.grad, rtol=0, atol=0)
    assert traced == []


def test_backward_rebinding_the_stash_is_refused_or_matches() -> None:
    """Backward replaces the stashed tensor: strict refuses (MH106) or matches; fallback matches."""
    eager_modes.matches_eager(RebindsStash, _args, state=_state, reset=STASH.clear)
