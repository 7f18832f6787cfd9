"""The prepared call paths against eager: captures tried by their compiled guards before any
key is built (several per Function, as when one Function serves several layers), and saved
values handed to ctx in the user's order when bwd reads them in another."""

from __future__ import annotations

import functools
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


# ---------------------------------------------------------------------------------------------
# The generated checks a hit asks: each equal to the comparison it stands for
# ---------------------------------------------------------------------------------------------


def _forms() -> list[type]:
    """Function classes of every calling form ``methods_key`` distinguishes."""

    class Plain(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, s: float = 2.0) -> torch.Tensor:
            return x * s

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> Any:
            return g, None

    class Keyword(Plain):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, *, s: float = 2.0) -> torch.Tensor:
            return x * s

    class Setup(Plain):
        @staticmethod
        def forward(x: torch.Tensor, s: float = 2.0) -> torch.Tensor:
            return x * s

        @staticmethod
        def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
            pass

    class Classmethods(torch.autograd.Function):
        @classmethod
        def forward(cls, ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @classmethod
        def backward(cls, ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2

    class CallableForward(Plain):
        forward = staticmethod(functools.partial(lambda ctx, x: x * 2))

    return [Plain, Keyword, Setup, Classmethods, CallableForward]


def _changes(F: type) -> list[Any]:
    """Ways a caller changes what ``F``'s methods are (each applied to a fresh class)."""
    def other(ctx: Any, x: torch.Tensor, s: float = 3.0) -> torch.Tensor:
        return x * s

    def code(F: type) -> None:
        fn = F.__dict__["forward"].__func__
        if hasattr(fn, "__code__"):
            fn.__code__ = other.__code__

    def defaults(F: type) -> None:
        fn = getattr(F.forward, "__func__", F.forward)
        if hasattr(fn, "__defaults__"):
            fn.__defaults__ = (5.0,)

    def kwdefaults(F: type) -> None:
        fn = getattr(F.forward, "__func__", F.forward)
        if hasattr(fn, "__kwdefaults__"):
            fn.__kwdefaults__ = {"s": 4.0}

    def backward(F: type) -> None:
        F.backward = staticmethod(lambda ctx, g: (g * 0, None))

    def setup(F: type) -> None:
        F.setup_context = staticmethod(lambda ctx, inputs, output: None)

    def vjp(F: type) -> None:
        F.vjp = F.backward

    def nothing(F: type) -> None:
        pass

    return [nothing, code, defaults, kwdefaults, backward, setup, vjp]


@pytest.mark.parametrize("form", range(5))
@pytest.mark.parametrize("change", range(7))
def test_methods_check_equals_the_key_comparison(form: int, change: int) -> None:
    from minihop.runtime.function_keys import methods_check, methods_key

    F = _forms()[form]
    key = methods_key(F)
    same = methods_check(F, key)
    assert same(F)
    _changes(F)[change](F)
    assert same(F) == (methods_key(F) == key)
    Other = _forms()[form]  # another class of the same form: never the same methods
    assert not same(Other) and methods_key(Other) != key


def test_a_call_after_the_forward_code_changes_captures_again() -> None:
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 2

    def thrice(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 3

    x = torch.randn(3)
    assert torch.equal(minihop.apply(Twice, x), x * 2)
    assert torch.equal(minihop.apply(Twice, x), x * 2)  # a hit
    Twice.forward.__code__ = thrice.__code__
    assert torch.equal(minihop.apply(Twice, x), Twice.apply(x))
    cap = minihop.capture(Twice, x)
    Twice.forward.__defaults__ = (1,)
    with pytest.raises(minihop.GuardMismatchError, match="forward"):
        cap(x)


def test_merged_checks_equal_each_check_in_turn() -> None:
    """``merge_checks`` renames each body's names apart: a name that is also an attribute
    (``args[0].dtype``) or text in a string stays as it is."""
    from minihop.runtime.guard_checks import compile_guard, compile_live_check, merge_checks
    from minihop.runtime.guards import call_key, value_key

    x = torch.randn(2, 3)
    box = {"v": 1.0, "name": "dtype"}
    guard = compile_guard(call_key((x, 2)))
    live = compile_live_check((lambda args: box["v"], lambda args: box["name"]), (value_key(1.0), value_key("dtype")))
    live2 = compile_live_check((lambda args: box["v"],), (value_key(1.0),))
    merged = merge_checks([guard, live, live2])
    assert merged is not None
    cases = [(x, 2), (x, 3), (x.double(), 2), (torch.randn(2, 4), 2), (x,)]
    for v in (1.0, 2.0, -0.0):
        for name in ("dtype", "d0"):
            box.update(v=v, name=name)
            for args in cases:
                assert merged(args) == (guard(args) and live(args) and live2(args)), (args, box)
