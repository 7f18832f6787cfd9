"""State kept in a module object: the user's own module (``import cfg; cfg.step += 1``,
``cfg.last = t``) and a ``types.ModuleType`` made as a namespace.

Found from outside (a user writing a Function the way config-module code is written): the
heap watch left every module object out (``UNWATCHED``), so a counter in a user module went up
once, at capture, and never again (strict and ``fallback="eager"`` alike, no error); a tensor
memoised there by forward and read by backward was a fake tensor left in the module; a
module's *registered buffer* rebound by forward (``S.k = v`` with ``k`` in ``S._buffers``)
left a fake tensor in ``_buffers`` (the heap watched only a module's plain attributes). Each
case runs eagerly and in strict, apply and fallback mode (``eager_modes.matches_eager``):
outputs, every ``.grad`` and the module's state after every call equal eager's, or strict
refuses with a coded error; fallback always equals eager.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import eager_modes
import user_state_module as cfg

NS = types.ModuleType("minihop_test_namespace")  # a namespace module, in no file
BUF = torch.nn.Module()
BUF.register_buffer("k", None)


def _reset() -> None:
    cfg.step, cfg.scale, cfg.last = 0, 2.0, None
    cfg.HIST.clear()
    NS.__dict__.update(step=0, last=None)
    BUF.k = None


def _state() -> Any:
    return (cfg.step, cfg.scale, cfg.last, list(cfg.HIST), NS.step, NS.last, BUF.k)


def _args(i: int) -> tuple[torch.Tensor]:
    return (torch.arange(1.0, 4.0 + i % 2).requires_grad_(),)


class CountsInModule(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        cfg.step += 1
        NS.step += 1
        return x * cfg.scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        cfg.HIST.append(cfg.step)
        return g * cfg.scale


class MemoInModule(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        cfg.last = x.detach() * 2
        NS.last = x.detach() * 3
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * cfg.last + g * NS.last


class MemoInBuffer(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        BUF.k = x.detach() * 2
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * BUF.k


def _between(i: int) -> None:
    if i == 2:
        cfg.scale = 3.0  # the caller changes a setting between calls


def _mid(change: str) -> Any:
    def mid(i: int) -> None:
        if i != 2:
            return
        if change == "replaced":
            cfg.last, NS.last, BUF.k = torch.full((3,), 7.0), torch.full((3,), 5.0), torch.full((3,), 7.0)
        elif change == "cleared":
            cfg.last, NS.last, BUF.k = torch.zeros(3), torch.zeros(3), torch.zeros(3)
    return mid


def test_counters_and_settings_in_a_module_match_eager() -> None:
    eager_modes.matches_eager(CountsInModule, _args, between=_between, state=_state, reset=_reset, steps=5)


@pytest.mark.parametrize("change", ["kept", "cleared", "replaced"])
@pytest.mark.parametrize("fn_cls", [MemoInModule, MemoInBuffer], ids=["module", "buffer"])
def test_memo_in_a_module_matches_eager(fn_cls: type, change: str) -> None:
    eager_modes.matches_eager(fn_cls, _args, mid=_mid(change), state=_state, reset=_reset, steps=4)


def test_no_fake_tensor_is_left_in_a_module_buffer() -> None:
    """Refused or captured, no call leaves a fake tensor in the module (was one in ``_buffers``)."""
    import minihop

    _reset()
    call = minihop.function(MemoInBuffer)
    for i in range(3):
        x = torch.arange(1.0, 4.0 + i % 2).requires_grad_()
        try:
            call(x).sum().backward()
        except minihop.MinihopError:
            pass
        assert BUF._buffers["k"] is None or type(BUF._buffers["k"]) is torch.Tensor


class AddsToNamespace(torch.autograd.Function):
    """Forward adds a name the module did not have, then counts in it; a function defined in the
    module counts through ``global`` (its name is one place, written either way)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        NS.calls = getattr(NS, "calls", 0) + 1
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        NS.hit()
        return g * 2


exec("hits = 0\ndef hit():\n    global hits\n    hits += 1\n", NS.__dict__)


def _reset_added() -> None:
    _reset()
    NS.__dict__.pop("calls", None)
    NS.hits = 0


def test_names_added_to_a_module_and_global_writes_match_eager() -> None:
    eager_modes.matches_eager(AddsToNamespace, _args, reset=_reset_added, steps=4,
                              state=lambda: (getattr(NS, "calls", None), NS.hits))
