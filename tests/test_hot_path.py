"""The prepared call paths against eager: captures tried by their compiled guards before any
key is built (several per Function, as when one Function serves several layers), and saved
values handed to ctx in the user's order when bwd reads them in another."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import minihop


class Lin(torch.autograd.Function):
    """Saves (x, w); backward reads w first, so bwd's saved order is (w, x)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x, g.sum(0)


def layers(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(16, 4), (16, 16), (1, 16)]
    return [(torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True),
             torch.randn(s[0], generator=gen, dtype=torch.float64, requires_grad=True)) for s in shapes]


def model(apply: Any, params: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor) -> torch.Tensor:
    h = x
    for w, b in params:
        h = apply(Lin, h, w, b).tanh()
    return h.sum()


def eager_apply(fn: type, *args: Any) -> Any:
    return fn.apply(*args)


@pytest.fixture(autouse=True)
def _clean() -> Any:
    minihop.reset()
    yield
    minihop.reset()


def test_one_function_three_layers_matches_eager() -> None:
    """Three layers through one Function, 5 steps: three captures, then only hits; grads equal eager's."""
    mine, ref = layers(), layers()
    x = torch.randn(8, 4, dtype=torch.float64)
    for _ in range(5):
        model(minihop.apply, mine, x).backward()
        model(eager_apply, ref, x).backward()
    torch.testing.assert_close([t.grad for p in mine for t in p], [t.grad for p in ref for t in p])
    got = minihop.counters()
    assert (got["captures"], got["cache_hits"], got["fallbacks"]) == (3, 12, 0)


def test_past_the_cache_limit_stays_right() -> None:
    """cache_limit=2 with three alternating keys (static shapes): evicted captures are never run again stale."""
    cf = minihop.function(Lin, cache_limit=2, dynamic=False)
    params = layers()
    x = torch.randn(8, 4, dtype=torch.float64)
    with pytest.warns(UserWarning, match="cache_limit"):
        for _ in range(3):
            h = x
            for w, b in params:
                out = cf(h, w, b)
                torch.testing.assert_close(out, Lin.apply(h, w, b))
                h = out.tanh().detach()
    assert cf.stats.captures > 3 and cf.stats.evictions > 0


def test_saved_in_user_order_for_hooks_and_versions() -> None:
    """Packed tensors reach saved_tensors_hooks in the user's order (x, w), as in eager, and an
    in-place change of a saved tensor before backward raises as in eager."""
    def packs(apply: Any) -> list[tuple[int, ...]]:
        seen: list[tuple[int, ...]] = []
        x = torch.randn(8, 4, dtype=torch.float64)
        (w, b), = layers()[:1]
        with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(tuple(t.shape)) or t, lambda t: t):
            apply(Lin, x, w, b).sum().backward()
        return seen

    assert packs(minihop.apply) == packs(eager_apply) == [(8, 4), (16, 4)]
    (w, b), = layers()[:1]
    x = torch.randn(8, 4, dtype=torch.float64)
    out = minihop.apply(Lin, x, w, b)
    with torch.no_grad():
        x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_double_backward_with_saved_in_user_order() -> None:
    """create_graph=True through the reordered code: second-order grads equal eager's."""
    def second(apply: Any) -> torch.Tensor:
        x = torch.linspace(-1, 1, 8 * 4, dtype=torch.float64).reshape(8, 4).requires_grad_()
        (w, b), = layers()[:1]
        (gx,) = torch.autograd.grad(apply(Lin, x, w, b).pow(2).sum(), x, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.sum(), x)
        return ggx

    torch.testing.assert_close(second(minihop.apply), second(eager_apply))
