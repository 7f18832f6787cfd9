"""Activation checkpointing and saved-tensor hooks around captured Functions behave as eager
(issue #8, item 6).

- ``torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=False)`` and ``use_reentrant=True``
  around code that calls ``minihop.apply`` on several Functions: outputs and gradients equal both
  eager's checkpointed run and the run without checkpointing. One Function draws random numbers
  in forward: checkpointing restores the RNG state for the recomputation, so its mask must come
  out the same again (eager's rule, checked).
- ``torch.autograd.graph.saved_tensors_hooks(pack, unpack)`` offloading every saved tensor (pack
  records it and keeps a detached copy with its device; unpack moves it back) and
  ``torch.autograd.graph.save_on_cpu()``: same outputs and gradients as eager, and the same
  packed tensors (count, shapes, dtypes, ``requires_grad``) in the same order, and as many unpacks.

The program mixes minihop's Functions with ordinary torch ops that save tensors too. Each
Function is chosen for what it saves: an input (``Sin``), an intermediate plus an input
(``ExpMul``), its output (``TanhOut``), a tensor kept as a ``ctx`` attribute, which eager does not
pack (``CtxAttr``), and a random mask (``Dropout``). Every minihop run also checks
``minihop.counters()``: the Functions went through captures, never an eager fallback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.autograd import Function
from torch.utils.checkpoint import checkpoint

import minihop
from shared_functions import MySin


# ---------------------------------------------------------------------------------------------
# Functions
# ---------------------------------------------------------------------------------------------

Sin = MySin  # saves its input


class ExpMul(Function):
    """Saves an intermediate (``e``) and an input (``w``, broadcast over rows)."""

    @staticmethod
    def forward(ctx, x, w):
        e = x.exp()
        ctx.save_for_backward(e, w)
        return e * w

    @staticmethod
    def backward(ctx, grad):
        e, w = ctx.saved_tensors
        return grad * w * e, (grad * e).sum(0)


class TanhOut(Function):
    """Saves its output."""

    @staticmethod
    def forward(ctx, x):
        y = x.tanh()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


class CtxAttr(Function):
    """Keeps a tensor as a ctx attribute (eager does not pack it) and a Python float."""

    @staticmethod
    def forward(ctx, x, scale):
        s = x.sigmoid()
        ctx.s = s
        ctx.scale = scale
        return x * s * scale

    @staticmethod
    def backward(ctx, grad):
        s = ctx.s
        return grad * ctx.scale * s * (1 + (1 - s) * s.logit()), None


class Dropout(Function):
    """Random mask drawn in forward and saved."""

    @staticmethod
    def forward(ctx, x, p):
        mask = (torch.rand_like(x) > p).to(x.dtype) / (1 - p)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


FUNCTIONS_PER_PROGRAM = 5

Apply = Callable[..., Any]


class EagerApply:
    """``F.apply``, counting the applies (recomputation included) so that minihop's counters
    can be held to the same number. Non-reentrant checkpointing stops recomputing once every
    tensor backward needs is back, so it can be fewer than twice the program's applies."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fn: type, *args: Any) -> Any:
        self.calls += 1
        return fn.apply(*args)


def eager_apply(fn: type, *args: Any) -> Any:
    return fn.apply(*args)


def program(apply: Apply, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = apply(Sin, x * 2)
    y = apply(ExpMul, h, w)
    z = apply(TanhOut, torch.mul(y, w))      # torch.mul saves y and w itself
    d = apply(Dropout, z, 0.25)
    return apply(CtxAttr, d, 0.5).sum(-1)


def make_args() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, generator=gen) * 0.5, torch.randn(4, generator=gen) * 0.5


