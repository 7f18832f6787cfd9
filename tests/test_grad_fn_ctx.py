"""The caller reaching into ``y.grad_fn``: eager's is the user's ctx (its attributes readable,
and writable before ``.backward()``); minihop's answers the same or raises a coded error.

Each case runs the same caller code on eager ``F.apply``, strict ``minihop.apply`` and
``minihop.function(F, fallback="eager")``, and compares what it saw and every ``.grad``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import minihop

MODES: dict[str, Callable[[type], Callable[..., Any]]] = {
    "eager": lambda F: F.apply,
    "strict": lambda F: (lambda *a: minihop.apply(F, *a)),
    "fallback": lambda F: minihop.function(F, fallback="eager"),
}


class Scaled(torch.autograd.Function):
    """A scale left on ctx as a float, a shape as a tuple (as timm's and entmax's Functions keep dims)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        ctx.shape = tuple(x.shape)
        return x * scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g.reshape(ctx.shape) * ctx.scale, None


class KeepsList(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.dims = [0]
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * (2 + len(ctx.dims))


class CountsBackwards(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.calls = 0
        return x * 3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        ctx.calls += 1
        return g * 3 * ctx.calls


class NothingOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


def _run(mode: str, F: type, caller: Callable[[Callable[..., Any], torch.Tensor], Any], steps: int = 3) -> list[Any]:
    apply = MODES[mode](F)
    seen = []
    for i in range(steps):
        x = torch.arange(1.0, 4.0).requires_grad_()
        seen.append(caller(apply, x, i))
        seen.append(x.grad)
    return seen


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        if isinstance(u, torch.Tensor):
            assert isinstance(v, torch.Tensor) and torch.equal(u, v)
        else:
            assert u == v and type(u) is type(v)


@pytest.mark.parametrize("mode", ["strict", "fallback"])
def test_caller_reads_plain_ctx_values_through_grad_fn(mode: str) -> None:
    """`y.grad_fn.scale` and `y.grad_fn.shape` give forward's values (was AttributeError in both modes)."""
    def caller(apply: Callable[..., Any], x: torch.Tensor, i: int) -> Any:
        y = apply(x, 1.5 + i)
        seen = (y.grad_fn.scale, y.grad_fn.shape)
        y.sum().backward()
        return seen
    _same(_run("eager", Scaled, caller), _run(mode, Scaled, caller))


@pytest.mark.parametrize("mode", ["strict", "fallback"])
def test_caller_setting_the_same_value_changes_nothing(mode: str) -> None:
    """Setting an attribute to the value forward left: backward runs as eager's does."""
    def caller(apply: Callable[..., Any], x: torch.Tensor, i: int) -> Any:
        y = apply(x, 2.0)
        y.grad_fn.scale = 2.0
        y.sum().backward()
        return y.grad_fn.scale
    _same(_run("eager", Scaled, caller), _run(mode, Scaled, caller))


def test_caller_setting_another_value_is_refused() -> None:
    """Eager's backward reads the scale the caller set on grad_fn (the grad is 3, not 2); minihop's
    bwd holds forward's: its backward raises MH106 naming the attribute (was a silent 2)."""
    x = torch.ones(3, requires_grad=True)
    y = Scaled.apply(x, 2.0)
    y.grad_fn.scale = 3.0
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0))  # what eager does, the reason for refusing
    x = torch.ones(3, requires_grad=True)
    y = MODES["strict"](Scaled)(x, 2.0)
    y.grad_fn.scale = 3.0
    with pytest.raises(minihop.SideEffectError, match=r"MH106.*y\.grad_fn\.scale of Scaled to 3\.0 .*forward left 2\.0"):
        y.sum().backward()


def test_caller_setting_another_value_under_fallback_matches_eager() -> None:
    """fallback="eager": that call's backward runs the user's backward eagerly, on the user's ctx
    rebuilt for the call with the caller's value (was MH106, in fallback mode too)."""
    def caller(apply: Callable[..., Any], x: torch.Tensor, i: int) -> Any:
        y = apply(x, 2.0)
        if i == 1:
            y.grad_fn.scale = 3.0
        y.sum().backward()
        return y.grad_fn.scale
    _same(_run("eager", Scaled, caller), _run("fallback", Scaled, caller))


def test_caller_reading_a_container_on_ctx_is_refused() -> None:
    """A list on ctx: eager hands the caller the list backward reads (changes to it count);
    minihop has no such list: a coded error, not an AttributeError or a copy whose changes are lost."""
    y = KeepsList.apply(torch.ones(2, requires_grad=True))
    assert y.grad_fn.dims == [0]
    y = MODES["strict"](KeepsList)(torch.ones(2, requires_grad=True))
    with pytest.raises(minihop.UnsupportedOperationError, match=r"MH104.*y\.grad_fn\.dims of KeepsList"):
        y.grad_fn.dims


def test_caller_changing_a_container_on_ctx_under_fallback_matches_eager() -> None:
    """fallback="eager": the caller gets the list of the user's ctx rebuilt for the call, and
    backward (run eagerly on it, twice with retain_graph) sees what the caller did to it."""
    def caller(apply: Callable[..., Any], x: torch.Tensor, i: int) -> Any:
        y = apply(x)
        seen = list(y.grad_fn.dims)
        if i == 1:
            y.grad_fn.dims.append(5)
        y.sum().backward(retain_graph=True)
        y.sum().backward()
        return seen, list(y.grad_fn.dims)
    _same(_run("eager", KeepsList, caller), _run("fallback", KeepsList, caller))


