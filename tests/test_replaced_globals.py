"""A global module replaced between calls by one of another class.

The capture's guard reads the module's tensors and attributes anew on each call; when they
are gone (the new class has no such attribute) the guard must fail -- the call is traced
again, and the user's own line meets the change exactly as eager's does -- never raise from
inside minihop's guard.
"""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.autograd import Function

import minihop


class WithWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((3,), 2.0))
        self.scale = 1.5


class WithoutWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.factor = 3.0


class OtherWithWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((3,), 5.0))
        self.scale = -1.0


MOD: torch.nn.Module = WithWeight()


class UsesGlobalModule(Function):
    @staticmethod
    def forward(ctx, x):
        return x * MOD.w * MOD.scale  # USER-LINE

    @staticmethod
    def backward(ctx, g):
        return g * 2


@pytest.fixture(autouse=True)
def _fresh() -> None:
    global MOD
    MOD = WithWeight()
    minihop.reset()


@pytest.mark.parametrize("fallback", ["raise", "eager"])
def test_replaced_by_a_class_without_the_attribute(fallback: str) -> None:
    global MOD
    run = minihop.function(UsesGlobalModule, fallback=fallback)
    x = torch.randn(3)
    torch.testing.assert_close(run(x), UsesGlobalModule.apply(x), rtol=0, atol=0)
    MOD = WithoutWeight()
    with pytest.raises(AttributeError) as eager:
        UsesGlobalModule.apply(x)
    with pytest.raises(AttributeError) as mine:
        run(x)
    assert str(mine.value) == str(eager.value)
    frames = traceback.extract_tb(mine.value.__traceback__)
    assert any(f.filename == __file__ and "USER-LINE" in (f.line or "") for f in frames), \
        "the AttributeError must come from the user's line, not minihop's guard"
    assert not any("minihop" in f.filename and "guard" in (f.name or "") for f in frames)


@pytest.mark.parametrize("fallback", ["raise", "eager"])
def test_replaced_by_another_class_with_the_attribute(fallback: str) -> None:
    global MOD
    run = minihop.function(UsesGlobalModule, fallback=fallback)
    x = torch.randn(3)
    torch.testing.assert_close(run(x), UsesGlobalModule.apply(x), rtol=0, atol=0)
    MOD = OtherWithWeight()
    torch.testing.assert_close(run(x), UsesGlobalModule.apply(x), rtol=0, atol=0)
