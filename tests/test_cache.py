"""The guarded capture cache (``minihop/cache.py``): ``minihop.apply``, ``minihop.function``
and ``@minihop.captured``.

Every call that produces a value is compared with eager ``F.apply`` on twin copies of the same
arguments (outputs, ``requires_grad``, and the grads of the tensor arguments). Cache behaviour
is counted through ``CapturedFunction.stats`` or by wrapping ``minihop.cache.capture``; nothing
is timed.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.cache import CapturedFunction


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def r(*shape: int, grad: bool = True, dtype: torch.dtype = torch.float32,
      device: str = "cpu") -> torch.Tensor:
    """A random leaf."""
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_(grad)


def twin(value: Any) -> Any:
    """``value`` with each tensor (top level or in a list/tuple) a fresh leaf of equal value."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(twin(v) for v in value)
    return value


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Tensors at the top level of ``value`` or inside its lists and tuples, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


def leaves(value: Any) -> list[Any]:
    """An output flattened through tuples and lists."""
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def assert_same_tensor(mine: torch.Tensor, eager: torch.Tensor, where: str) -> None:
    if eager.device.type == "meta":  # no values to compare
        assert (mine.shape, mine.dtype, mine.device, mine.layout) == (
            eager.shape, eager.dtype, eager.device, eager.layout), where
    else:
        torch.testing.assert_close(mine, eager, msg=lambda s: f"{where}: {s}")
    assert mine.requires_grad == eager.requires_grad, (
        f"{where}: requires_grad minihop={mine.requires_grad} eager={eager.requires_grad}")


def assert_matches_eager(call: Callable[..., Any], fn_cls: type, *args: Any) -> Any:
    """``call(*args)`` gives ``fn_cls.apply``'s outputs and the same grads of tensor arguments."""
    mine_args, eager_args = twin(args), twin(args)
    mine, eager = call(*mine_args), fn_cls.apply(*eager_args)
    mine_leaves, eager_leaves = leaves(mine), leaves(eager)
    assert type(mine) is type(eager) and len(mine_leaves) == len(eager_leaves), (mine, eager)
    for i, (m, e) in enumerate(zip(mine_leaves, eager_leaves, strict=True)):
        if isinstance(e, torch.Tensor):
            assert isinstance(m, torch.Tensor), f"output {i}: minihop gives {type(m).__name__}"
            assert_same_tensor(m, e, f"output {i}")
        else:
            assert type(m) is type(e) and m == e, f"output {i}: minihop {m!r}, eager {e!r}"
    differentiable = [i for i, e in enumerate(eager_leaves)
                      if isinstance(e, torch.Tensor) and e.requires_grad]
    if differentiable:
        for outs in (mine_leaves, eager_leaves):
            sum((outs[i] * (i + 1)).sum() for i in differentiable).backward()  # type: ignore[union-attr]
        for i, (m, e) in enumerate(zip(tensors_in(mine_args), tensors_in(eager_args), strict=True)):
            assert (m.grad is None) == (e.grad is None), f"grad of tensor argument {i}"
            if e.grad is not None:
                assert_same_tensor(m.grad, e.grad, f"grad of tensor argument {i}")
    return mine


def counts(cf: CapturedFunction) -> tuple[int, int]:
    """(captures, hits) of a CapturedFunction."""
    return cf.stats.captures, cf.stats.hits


def assert_guard(fn_cls: type, same: Callable[[], tuple[Any, ...]],
                 changed: Callable[[], tuple[Any, ...]]) -> CapturedFunction:
    """``same()``'s arguments capture once then hit; ``changed()``'s recapture; all as eager."""
    cf = minihop.function(fn_cls)
    assert_matches_eager(cf.apply, fn_cls, *same())
    assert counts(cf) == (1, 0)
    assert_matches_eager(cf.apply, fn_cls, *same())
    assert counts(cf) == (1, 1), "an unchanged call did not hit the cache"
    assert_matches_eager(cf.apply, fn_cls, *changed())
    assert counts(cf) == (2, 1), "a changed call did not recapture"
    return cf


