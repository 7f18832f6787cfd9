"""Tracing that fails in minihop's own code is said, never hidden behind an eager run.

A non-minihop exception raised while a Function is traced runs it eagerly (the user's own
error: eager decides whether it is raised). Raised in minihop's own code where eager then runs
without error, it is minihop's failure: eager's values stand, and a ``MinihopWarning`` says
where, once per Function; ``counters()["internal_errors"]`` counts it, and the suite fails any test during
which one happened (``conftest.py``), so a broken capture path never passes as "matched".
"""

from __future__ import annotations

import pytest
import torch

import minihop
from minihop import cache, pipeline


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Unfinished(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError("forward is not written yet")

    @staticmethod
    def backward(ctx, g):
        return g


def test_an_error_inside_minihop_runs_eagerly_and_is_said(monkeypatch):
    # (a bug in minihop's own code: the pipeline calls what is not callable)
    monkeypatch.setattr(pipeline, "make_capture", None)
    minihop.reset()
    before = len(cache.INTERNAL_ERRORS)
    f = minihop.function(Scale)
    x = torch.ones(3, requires_grad=True)
    try:
        with pytest.warns(minihop.MinihopWarning, match=r"raised TypeError at pipeline.py, line \d+: .* inside minihop, where eager raises nothing"):
            y = f(x)
        torch.testing.assert_close(y, x * 2)
        assert minihop.counters()["internal_errors"] >= 1
        assert cache.INTERNAL_ERRORS[before:], "not recorded"
    finally:
        del cache.INTERNAL_ERRORS[before:]  # (this test's own, made on purpose)


def test_the_users_own_error_is_not_minihops():
    minihop.reset()
    before = len(cache.INTERNAL_ERRORS)
    with pytest.raises(NotImplementedError, match="not written yet"):
        minihop.function(Unfinished)(torch.ones(3, requires_grad=True))
    assert len(cache.INTERNAL_ERRORS) == before
    assert minihop.counters()["internal_errors"] == 0


def test_an_error_eager_raises_too_is_the_users_wherever_it_surfaced():
    # (a forward called with an argument missing fails in minihop's call of it: eager too)
    class Two(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g, g
    minihop.reset()
    before = len(cache.INTERNAL_ERRORS)
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        minihop.function(Two)(torch.ones(3, requires_grad=True))
    assert len(cache.INTERNAL_ERRORS) == before
