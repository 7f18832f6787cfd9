"""Issue 28, the read side: a capture is reused only where what it read is proven unchanged.

Each Function is written as a user writes it and run against eager ``F.apply`` call by call,
with the state it reads changed between calls (``before``) and between forward and
``.backward()`` (``mid``): outputs, every ``.grad``, in strict mode (``minihop.function(F)``:
right, or a coded refusal) and with ``fallback="eager"`` (always right).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.errors import GuardMismatchError, MinihopError, UnsupportedOperationError


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


def _run(fn: Callable[..., Any], args: tuple[Any, ...], k: int, mid: Callable[[int], None] | None) -> Any:
    torch.manual_seed(k)
    out = fn(*args)
    if mid is not None:
        mid(k)
    out.sum().backward()
    return out.detach(), [a.grad for a in args if isinstance(a, torch.Tensor)]


def same_as_eager(make: Callable[[], type], args: Callable[[int], tuple[Any, ...]],
                  before: Callable[[int], None], mid: Callable[[int], None] | None = None,
                  calls: int = 4) -> dict[str, list[str]]:
    """Per mode, what each call was ("ok" or a refusal's code); asserts every result equals
    eager's and that fallback="eager" never refuses."""
    seen: dict[str, list[str]] = {}
    for fallback in ("raise", "eager"):
        fn_cls = make()
        cf = minihop.function(fn_cls, fallback=fallback)
        seen[fallback] = []
        for k in range(calls):
            before(k)
            torch.manual_seed(1000 + k)  # the same arguments for both
            expected = _run(fn_cls.apply, args(k), k, mid)
            before(k)
            torch.manual_seed(1000 + k)
            try:
                got = _run(cf.apply, args(k), k, mid)
            except MinihopError as e:
                assert fallback == "raise", f"fallback='eager' raised {e}"
                seen[fallback].append(e.code)
                continue
            torch.testing.assert_close(got[0], expected[0], equal_nan=True, msg=lambda s: f"call {k} ({fallback}): {s}")
            for g, e in zip(got[1], expected[1], strict=True):
                assert (g is None) == (e is None)
                if g is not None:
                    torch.testing.assert_close(g, e, equal_nan=True, msg=lambda s: f"grad, call {k} ({fallback}): {s}")
            seen[fallback].append("ok")
    return seen


def x_only(k: int) -> tuple[Any, ...]:
    return (torch.randn(4, 4, requires_grad=True),)


# -- 1. nn.Module state beyond parameters and buffers ----------------------------------------

def _module_fn() -> type:
    class ModuleArg(Function):
        @staticmethod
        def forward(ctx, x, m):
            return m(x) * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2, None
    return ModuleArg


class TestModuleState:
    def test_dropout_argument_eval_between_calls(self) -> None:
        drop = torch.nn.Dropout(0.5)
        same_as_eager(_module_fn, lambda k: (r(4, 4), drop), lambda k: drop.train(k % 2 == 0))

    def test_batchnorm_argument_eval_and_eps(self) -> None:
        bn = torch.nn.BatchNorm1d(4)

        def before(k: int) -> None:
            bn.train(k < 2)
            bn.eps = 1e-5 if k % 2 else 0.5
            bn.reset_running_stats()
        same_as_eager(_module_fn, lambda k: (r(4, 4), bn), before)

    def test_global_dropout_eval(self) -> None:
        same_as_eager(_global_drop_fn, x_only, lambda k: GDROP.train(k % 2 == 1))

    def test_closure_module_in_helper(self) -> None:
        drop = torch.nn.Dropout(0.5)

        def helper(t: torch.Tensor) -> torch.Tensor:
            return drop(t) + 1

        def make() -> type:
            class InHelper(Function):
                @staticmethod
                def forward(ctx, x):
                    return helper(x)

                @staticmethod
                def backward(ctx, g):
                    return g
            return InHelper
        same_as_eager(make, x_only, lambda k: drop.train(k in (0, 3)))

    def test_user_module_attributes_flags_and_submodules(self) -> None:
        class Scale(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.k = 2.0
                self.inner = torch.nn.Identity()

            def forward(self, t: torch.Tensor) -> torch.Tensor:
                return self.inner(t) * self.k if self.training else t

        m = Scale()

        def before(k: int) -> None:
            m.k = [2.0, 3.0, 3.0, 2.0][k]
            m.train(k != 2)
            m.inner = torch.nn.Tanh() if k == 3 else torch.nn.Identity()
        seen = same_as_eager(_module_fn, lambda k: (r(4, 4), m), before)
        assert seen["raise"] == ["ok"] * 4


GDROP = torch.nn.Dropout(0.5)


def _global_drop_fn() -> type:
    class GlobalDrop(Function):
        @staticmethod
        def forward(ctx, x):
            return GDROP(x) * 3

        @staticmethod
        def backward(ctx, g):
            return g * 3
    return GlobalDrop


# -- 2. Callables and classes passed as arguments ------------------------------------------

class Settings:
    scale = 2.0
    shift = 1.0


class Obj:
    def __init__(self) -> None:
        self.s = 2.0

    def apply_to(self, t: torch.Tensor) -> torch.Tensor:
        return t * self.s


def _call_arg_fn() -> type:
    class CallArg(Function):
        @staticmethod
        def forward(ctx, x, fn):
            return fn(x)

        @staticmethod
        def backward(ctx, g):
            return g, None
    return CallArg


class TestCallablesAndClasses:
    def test_bound_method_whose_object_changes(self) -> None:
        o = Obj()
        same_as_eager(_call_arg_fn, lambda k: (r(4), o.apply_to), lambda k: setattr(o, "s", [2.0, 5.0, 5.0, -1.0][k]))

    def test_class_argument_whose_class_attribute_changes(self) -> None:
        def make() -> type:
            class ClassArg(Function):
                @staticmethod
                def forward(ctx, x, cls):
                    return x * cls.scale

                @staticmethod
                def backward(ctx, g):
                    return g, None
            return ClassArg
        try:
            seen = same_as_eager(make, lambda k: (r(4), Settings), lambda k: setattr(Settings, "scale", 2.0 + k))
        finally:
            Settings.scale = 2.0
        assert seen["raise"] == ["ok"] * 4

    def test_getattr_with_a_variable_name(self) -> None:
        names = ["scale"]

        def make() -> type:
            class ByName(Function):
                @staticmethod
                def forward(ctx, x):
                    return x * getattr(Settings, names[0])

                @staticmethod
                def backward(ctx, g):
                    return g
            return ByName

        def before(k: int) -> None:
            names[0] = "shift" if k % 2 else "scale"
            Settings.shift = 1.0 + k
        try:
            same_as_eager(make, x_only, before)
        finally:
            Settings.shift = 1.0
        # Single-use, and explain() says which read made it so.
        report = minihop.explain(make(), r(4), print_report=False)
        assert any("single-use" in g and "getattr" in g and "line" in g for g in report.guards), report.guards

    def test_a_function_of_its_arguments_only_is_never_single_use(self) -> None:
        class Pure(Function):
            @staticmethod
            def forward(ctx, x, n):
                ctx.save_for_backward(x)
                return x.sin() * n

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * x.cos(), None
        cf = minihop.function(Pure)
        for _ in range(3):
            cf(r(3), 2)
        assert (cf.stats.captures, cf.stats.hits) == (1, 2)


# -- 3. A forward that calls another Function's apply --------------------------------------

INNER = {"s": 2.0}
INNER_SCALE = 2.0


class Inner(Function):
    @staticmethod
    def forward(ctx, x):
        return x * INNER_SCALE

    @staticmethod
    def backward(ctx, g):
        return g * INNER_SCALE


class TestInnerApply:
    def test_inner_forward_global_is_guarded(self) -> None:
        def make() -> type:
            class Outer(Function):
                @staticmethod
                def forward(ctx, x):
                    return Inner.apply(x) + 1

                @staticmethod
                def backward(ctx, g):
                    return g
            return Outer

        def before(k: int) -> None:
            global INNER_SCALE
            INNER_SCALE = [2.0, 3.0, 3.0, 4.0][k]
        seen = same_as_eager(make, x_only, before)
        assert seen["raise"] == ["ok"] * 4


# -- 4. A global holding a library function, rebound ------------------------------------------

ACT = torch.relu


class TestLibraryFunctionGlobal:
    def test_rebound_library_function(self) -> None:
        def make() -> type:
            class Act(Function):
                @staticmethod
                def forward(ctx, x):
                    return ACT(x)

                @staticmethod
                def backward(ctx, g):
                    return g
            return Act

        def before(k: int) -> None:
            global ACT
            ACT = [torch.relu, torch.tanh, torch.tanh, torch.sigmoid][k]
        try:
            same_as_eager(make, x_only, before)
        finally:
            before(0)


# -- 5. Tensors rebound --------------------------------------------------------------------

class TestTensorsRebound:
    def test_tensor_class_attribute_replaced(self) -> None:
        made: list[type] = []

        def make() -> type:
            class WithW(Function):
                W = torch.ones(4)

                @staticmethod
                def forward(ctx, x):
                    return x * WithW.W

                @staticmethod
                def backward(ctx, g):
                    return g * WithW.W
            made.append(WithW)
            return WithW
        same_as_eager(make, lambda k: (r(4),), lambda k: setattr(made[-1], "W", torch.full((4,), 1.0 + k)))


# -- 6. Tensor properties read in forward ---------------------------------------------------

class TestTensorState:
    @pytest.mark.parametrize("attr", ["grad", "is_leaf"])
    def test_refused_in_strict_eager_in_fallback(self, attr: str) -> None:
        def make() -> type:
            if attr == "grad":
                class ReadsGrad(Function):
                    @staticmethod
                    def forward(ctx, x):
                        return x * 2 if x.grad is None else x * 3

                    @staticmethod
                    def backward(ctx, g):
                        return g
                return ReadsGrad

            class ReadsLeaf(Function):
                @staticmethod
                def forward(ctx, x):
                    return x * 2 if x.is_leaf else x * 3

                @staticmethod
                def backward(ctx, g):
                    return g
            return ReadsLeaf

        def args(k: int) -> tuple[Any, ...]:
            x = r(4)
            if attr == "grad" and k % 2:
                x.grad = torch.ones(4)
            return (x if attr == "grad" or k % 2 == 0 else x * 1,)
        seen = same_as_eager(make, args, lambda k: None)
        assert seen["raise"] == [UnsupportedOperationError.code] * 4


# -- 7. Float keys -------------------------------------------------------------------------

class TestFloatKeys:
    @pytest.mark.parametrize("values", [[0.0, -0.0, 0.0, -0.0], [(0.0, 1.0), (-0.0, 1.0), (0.0, math.nan), (0.0, math.nan)]],
                             ids=["scalar", "in-tuple"])
    def test_signed_zero_and_nan(self, values: list[Any]) -> None:
        def make() -> type:
            class Sign(Function):
                @staticmethod
                def forward(ctx, x, c):
                    c0, c1 = c if isinstance(c, tuple) else (c, 1.0)
                    return x * math.copysign(1.0, c0) + (0.0 if c1 == c1 else 5.0)

                @staticmethod
                def backward(ctx, g):
                    return g, None
            return Sign
        same_as_eager(make, lambda k: (r(3), values[k]), lambda k: None)
        cf = minihop.function(make())
        for k in (0, 2, 3):
            cf(r(3), values[k])
        assert cf.stats.hits == 1  # 0.0 hits 0.0 (never -0.0), and NaN hits NaN (by bits)


# -- the assumption record in messages -------------------------------------------------------

SCALE = 2.0


class TestMismatchNamesTheValue:
    def test_guard_mismatch_names_place_old_and_new(self) -> None:
        global SCALE

        class Scaled(Function):
            @staticmethod
            def forward(ctx, x):
                return x * SCALE

            @staticmethod
            def backward(ctx, g):
                return g * SCALE
        cap = minihop.capture(Scaled, r(3))
        SCALE = 5.0
        try:
            with pytest.raises(GuardMismatchError, match=r"SCALE changed .* it was 2\.0, it is 5\.0"):
                cap(r(3))
        finally:
            SCALE = 2.0


# -- tensors reached where no chain of forward's own names them (found by generate_reads) ---

class Weights:
    W = torch.full((), 2.0)


class ReadsWeights(Function):
    @staticmethod
    def forward(ctx, t):
        return t * Weights.W

    @staticmethod
    def backward(ctx, g):
        return g * Weights.W


class TestTensorsReachedIndirectly:
    """A tensor class attribute reached where no name of forward's own leads: through a
    lambda, or inside another Function's forward (fetched anew, or the capture single-use)."""

    @pytest.mark.parametrize("form", ["lambda", "inner_apply"])
    def test_class_attribute_tensor_replaced(self, form: str) -> None:
        def make() -> type:
            if form == "lambda":
                class InLambda(Function):
                    @staticmethod
                    def forward(ctx, x):
                        return x * (lambda: Weights.W)()

                    @staticmethod
                    def backward(ctx, g):
                        return g
                return InLambda

            class UsesInner(Function):
                @staticmethod
                def forward(ctx, x):
                    return x * ReadsWeights.apply(torch.ones(()))

                @staticmethod
                def backward(ctx, g):
                    return g
            return UsesInner
        try:
            same_as_eager(make, lambda k: (r(3),), lambda k: setattr(Weights, "W", torch.full((), [2.0, 3.0, 3.0, 5.0][k])))
        finally:
            Weights.W = torch.full((), 2.0)
