"""Lifetimes: what minihop keeps alive, and for how long.

Saved tensors die after backward as they do in eager; 10,000 fwd+bwd calls hold memory flat; a
capture holds fake values, not the caller's tensors (closed-over constants are the documented
exception: the Function's own closure holds them); ``minihop.clear_cache()`` lets cached
captures die. Liveness is observed with ``weakref``s after ``gc.collect()``; memory with live
tensor counts, gc object counts and RSS, each with a generous bound. Nothing is timed.
"""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    minihop.clear_cache()
    yield
    minihop.clear_cache()


def collected() -> None:
    gc.collect()


def alive(refs: list[weakref.ref[Any]]) -> list[Any]:
    collected()
    return [r() for r in refs if r() is not None]


def tensors_below(value: Any, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Tensors in ``value`` and in the lists, tuples and dicts below it."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_below(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_below(v)]
    return []


def node_attribute_tensors(out: torch.Tensor) -> list[torch.Tensor]:
    """Tensors kept as attributes of ``out``'s grad_fn (eager: the user's ctx attributes)."""
    return [t for v in vars(out.grad_fn).values() for t in tensors_below(v)]


def live_tensor_count() -> int:
    collected()
    # type(), not isinstance(): some module objects warn when asked for their __class__.
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------------------------
# Functions
# ---------------------------------------------------------------------------------------------

class SaveMix(Function):
    """Saves an intermediate with save_for_backward and keeps another as a ctx attribute."""

    @staticmethod
    def forward(ctx, x, w):
        h = x.exp()
        k = x * w
        ctx.save_for_backward(h, w)
        ctx.k = k
        return h * k

    @staticmethod
    def backward(ctx, g):
        h, w = ctx.saved_tensors
        k = ctx.k
        return g * (h * k + h * w), None


class TwoOut(Function):
    """Two outputs; with materialize_grads off, backward is retraced per None pattern."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x.sin() * scale, x.cos()

    @staticmethod
    def backward(ctx, ga, gb):
        (x,) = ctx.saved_tensors
        grad = torch.zeros_like(x)
        if ga is not None:
            grad = grad + ga * x.cos() * ctx.scale
        if gb is not None:
            grad = grad - gb * x.sin()
        return grad, None


class UsesObjects(Function):
    """Reads tensors from a dict, an object and a module argument (all lifted)."""

    @staticmethod
    def forward(ctx, x, params, holder, module):
        y = x * params["w"] + holder.b
        y = module(y)
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return x * g.sum(), None, None, None


class Holder:
    def __init__(self, b: torch.Tensor) -> None:
        self.b = b


# ---------------------------------------------------------------------------------------------
# Saved tensors
# ---------------------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[type, tuple[Any, ...]], Any]] = {
    "eager": lambda fn_cls, args: fn_cls.apply(*args),
    "capture": lambda fn_cls, args: minihop.capture(fn_cls, *args)(*args),
    "apply": lambda fn_cls, args: minihop.apply(fn_cls, *args),
}


class TestSavedTensors:
    @pytest.mark.parametrize("runner", sorted(RUNNERS))
    def test_released_after_backward(self, runner: str) -> None:
        """save_for_backward values die after backward; ctx-attribute values when the output dies (eager's rule, checked on eager too)."""
        x = torch.randn(4, 3, requires_grad=True)
        w = torch.randn(3)
        packed: list[weakref.ref[torch.Tensor]] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            packed.append(weakref.ref(t))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = RUNNERS[runner](SaveMix, (x, w))
        inputs = {id(x), id(w)}
        intermediates_saved = [r for r in packed if r() is not None and id(r()) not in inputs]
        attributes = [weakref.ref(t) for t in node_attribute_tensors(out) if id(t) not in inputs]
        assert intermediates_saved, "the saved intermediate (exp(x)) went through save_for_backward"
        assert attributes, "the ctx attribute (x * w) is kept on the graph node"
        out.sum().backward()
        assert alive(intermediates_saved) == [], "saved tensors outlive backward"
        del out
        assert alive(attributes) == [], "ctx attributes outlive the output"
        refs = [weakref.ref(x), weakref.ref(w)]
        del x, w
        assert alive(refs) == [], "inputs outlive backward and the output"

    @pytest.mark.parametrize("runner", sorted(RUNNERS))
    def test_retraced_backward_releases(self, runner: str) -> None:
        """A backward retraced for a None grad (materialize_grads off) releases what forward saved."""
        x = torch.randn(5, requires_grad=True)
        a, b = RUNNERS[runner](TwoOut, (x, 2.0))
        refs = [weakref.ref(a), weakref.ref(b)]
        a.sum().backward()  # b's grad is None: another backward variant
        torch.testing.assert_close(x.grad, x.detach().cos() * 2.0)
        ref_x = weakref.ref(x)
        del a, b, x
        assert alive(refs) == []
        assert alive([ref_x]) == []


# ---------------------------------------------------------------------------------------------
# Memory over many calls
# ---------------------------------------------------------------------------------------------

class TestManyCalls:
    def test_ten_thousand_calls_hold_memory_flat(self) -> None:
        """10,000 minihop.apply fwd+bwd calls (three Functions, retraced variants too) leave tensor count, gc objects and RSS flat."""
        x = torch.randn(8, 3, requires_grad=True)
        w = torch.randn(3)
        y = torch.randn(6, requires_grad=True)

        def call(i: int) -> None:
            which = i % 3
            if which == 0:
                out = minihop.apply(SaveMix, x, w)
                out.sum().backward()
            elif which == 1:
                a, b = minihop.apply(TwoOut, y, 0.5)
                (a.sum() + b.sum()).backward()
            else:
                a, _ = minihop.apply(TwoOut, y, 0.5)
                a.sum().backward()
            x.grad = None
            y.grad = None

        for i in range(300):  # captures, retraced variants, allocator warm-up
            call(i)
        tensors_before = live_tensor_count()
        objects_before = len(gc.get_objects())
        rss_before = rss_bytes()
        for i in range(10_000):
            call(i)
        tensors_after = live_tensor_count()
        objects_after = len(gc.get_objects())
        rss_after = rss_bytes()
        # A leak of one tensor (or one Python object) per call would add thousands.
        assert tensors_after - tensors_before <= 20, (tensors_before, tensors_after)
        assert objects_after - objects_before <= 2_000, (objects_before, objects_after)
        assert rss_after - rss_before <= 64 * 2**20, (rss_before, rss_after)


# ---------------------------------------------------------------------------------------------
# What a capture keeps
# ---------------------------------------------------------------------------------------------

def object_args() -> tuple[Any, ...]:
    return (torch.randn(2, 3, requires_grad=True), {"w": torch.randn(3)}, Holder(torch.randn(3)),
            torch.nn.Linear(3, 2))


CAPTURERS: dict[str, Callable[[type, tuple[Any, ...]], Any]] = {
    "static": lambda fn_cls, args: minihop.capture(fn_cls, *args),
    "dynamic": lambda fn_cls, args: minihop.capture(fn_cls, *args, dynamic={"x": [0]}),
}


class TestCaptureHoldsNoInputs:
    @pytest.mark.parametrize("how", sorted(CAPTURERS))
    def test_tensor_arguments_die(self, how: str) -> None:
        """Tensor arguments (direct, in a dict, in an object) die after del while the capture lives."""
        x = torch.randn(4, 3, requires_grad=True)
        w = torch.randn(3)
        cap = CAPTURERS[how](SaveMix, (x, w))
        refs = [weakref.ref(x), weakref.ref(w)]
        del x, w
        assert alive(refs) == []
        x2 = torch.randn(4, 3, requires_grad=True)
        w2 = torch.randn(3)
        torch.testing.assert_close(cap(x2, w2), SaveMix.apply(x2, w2))

    @pytest.mark.parametrize("how", sorted(CAPTURERS))
    def test_lifted_arguments_die(self, how: str) -> None:
        """Tensors reached through a dict, an object and a module argument die with them, the capture alive."""
        x, params, holder, module = object_args()
        cap = CAPTURERS[how](UsesObjects, (x, params, holder, module))
        refs = [weakref.ref(t) for t in (x, params["w"], holder.b, module.weight, module.bias)]
        refs += [weakref.ref(holder), weakref.ref(module)]
        del x, params, holder, module
        assert alive(refs) == []
        assert cap.fwd is not None  # the capture itself lives on

    def test_materialize_false_capture_holds_no_inputs(self) -> None:
        """A capture that may retrace backward (materialize_grads off) keeps fakes only."""
        x = torch.randn(5, requires_grad=True)
        cap = minihop.capture(TwoOut, x, 2.0)
        ref = weakref.ref(x)
        del x
        assert alive([ref]) == []
        x2 = torch.randn(5, requires_grad=True)
        a, _ = cap(x2, 2.0)
        a.sum().backward()  # a None grad: retraced from the capture's fake arguments
        torch.testing.assert_close(x2.grad, x2.detach().cos() * 2.0)

    def test_cached_capture_holds_no_inputs(self) -> None:
        """minihop.apply's cached capture does not keep the arguments of the call that made it."""
        x = torch.randn(4, 3, requires_grad=True)
        w = torch.randn(3)
        minihop.apply(SaveMix, x, w).sum().backward()
        refs = [weakref.ref(x), weakref.ref(w)]
        del x, w
        assert alive(refs) == []

    def test_closed_over_constant_is_read_each_call(self) -> None:
        """The documented exception: a closed-over tensor lives in the Function's closure, and is read anew each call."""
        bias = torch.ones(3)

        class AddBias(Function):
            @staticmethod
            def forward(ctx, x):
                return x + bias

            @staticmethod
            def backward(ctx, g):
                return g

        x = torch.randn(3, requires_grad=True)
        cap = minihop.capture(AddBias, x)
        bias.add_(1)  # eager reads the current value on each call; so does the capture
        torch.testing.assert_close(cap(x), x + 2)


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------

def recording_captures(monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[Any]]:
    """Wrap ``minihop.cache.capture`` to keep a weakref to every capture the cache makes."""
    made: list[weakref.ref[Any]] = []
    real = minihop.cache.capture

    def record(fn_cls: type, *args: Any, **kwargs: Any) -> Any:
        cap = real(fn_cls, *args, **kwargs)
        made.append(weakref.ref(cap))
        return cap

    monkeypatch.setattr(minihop.cache, "capture", record)
    return made


def make_function_class() -> type:
    class Local(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * g * x

    return Local


class TestCache:
    def test_clear_cache_lets_captures_die(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """minihop.clear_cache() drops apply's captures: their weakrefs die."""
        made = recording_captures(monkeypatch)
        x = torch.randn(3, requires_grad=True)
        minihop.apply(SaveMix, torch.randn(2, 3, requires_grad=True), torch.randn(3)).sum().backward()
        minihop.apply(TwoOut, x, 1.0)[0].sum().backward()
        minihop.apply(TwoOut, x, 2.0)[0].sum().backward()
        assert len(made) == 3
        assert len(alive(made)) == 3, "the cache holds its captures"
        minihop.clear_cache()
        assert alive(made) == []

    def test_function_clear_lets_captures_die(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """CapturedFunction.clear() drops that Function's captures."""
        made = recording_captures(monkeypatch)
        square = minihop.function(make_function_class())
        square(torch.randn(3, requires_grad=True)).sum().backward()
        square(torch.randn(4, requires_grad=True)).sum().backward()
        assert len(alive(made)) == 2
        square.clear()
        assert alive(made) == []

    def test_unused_function_class_dies(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A Function class used through minihop.apply is collected once the user drops it (apply's cache is weak on the class), and its captures with it."""
        made = recording_captures(monkeypatch)
        local = make_function_class()
        minihop.apply(local, torch.randn(3, requires_grad=True)).sum().backward()
        refs = [weakref.ref(local)]
        del local
        assert alive(refs) == [], "minihop.apply's cache keeps an unused Function class alive"
        assert alive(made) == []