def run(apply: Apply, how: str, wrap: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The program with fresh leaves and a fixed seed; ``how``: plain, or checkpointed."""
    x0, w0 = make_args()
    x = x0.clone().requires_grad_(True)
    w = w0.clone().requires_grad_(True)
    torch.manual_seed(1234)
    with wrap():
        if how == "plain":
            out = program(apply, x, w)
        else:
            out = checkpoint(program, apply, x, w, use_reentrant=(how == "reentrant"))
    (out * torch.arange(1.0, 4.0)).sum().backward()
    return out.detach(), x.grad, w.grad


def assert_same(got: tuple[Any, ...], expected: tuple[Any, ...]) -> None:
    for name, g, e in zip(("output", "x.grad", "w.grad"), got, expected, strict=True):
        torch.testing.assert_close(g, e, msg=lambda m, name=name: f"{name}: {m}")


@contextlib.contextmanager
def through_minihop(expected_applies: int, *, cached: bool = False) -> Iterator[None]:
    """The block made ``expected_applies`` minihop.apply calls (eager's number), each a capture
    or a cache hit, never an eager fallback; with ``cached``, no new capture at all."""
    before = minihop.counters()
    yield
    after = minihop.counters()
    delta = {k: after[k] - before[k] for k in after}
    assert delta["fallbacks"] == 0, f"minihop ran a Function eagerly: {delta}"
    assert delta["captures"] + delta["cache_hits"] == expected_applies, (
        f"{expected_applies} applies expected (as in eager): {delta}")
    if cached:
        assert delta["captures"] == 0, f"a cached capture was not reused: {delta}"
    else:
        assert delta["captures"] >= 1, delta


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    minihop.clear_cache()
    yield
    minihop.clear_cache()


# ---------------------------------------------------------------------------------------------
# Activation checkpointing
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["non_reentrant", "reentrant"])
def test_checkpoint_matches_eager(how: str) -> None:
    plain = run(eager_apply, "plain")
    counting = EagerApply()
    eager = run(counting, how)
    assert_same(eager, plain)  # eager's rule, checked: recomputation (RNG too) changes nothing
    # Applies run in the first forward, then again in the recomputation (which non-reentrant
    # checkpointing stops early: CtxAttr saves nothing, so it is not recomputed).
    assert counting.calls == (9 if how == "non_reentrant" else 10)
    with through_minihop(counting.calls):
        got = run(minihop.apply, how)
    assert_same(got, eager)
    assert_same(got, plain)


def test_plain_program_matches_eager() -> None:
    expected = run(eager_apply, "plain")
    with through_minihop(FUNCTIONS_PER_PROGRAM):
        got = run(minihop.apply, "plain")
    assert_same(got, expected)


@pytest.mark.parametrize("how", ["non_reentrant", "reentrant"])
def test_checkpoint_with_captures_already_cached(how: str) -> None:
    """A second checkpointed step reuses the captures (no new capture) and still matches."""
    counting = EagerApply()
    expected = run(counting, how)
    run(minihop.apply, how)
    with through_minihop(counting.calls, cached=True):
        got = run(minihop.apply, how)
    assert_same(got, expected)


@pytest.mark.parametrize("how", ["non_reentrant", "reentrant"])
def test_checkpoint_twice_in_one_graph(how: str) -> None:
    """Two checkpointed segments in a row, the second fed by the first."""

    def two(apply: Apply, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        reentrant = how == "reentrant"
        a = checkpoint(lambda x, w: apply(ExpMul, apply(Sin, x), w), x, w, use_reentrant=reentrant)
        return checkpoint(lambda a: apply(TanhOut, a), a, use_reentrant=reentrant)

    def go(apply: Apply) -> tuple[torch.Tensor, ...]:
        x0, w0 = make_args()
        x = x0.clone().requires_grad_(True)
        w = w0.clone().requires_grad_(True)
        out = two(apply, x, w)
        out.sum().backward()
        return out.detach(), x.grad, w.grad

    counting = EagerApply()
    expected = go(counting)
    with through_minihop(counting.calls):
        got = go(minihop.apply)
    assert_same(got, expected)


# ---------------------------------------------------------------------------------------------
# Saved-tensor hooks
# ---------------------------------------------------------------------------------------------

class Offload(torch.autograd.graph.saved_tensors_hooks):
    """pack: record the tensor, keep a detached copy with its device; unpack: back."""

    def __init__(self) -> None:
        super().__init__(self.pack, self.unpack)
        self.packed: list[tuple[tuple[int, ...], torch.dtype, bool]] = []
        self.unpacked = 0

    def pack(self, t: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        self.packed.append((tuple(t.shape), t.dtype, t.requires_grad))
        return (t.device, t.detach().clone())

    def unpack(self, stored: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        self.unpacked += 1
        device, t = stored
        return t.to(device)


class CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    """``save_on_cpu``, recording what it packs and counting unpacks."""

    def __init__(self) -> None:
        super().__init__()
        self.packed: list[tuple[tuple[int, ...], torch.dtype, bool]] = []
        self.unpacked = 0
        pack, unpack = self.pack_hook, self.unpack_hook

        def counting_pack(t: torch.Tensor) -> Any:
            self.packed.append((tuple(t.shape), t.dtype, t.requires_grad))
            return pack(t)

        def counting_unpack(stored: Any) -> torch.Tensor:
            self.unpacked += 1
            return unpack(stored)

        self.pack_hook, self.unpack_hook = counting_pack, counting_unpack


HOOKS = {"saved_tensors_hooks": Offload, "save_on_cpu": CountingSaveOnCpu}


@pytest.mark.parametrize("kind", list(HOOKS))
def test_saved_tensor_hooks_match_eager(kind: str) -> None:
    eager_hooks = HOOKS[kind]()
    expected = run(eager_apply, "plain", lambda: eager_hooks)
    assert_same(expected, run(eager_apply, "plain"))  # eager's rule: offloading changes nothing
    # eager packs exactly what save_for_backward got (and what torch.mul saves), not ctx.s
    assert len(eager_hooks.packed) == 7, eager_hooks.packed

    hooks = HOOKS[kind]()
    with through_minihop(FUNCTIONS_PER_PROGRAM):
        got = run(minihop.apply, "plain", lambda: hooks)
    assert_same(got, expected)
    assert hooks.packed == eager_hooks.packed
    assert hooks.unpacked == eager_hooks.unpacked


@pytest.mark.parametrize("kind", list(HOOKS))
def test_saved_tensor_hooks_with_cached_captures(kind: str) -> None:
    """Hooks also apply on a cache hit (a capture made without hooks)."""
    run(minihop.apply, "plain")
    eager_hooks = HOOKS[kind]()
    expected = run(eager_apply, "plain", lambda: eager_hooks)
    hooks = HOOKS[kind]()
    with through_minihop(FUNCTIONS_PER_PROGRAM, cached=True):
        got = run(minihop.apply, "plain", lambda: hooks)
    assert_same(got, expected)
    assert hooks.packed == eager_hooks.packed
    assert hooks.unpacked == eager_hooks.unpacked


@pytest.mark.parametrize("kind", list(HOOKS))
def test_saved_tensor_hooks_inside_checkpoint(kind: str) -> None:
    """Hooks around a non-reentrant checkpoint. Inside the checkpointed region checkpoint's own
    hooks take over (in eager the outer hooks see 2 tensors, none of the Functions' saves);
    whatever they see, counts and results must be eager's."""
    eager_hooks = HOOKS[kind]()
    counting = EagerApply()
    expected = run(counting, "non_reentrant", lambda: eager_hooks)
    hooks = HOOKS[kind]()
    with through_minihop(counting.calls):
        got = run(minihop.apply, "non_reentrant", lambda: hooks)
    assert_same(got, expected)
    assert hooks.packed == eager_hooks.packed
    assert hooks.unpacked == eager_hooks.unpacked