@pytest.fixture
def capture_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[type]]:
    """An empty default cache, and the Function class of every capture the cache makes."""
    log: list[type] = []
    real = minihop.cache.capture

    def counting(fn_cls: type, *args: Any, **kwargs: Any) -> Any:
        log.append(fn_cls)
        return real(fn_cls, *args, **kwargs)

    monkeypatch.setattr(minihop.cache, "capture", counting)
    minihop.clear_cache()
    yield log
    minihop.clear_cache()


def limit_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if "cache_limit" in str(w.message)]


# ---------------------------------------------------------------------------------------------
# Functions
# ---------------------------------------------------------------------------------------------

class Sin(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.cos(x)


class Double(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Scale(Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


class Reduce(Function):
    @staticmethod
    def forward(ctx, x, how):
        ctx.shape, ctx.how = x.shape, how
        return getattr(x, how)(0)  # "sum" or "mean"

    @staticmethod
    def backward(ctx, g):
        return g.expand(ctx.shape) / (1 if ctx.how == "sum" else ctx.shape[0]), None


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.numel = x.numel()
        return x.reshape(shape) * 1

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.numel), None


class PairOp(Function):
    """Multiplies a list's two tensors, adds a tuple's: the container type decides."""

    @staticmethod
    def forward(ctx, x, pair):
        if isinstance(pair, list):
            return x * pair[0] * pair[1]
        return x * (pair[0] + pair[1])

    @staticmethod
    def backward(ctx, g):
        return g, None


class Holder:
    def __init__(self, w: torch.Tensor) -> None:
        self.w = w


class UseHolder(Function):
    @staticmethod
    def forward(ctx, x, obj):
        return x * obj.w.sum(0)

    @staticmethod
    def backward(ctx, g):
        return g, None


_FACTOR = 2.0


class UseGlobalNumber(Function):
    @staticmethod
    def forward(ctx, x):
        return x * _FACTOR

    @staticmethod
    def backward(ctx, g):
        return g * _FACTOR


class RunModule(Function):
    @staticmethod
    def forward(ctx, x, mod):
        ctx.weight = mod.weight
        return mod(x)

    @staticmethod
    def backward(ctx, g):
        return g @ ctx.weight, None


class Item(Function):
    @staticmethod
    def forward(ctx, x):
        return x * torch.rand((), generator=torch.Generator().manual_seed(0)).item()  # random: not known at capture

    @staticmethod
    def backward(ctx, g):
        return g


def make_item() -> type:
    class Item(Function):
        @staticmethod
        def forward(ctx, x):
            return x * torch.rand((), generator=torch.Generator().manual_seed(0)).item()  # random: not known at capture

        @staticmethod
        def backward(ctx, g):
            return g

    return Item


# ---------------------------------------------------------------------------------------------
# Guards: an unchanged call hits, a changed property recaptures (minihop.function's stats)
# ---------------------------------------------------------------------------------------------

class TestGuards:
    def test_shape(self) -> None:
        """A tensor argument of a new shape recaptures."""
        assert_guard(Sin, lambda: (r(3),), lambda: (r(4),))

    def test_dtype(self) -> None:
        """A tensor argument of a new dtype recaptures."""
        assert_guard(Sin, lambda: (r(3),), lambda: (r(3, dtype=torch.float64),))

    def test_device(self) -> None:
        """A tensor argument on another device (meta; no CUDA here) recaptures."""
        assert_guard(Sin, lambda: (r(3),), lambda: (r(3, device="meta"),))

    def test_layout(self) -> None:
        """A sparse COO argument of the same shape and dtype as a strided one recaptures."""
        dense = torch.randn(3, 3)
        assert_guard(Double, lambda: (dense,), lambda: (dense.to_sparse(),))

    def test_requires_grad(self) -> None:
        """An argument that stops requiring grad recaptures (and its output does not require grad)."""
        assert_guard(Sin, lambda: (r(3),), lambda: (r(3, grad=False),))

    def test_grad_mode(self) -> None:
        """A call under torch.no_grad() recaptures, and its output does not require grad, as eager's."""
        cf = minihop.function(Sin)
        assert_matches_eager(cf.apply, Sin, r(3))
        assert_matches_eager(cf.apply, Sin, r(3))
        assert counts(cf) == (1, 1)
        with torch.no_grad():
            out = assert_matches_eager(cf.apply, Sin, r(3))
            assert counts(cf) == (2, 1)
            assert_matches_eager(cf.apply, Sin, r(3))
            assert counts(cf) == (2, 2)
        assert not out.requires_grad

    @pytest.mark.parametrize("fn_cls, same, changed", [
        (Scale, 2, 3),
        (Scale, 2.0, 2.5),
        (Scale, 2, 2.0),  # equal numbers of another type: another key
        (Reduce, "sum", "mean"),
        (Reshape, (2, 3), (3, 2)),
    ], ids=["int", "float", "int-vs-float", "str", "tuple-of-ints"])
    def test_non_tensor_value(self, fn_cls: type, same: Any, changed: Any) -> None:
        """A non-tensor argument of another value recaptures and gives that value's result."""
        assert_guard(fn_cls, lambda: (r(6), same), lambda: (r(6), changed))

    def test_structure(self) -> None:
        """A tuple holding the same tensors as a list recaptures (forward branches on the type)."""
        a, b = torch.randn(3), torch.randn(3)
        cf = assert_guard(PairOp, lambda: (r(3), [a, b]), lambda: (r(3), (a, b)))
        assert_matches_eager(cf.apply, PairOp, r(3), [a, b])
        assert counts(cf) == (2, 2)

    def test_tensor_in_object_changes_shape(self) -> None:
        """A user object's tensor attribute replaced by one of another shape recaptures."""
        obj = Holder(torch.randn(2, 3))

        def changed() -> tuple[Any, ...]:
            obj.w = torch.randn(5, 3)
            return r(3), obj

        assert_guard(UseHolder, lambda: (r(3), obj), changed)

    def test_function_class_redefined(self, capture_log: list[type]) -> None:
        """minihop.apply on a redefined class (same name, new class object) never hits the old entry."""

        class Redefined(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2

        old = Redefined
        assert_matches_eager(lambda *a: minihop.apply(old, *a), old, r(3))
        assert_matches_eager(lambda *a: minihop.apply(old, *a), old, r(3))
        assert capture_log == [old]

        class Redefined(Function):  # type: ignore[no-redef]
            @staticmethod
            def forward(ctx, x):
                return x * 3

            @staticmethod
            def backward(ctx, g):
                return g * 3

        new = Redefined
        assert new is not old and new.__qualname__ == old.__qualname__
        assert_matches_eager(lambda *a: minihop.apply(new, *a), new, r(3))
        assert capture_log == [old, new]

    @pytest.mark.parametrize("method", ["forward", "backward"])
    def test_method_reassigned(self, method: str) -> None:
        """A forward or backward reassigned on the class recaptures and uses the new method."""

        class Tripled(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2

        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 3

        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g * 3

        def changed() -> tuple[Any, ...]:
            setattr(Tripled, method, staticmethod(forward if method == "forward" else backward))
            return (r(3),)

        assert_guard(Tripled, lambda: (r(3),), changed)

    def test_closure_tensor_rebound(self) -> None:
        """A closure tensor rebound to one of the same shape hits and is read anew; another shape recaptures."""
        w = torch.ones(3)

        class UseCell(Function):
            @staticmethod
            def forward(ctx, x):
                return x * w

            @staticmethod
            def backward(ctx, g):
                return g * w.sum(0)

        def rebind(value: torch.Tensor) -> tuple[Any, ...]:
            nonlocal w
            w = value
            return (r(3),)

        cf = assert_guard(UseCell, lambda: (r(3),), lambda: rebind(torch.randn(2, 3)))
        assert_matches_eager(cf.apply, UseCell, *rebind(torch.randn(2, 3)))
        assert counts(cf) == (2, 2)  # same shape, new values: a hit that reads the new tensor

    def test_global_number_rebound(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A global Python number rebound between calls recaptures and uses the new number."""

        def changed() -> tuple[Any, ...]:
            monkeypatch.setattr(sys.modules[__name__], "_FACTOR", 5.0)
            return (r(3),)

        assert_guard(UseGlobalNumber, lambda: (r(3),), changed)

    def test_module_parameter_replaced(self) -> None:
        """A module argument's parameter replaced by one of another shape recaptures; same shape hits."""
        lin = torch.nn.Linear(3, 2)

        def replace(out_features: int) -> tuple[Any, ...]:
            lin.weight = torch.nn.Parameter(torch.randn(out_features, 3))
            lin.bias = torch.nn.Parameter(torch.randn(out_features))
            return r(3), lin

        cf = assert_guard(RunModule, lambda: (r(3), lin), lambda: replace(4))
        assert_matches_eager(cf.apply, RunModule, *replace(4))
        assert counts(cf) == (2, 2)

    # Properties the "tensors reached through objects" and "always right" imply, found
    # unguarded while writing this file.

    def test_tensor_in_slots_object_replaced(self) -> None:
        """A __slots__ object's tensor attribute replaced (same shape, new values) gives eager's answer."""

        class Slotted:
            __slots__ = ("w",)

            def __init__(self, w: torch.Tensor) -> None:
                self.w = w

        obj = Slotted(torch.ones(3))
        cf = minihop.function(UseHolder)
        assert_matches_eager(cf.apply, UseHolder, r(3), obj)
        obj.w = torch.full((3,), 5.0)
        assert_matches_eager(cf.apply, UseHolder, r(3), obj)

    def test_tensor_in_callable_object_changes_shape(self) -> None:
        """A callable object's tensor attribute replaced by one of another shape gives eager's answer."""

        class Scaler:
            def __init__(self, w: torch.Tensor) -> None:
                self.w = w

            def __call__(self, x: torch.Tensor) -> torch.Tensor:
                return x * self.w.sum(0)

        obj = Scaler(torch.ones(2, 3))
        cf = minihop.function(UseHolder)
        assert_matches_eager(cf.apply, UseHolder, r(3), obj)
        obj.w = torch.ones(5, 3)
        assert_matches_eager(cf.apply, UseHolder, r(3), obj)

    def test_strides(self) -> None:
        """A non-contiguous argument of the same shape as a contiguous one gives eager's answer."""

        class Contiguity(Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2 if x.is_contiguous() else x * 3

            @staticmethod
            def backward(ctx, g):
                return g

        cf = minihop.function(Contiguity)
        assert_matches_eager(cf.apply, Contiguity, torch.randn(3, 3))
        assert_matches_eager(cf.apply, Contiguity, torch.randn(3, 3).t())


# ---------------------------------------------------------------------------------------------
# cache_limit: one warning, then eviction ("raise") or eager calls ("eager")
# ---------------------------------------------------------------------------------------------

class TestCacheLimit:
    def test_raise_evicts_oldest(self) -> None:
        """Past cache_limit=8 with fallback="raise" (static shapes): one warning, the oldest entry evicted, results right."""
        cf = minihop.function(Sin, cache_limit=8, dynamic=False)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for n in range(1, 10):
                assert_matches_eager(cf.apply, Sin, r(n))
            assert (cf.stats.captures, cf.stats.evictions, cf.stats.hits) == (9, 1, 0)
            assert len(cf.captures) == 8
            assert_matches_eager(cf.apply, Sin, r(9))  # the newest is still cached
            assert (cf.stats.captures, cf.stats.hits) == (9, 1)
            assert_matches_eager(cf.apply, Sin, r(1))  # the oldest was evicted
            assert (cf.stats.captures, cf.stats.evictions) == (10, 2)
        [message] = limit_warnings(record)
        assert "Sin reached cache_limit=8" in message

    def test_eager_runs_ninth_eagerly(self) -> None:
        """Past cache_limit=8 with fallback="eager" (static shapes): one warning, the 9th key runs eagerly, results right."""
        cf = minihop.function(Sin, fallback="eager", cache_limit=8, dynamic=False)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for n in range(1, 10):
                assert_matches_eager(cf.apply, Sin, r(n))
            assert (cf.stats.captures, cf.stats.eager_calls, cf.stats.evictions) == (8, 1, 0)
            assert_matches_eager(cf.apply, Sin, r(9))
            assert (cf.stats.captures, cf.stats.eager_calls) == (8, 2)
            assert_matches_eager(cf.apply, Sin, r(1))  # still cached
            assert (cf.stats.captures, cf.stats.hits, cf.stats.eager_calls) == (8, 1, 2)
        [message] = limit_warnings(record)
        assert "Sin reached cache_limit=8" in message
        assert "eagerly" in message

    def test_closure_shapes_count_toward_limit(self) -> None:
        """9 shapes of a closure tensor (same arguments) also hit cache_limit=8: one warning, 8 kept."""
        w = torch.ones(1)

        class UseCell(Function):
            @staticmethod
            def forward(ctx, x):
                return x * w

            @staticmethod
            def backward(ctx, g):
                return (g * w).sum(-1, keepdim=True)

        cf = minihop.function(UseCell, cache_limit=8)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for n in range(1, 10):
                w = torch.randn(n)
                assert_matches_eager(cf.apply, UseCell, r(1))
        assert cf.stats.captures == 9
        assert len(limit_warnings(record)) == 1
        assert len(cf.captures) <= 8

    def test_limit_warning_once_per_function(self) -> None:
        """The limit warning is given once per CapturedFunction, not once per new key past it (static shapes)."""
        cf = minihop.function(Double, cache_limit=2, dynamic=False)
        with pytest.warns(UserWarning, match="cache_limit=2") as record:
            for n in range(1, 6):
                assert_matches_eager(cf.apply, Double, r(n))
        assert len(limit_warnings(list(record))) == 1
        assert cf.stats.evictions == 3


# ---------------------------------------------------------------------------------------------
# Failure policy: strict by default, opt-in eager fallback decided once per key
# ---------------------------------------------------------------------------------------------

class TestFailurePolicy:
    def test_apply_is_strict(self, capture_log: list[type]) -> None:
        """minihop.apply on a Function calling .item() raises its MinihopError (MH103)."""
        with pytest.raises(minihop.DataDependentError, match=r"^\[MH103\] Item.forward calls item"):
            minihop.apply(Item, r(3))

    def test_function_default_is_strict(self) -> None:
        """minihop.function(F) without fallback raises the same error."""
        with pytest.raises(minihop.MinihopError, match=r"\[MH103\]"):
            minihop.function(Item).apply(r(3))

    def test_eager_fallback(self, capture_log: list[type]) -> None:
        """fallback="eager" runs F.apply, warns once with the reason, and does not retry the trace."""
        cf = minihop.function(Item, fallback="eager")
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for _ in range(4):
                assert_matches_eager(cf.apply, Item, r(3))
        messages = [str(w.message) for w in record]
        assert len(messages) == 1, messages
        assert "Item" in messages[0] and "fallback='eager'" in messages[0]
        assert "[MH103] Item.forward calls item" in messages[0]
        assert capture_log == [Item]
        assert (cf.stats.captures, cf.stats.eager_calls) == (0, 4)

    def test_eager_fallback_new_key(self, capture_log: list[type]) -> None:
        """A new key under fallback="eager" (static shapes) is tried once more but not warned about again."""
        cf = minihop.function(Item, fallback="eager", dynamic=False)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for n in (3, 4, 3, 4):
                assert_matches_eager(cf.apply, Item, r(n))
        assert len(record) == 1
        assert capture_log == [Item, Item]
        assert cf.stats.eager_calls == 4

    def test_decorator_with_fallback(self) -> None:
        """@captured(fallback="eager") makes F.apply run eagerly with one warning."""
        fn_cls = make_item()
        eager = fn_cls.apply
        eager_cls = make_item()
        minihop.captured(fallback="eager")(fn_cls)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for _ in range(3):
                assert_matches_eager(fn_cls.apply, eager_cls, r(3))
                torch.testing.assert_close(fn_cls.apply(torch.ones(2)), eager(torch.ones(2)))
        assert len(record) == 1 and "[MH103]" in str(record[0].message)
        assert fn_cls.minihop.stats.eager_calls == 6
        assert fn_cls.minihop.stats.captures == 0

    def test_decorator_is_strict(self) -> None:
        """@captured without fallback makes F.apply raise the MinihopError."""
        fn_cls = minihop.captured(make_item())
        with pytest.raises(minihop.DataDependentError, match=r"^\[MH103\]"):
            fn_cls.apply(r(3))

    @pytest.mark.parametrize("entry", ["function", "captured"])
    def test_bogus_fallback(self, entry: str) -> None:
        """fallback="bogus" is a ValueError naming the allowed values."""
        with pytest.raises(ValueError, match="fallback must be 'raise' or 'eager', got 'bogus'"):
            if entry == "function":
                minihop.function(Sin, fallback="bogus")  # type: ignore[arg-type]
            else:
                minihop.captured(fallback="bogus")(make_item())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Concurrency: minihop.apply from 8 threads
# ---------------------------------------------------------------------------------------------

class ThreadSin(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


class ThreadSquare(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x


class ThreadAffine(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3 + 1

    @staticmethod
    def backward(ctx, g):
        return g * 3


class TestConcurrency:
    def test_eight_threads(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """8 threads x 50 calls over 3 Functions x 2 shapes: eager's results, one capture per key (x3)."""
        log: collections.Counter[tuple[type, tuple[int, ...]]] = collections.Counter()
        log_lock = threading.Lock()
        real = minihop.cache.capture

        def slow_counting(fn_cls: type, *args: Any, **kwargs: Any) -> Any:
            with log_lock:
                log[(fn_cls, tuple(args[0].shape))] += 1
            time.sleep(0.02)  # widen the window in which other threads look for the same key
            return real(fn_cls, *args, **kwargs)

        monkeypatch.setattr(minihop.cache, "capture", slow_counting)
        keys = [(f, (n,)) for f in (ThreadSin, ThreadSquare, ThreadAffine) for n in (3, 5)]
        try:
            for _ in range(3):
                minihop.clear_cache()
                log.clear()
                inputs = {key: r(*key[1]) for key in keys}
                expected = {}
                for (fn_cls, shape), x in inputs.items():
                    out = fn_cls.apply(x)
                    expected[(fn_cls, shape)] = (out.detach(), torch.autograd.grad(out.sum(), x)[0])
                errors: list[BaseException] = []
                barrier = threading.Barrier(8)

                def worker(i: int) -> None:
                    try:
                        barrier.wait()
                        for j in range(50):
                            key = keys[(i + j) % len(keys)]
                            x = inputs[key]
                            out = minihop.apply(key[0], x)
                            grad = torch.autograd.grad(out.sum(), x)[0]
                            torch.testing.assert_close(out, expected[key][0])
                            torch.testing.assert_close(grad, expected[key][1])
                    except BaseException as e:  # reported below, with the thread's index
                        errors.append(e)

                threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert errors == []
                assert dict(log) == {key: 1 for key in keys}
        finally:
            minihop.clear_cache()


# ---------------------------------------------------------------------------------------------
# @minihop.captured inside another Function's forward/backward: inlined while tracing
# ---------------------------------------------------------------------------------------------

def make_inner() -> type:
    class Inner(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin() * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x.cos() * 2

    return Inner


def make_outer(inner: type, style: str) -> type:
    def call_inner(x: torch.Tensor) -> torch.Tensor:
        if style == "keyword":
            return inner.apply(x=x)
        return inner.apply(x)

    class Outer(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return call_inner(x) + x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * call_inner(x)

    return Outer


class TestNestedApply:
    @pytest.mark.parametrize("style", ["positional", "keyword"])
    def test_inner_is_inlined(self, capture_log: list[type], style: str) -> None:
        """A @captured Function applied inside another's forward and backward is inlined, not captured."""
        inner = minihop.captured(make_inner())
        outer = make_outer(inner, style)
        eager_outer = make_outer(make_inner(), style)  # all eager, for the reference
        for _ in range(2):
            x = r(4)
            xe = twin(x)
            out = minihop.apply(outer, x)
            expected = eager_outer.apply(xe)
            torch.testing.assert_close(out, expected)
            out.sum().backward()
            expected.sum().backward()
            torch.testing.assert_close(x.grad, xe.grad)
        assert capture_log == [outer]
        assert inner.minihop.stats == minihop.CacheStats()


# ---------------------------------------------------------------------------------------------
# Process-wide counters (issue 4, "Observability")
# ---------------------------------------------------------------------------------------------

class TestCounters:
    def test_counters_and_reset(self) -> None:
        """minihop.counters() totals captures, cache_hits and fallbacks; minihop.reset() clears them."""
        minihop.reset()  # type: ignore[attr-defined]
        minihop.apply(Double, r(3))
        minihop.apply(Double, r(3))
        with pytest.warns(UserWarning, match="MH103"):
            minihop.function(Item, fallback="eager").apply(r(3))
        got = minihop.counters()  # type: ignore[attr-defined]
        assert (got["captures"], got["cache_hits"], got["fallbacks"]) == (1, 1, 1)
        minihop.reset()  # type: ignore[attr-defined]
        assert minihop.counters()["captures"] == 0  # type: ignore[attr-defined]