@pytest.mark.parametrize("reset_to", [None, 0, 1])
def test_caller_resetting_a_count_between_backwards(reset_to: int | None) -> None:
    """Between two backwards of a call the caller sets the count backward keeps on ctx: to what
    the first backward left (1: nothing changes), or back to forward's 0 (eager's second
    backward counts from there). Strict: equal to eager or MH106; fallback: equal to eager."""
    def caller(apply: Callable[..., Any], x: torch.Tensor, i: int) -> Any:
        y = apply(x)
        y.sum().backward(retain_graph=True)
        if reset_to is not None:
            y.grad_fn.calls = reset_to
        y.sum().backward()
        return y.grad_fn.calls
    eager = _run("eager", CountsBackwards, caller)
    _same(eager, _run("fallback", CountsBackwards, caller))
    try:
        strict = _run("strict", CountsBackwards, caller)
    except minihop.SideEffectError:
        assert reset_to == 0
        return
    _same(eager, strict)


def test_caller_setting_a_count_backward_increments_under_fallback() -> None:
    """Backward counts its runs on ctx; the caller sets the count first: eager's backward starts
    from it, and the caller reads what backward left, in fallback mode as in eager."""
    def caller(apply: Callable[..., Any], x: torch.Tensor, i: int) -> Any:
        y = apply(x)
        y.grad_fn.calls = 10 * i
        y.sum().backward(retain_graph=True)
        seen = [y.grad_fn.calls]
        y.sum().backward()
        return (*seen, y.grad_fn.calls)
    _same(_run("eager", CountsBackwards, caller), _run("fallback", CountsBackwards, caller))


class KeepsTensors(torch.autograd.Function):
    """Tensors on ctx, as an attribute and through save_for_backward (timm-style ``ctx.w``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.w = w * 2
        ctx.save_for_backward(x)
        return x * w * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (x,) = ctx.saved_tensors
        return g * ctx.w, g * x * 2


def test_caller_reading_and_replacing_a_tensor_on_ctx_under_fallback_matches_eager() -> None:
    """``y.grad_fn.w`` is the call's tensor (equal to eager's); replaced by the caller, backward
    uses the caller's tensor, as eager's does."""
    def caller(apply: Callable[..., Any], x: torch.Tensor, i: int) -> Any:
        w = torch.arange(3.0, 6.0, requires_grad=True)
        y = apply(x, w)
        seen = y.grad_fn.w.detach().clone()
        if i == 2:
            y.grad_fn.w = torch.full((3,), 7.0)
        y.sum().backward()
        return torch.cat([seen, w.grad])
    _same(_run("eager", KeepsTensors, caller), _run("fallback", KeepsTensors, caller))


@pytest.mark.parametrize("mode", ["strict", "fallback"])
def test_caller_reads_what_backward_left_on_ctx(mode: str) -> None:
    """Backward counts its runs on ctx: between two backwards of one call (retain_graph) the
    caller reads the count eager's ctx holds."""
    def caller(apply: Callable[..., Any], x: torch.Tensor, i: int) -> Any:
        y = apply(x)
        seen = [y.grad_fn.calls]
        y.sum().backward(retain_graph=True)
        seen.append(y.grad_fn.calls)
        y.sum().backward()
        seen.append(y.grad_fn.calls)
        return tuple(seen)
    _same(_run("eager", CountsBackwards, caller), _run(mode, CountsBackwards, caller))


@pytest.mark.parametrize("mode", ["eager", "strict", "fallback"])
@pytest.mark.parametrize("F", [Scaled, NothingOnCtx])
def test_attribute_forward_never_set_is_an_attribute_error(mode: str, F: type) -> None:
    """A name forward did not set is eager's AttributeError (hasattr answers False) in every mode."""
    args = (torch.ones(2, requires_grad=True), *((2.0,) if F is Scaled else ()))
    y = MODES[mode](F)(*args)
    assert not hasattr(y.grad_fn, "not_set_by_forward")
    with pytest.raises(AttributeError):
        y.grad_fn.not_set_by_forward


class OptionalTemperature(torch.autograd.Function):
    """Backward reads an optional attribute with a default (``getattr(ctx, name, default)``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2 * getattr(ctx, "temperature", 1.0)


@pytest.mark.parametrize("mode", ["strict", "fallback"])
def test_optional_attribute_left_unset_matches_eager(mode: str) -> None:
    """Nobody sets it: backward's default, as in eager; hasattr on grad_fn is False in both."""
    def caller(apply: Callable[..., Any], x: torch.Tensor, i: int) -> Any:
        y = apply(x)
        seen = hasattr(y.grad_fn, "temperature")
        y.sum().backward()
        return seen
    _same(_run("eager", OptionalTemperature, caller), _run(mode, OptionalTemperature, caller))


@pytest.mark.parametrize("mode", ["strict", "fallback"])
def test_optional_attribute_set_by_the_caller_is_refused_or_eager(mode: str) -> None:
    """The caller sets the attribute backward looks up: eager's grad uses it (1.0, not 2.0);
    minihop's bwd was traced with the default, so its backward raises MH106 (was silent);
    under fallback="eager" it runs the user's backward eagerly and gives eager's 1.0."""
    x = torch.ones(2, requires_grad=True)
    y = OptionalTemperature.apply(x)
    y.grad_fn.temperature = 0.5
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(2))
    x = torch.ones(2, requires_grad=True)
    y = MODES[mode](OptionalTemperature)(x)
    y.grad_fn.temperature = 0.5
    if mode == "fallback":
        y.sum().backward()
        assert torch.equal(x.grad, torch.ones(2))
        return
    with pytest.raises(minihop.SideEffectError, match=r"MH106.*y\.grad_fn\.temperature .*looks it up"):
        y.sum().backward()
