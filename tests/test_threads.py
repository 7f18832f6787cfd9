"""Concurrency: minihop's entry points called from 8 threads at once.

8 threads x 500 calls over a mix of Functions (saved tensors, ctx attributes, tuple outputs,
non-tensor arguments, ``set_materialize_grads(False)`` with backward retraced per None pattern)
and shapes, through ``minihop.apply``, ``@minihop.captured`` and a dynamic-shape
``minihop.function``. Every output and gradient equals eager's, computed beforehand; each key
is captured exactly once (counted by wrapping ``minihop.cache.capture``). A second test makes
the first captures of a fresh process race each other. Nothing is timed.
"""

from __future__ import annotations

import collections
import pathlib
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop


class SinSaved(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


class ScaleAndSum(Function):
    """Tuple output with an int, float argument, ctx attributes."""

    @staticmethod
    def forward(ctx, x, scale):
        h = x.tanh()
        ctx.h = h
        ctx.scale = scale
        return h * scale, 7, x.sum(-1, keepdim=True)

    @staticmethod
    def backward(ctx, ga, _none, gs):
        h = ctx.h
        return ga * (1 - h * h) * ctx.scale + gs, None


class NoneAware(Function):
    """materialize_grads off: which grads are None decides the backward variant."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x.exp(), x * 3

    @staticmethod
    def backward(ctx, ga, gb):
        (x,) = ctx.saved_tensors
        grad = torch.zeros_like(x)
        if ga is not None:
            grad = grad + ga * x.exp()
        if gb is not None:
            grad = grad + gb * 3
        return grad


@minihop.captured
class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * g * x * x


class Affine(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x * w + 1

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        return g * w, None


AFFINE = minihop.function(Affine, dynamic={"x": [0]})

SHAPES = ((3,), (2, 4), (5, 2))


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    minihop.clear_cache()
    Cube.minihop.clear()
    AFFINE.clear()
    yield
    minihop.clear_cache()
    Cube.minihop.clear()
    AFFINE.clear()


def warm_up() -> None:
    """One static and one dynamic capture in this thread: torch's lazy imports are done."""
    x = torch.randn(3, 2, requires_grad=True)
    minihop.capture(SinSaved, x)(x).sum().backward()
    minihop.capture(SinSaved, x, dynamic=True)(x).sum().backward()


def eager_apply(fn_cls: type) -> Callable[..., Any]:
    return Cube.minihop._eager_apply if fn_cls is Cube else fn_cls.apply


def make_calls() -> list[tuple[str, Callable[..., Any], Callable[..., Any], tuple[Any, ...], Callable[[Any], torch.Tensor]]]:
    """(name, minihop call, eager call, args, loss) for every case of the mix."""
    gen = torch.Generator().manual_seed(0)
    calls = []
    for shape in SHAPES:
        x = torch.randn(shape, generator=gen)
        calls.append(("sin", lambda *a: minihop.apply(SinSaved, *a), SinSaved.apply, (x,), lambda o: o.sum()))
        for scale in (0.5, 2.0):
            calls.append((f"scale{scale}", lambda *a: minihop.apply(ScaleAndSum, *a), ScaleAndSum.apply,
                          (x, scale), lambda o: (o[0] * 2).sum() + o[2].sum()))
        calls.append(("none-both", lambda *a: minihop.apply(NoneAware, *a), NoneAware.apply, (x,),
                      lambda o: o[0].sum() + o[1].sum()))
        calls.append(("none-first", lambda *a: minihop.apply(NoneAware, *a), NoneAware.apply, (x,),
                      lambda o: o[0].sum()))
        calls.append(("none-second", lambda *a: minihop.apply(NoneAware, *a), NoneAware.apply, (x,),
                      lambda o: o[1].sum()))
        calls.append(("cube", Cube.apply, eager_apply(Cube), (x,), lambda o: o.sum()))
    for n in (2, 3, 6, 9):
        x = torch.randn(n, 3, generator=gen)
        w = torch.randn(3, generator=gen)
        calls.append((f"affine{n}", AFFINE, Affine.apply, (x, w), lambda o: o.sum()))
    return calls


def leaf_copies(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.clone().requires_grad_(True) if isinstance(a, torch.Tensor) else a for a in args)


def run_one(call: Callable[..., Any], args: tuple[Any, ...],
            loss: Callable[[Any], torch.Tensor]) -> tuple[Any, tuple[torch.Tensor | None, ...]]:
    leaves = leaf_copies(args)
    out = call(*leaves)
    tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
    grads = torch.autograd.grad(loss(out), tensors, allow_unused=True)
    return out, grads


def assert_same(mine: Any, eager: Any) -> None:
    if isinstance(eager, torch.Tensor):
        torch.testing.assert_close(mine, eager)
    elif isinstance(eager, tuple):
        assert isinstance(mine, tuple) and len(mine) == len(eager)
        for m, e in zip(mine, eager, strict=True):
            assert_same(m, e)
    else:
        assert mine == eager


def counting_captures(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[Any]:
    """Wrap ``minihop.cache.capture``: count captures per (Function, static key) and widen the race window."""
    log: collections.Counter[Any] = collections.Counter()
    lock = threading.Lock()
    real = minihop.cache.capture

    def counting(fn_cls: type, *args: Any, dynamic: Any = False, **kwargs: Any) -> Any:
        key = tuple(("T", None if dynamic else tuple(a.shape)) if isinstance(a, torch.Tensor) else a
                    for a in args)
        with lock:
            log[(fn_cls.__name__, key)] += 1
        time.sleep(0.01)  # let other threads arrive at the same key meanwhile
        return real(fn_cls, *args, dynamic=dynamic, **kwargs)

    monkeypatch.setattr(minihop.cache, "capture", counting)
    return log


def test_eight_threads_five_hundred_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 threads x 500 calls over a mix of Functions and shapes: eager's outputs and grads, one capture per key."""
    warm_up()
    log = counting_captures(monkeypatch)
    calls = make_calls()
    expected = [run_one(eager, args, loss) for _, _, eager, args, loss in calls]
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def worker(index: int) -> None:
        barrier.wait()
        for j in range(500):
            k = (index * 7 + j * 3) % len(calls)
            name, call, _, args, loss = calls[k]
            try:
                out, grads = run_one(call, args, loss)
                assert_same(out, expected[k][0])
                assert len(grads) == len(expected[k][1])
                for g, e in zip(grads, expected[k][1], strict=True):
                    assert (g is None) == (e is None)
                    if e is not None:
                        torch.testing.assert_close(g, e)
            except Exception as e:  # reported below with the thread and the case
                errors.append(f"thread {index}, call {j} ({name}, shapes "
                              f"{[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}): "
                              f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], f"{len(errors)} failing calls, first ones:\n" + "\n".join(errors[:5])
    twice = {key: n for key, n in log.items() if n != 1}
    assert twice == {}, f"keys captured more than once: {twice}"
    # Automatic dynamic shapes: the first of the two 2-d shapes to arrive (threads race) is
    # captured static, the second symbolic (None); the 1-d shape is always static.
    sizes = (*SHAPES, None)
    expected_keys = {("SinSaved", (("T", s),)) for s in sizes}
    expected_keys |= {("ScaleAndSum", (("T", s), scale)) for s in sizes for scale in (0.5, 2.0)}
    expected_keys |= {("NoneAware", (("T", s),)) for s in sizes}
    expected_keys |= {("Cube", (("T", s),)) for s in sizes}
    expected_keys |= {("Affine", (("T", None), ("T", None)))}  # dynamic: one capture for all sizes
    assert set(log) <= expected_keys
    for name, rest in (("SinSaved", ()), ("ScaleAndSum", (0.5,)), ("ScaleAndSum", (2.0,)),
                       ("NoneAware", ()), ("Cube", ())):
        assert (name, (("T", (3,)), *rest)) in log and (name, (("T", None), *rest)) in log, name
        # (3,), at most one static 2-d shape (the other scale may have made them symbolic), None
        assert sum(1 for f, k in log if (f, k[1:]) == (name, rest)) in (2, 3), name


def test_backward_variants_retraced_from_many_threads() -> None:
    """One capture; 8 threads run its first backwards at once, with different None patterns (each a retrace): eager's grads."""
    x = torch.randn(4)
    minihop.apply(NoneAware, x.clone().requires_grad_())  # captured here, in this thread
    patterns = {0: lambda o: o[0].sum(), 1: lambda o: o[1].sum(), 2: lambda o: o[0].sum() + o[1].sum()}
    expected = {k: run_one(NoneAware.apply, (x,), loss)[1] for k, loss in patterns.items()}
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def worker(index: int) -> None:
        barrier.wait()
        try:
            _, grads = run_one(lambda *a: minihop.apply(NoneAware, *a), (x,), patterns[index % 3])
            torch.testing.assert_close(grads, expected[index % 3])
        except Exception as e:  # reported below
            errors.append(f"thread {index}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


COLD_START = textwrap.dedent("""
    import threading, torch, minihop
    from torch.autograd import Function

    class Affine(Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(w)
            return x * w + 1

        @staticmethod
        def backward(ctx, g):
            (w,) = ctx.saved_tensors
            return g * w, None

    def make(k):
        class Scale(Function):
            @staticmethod
            def forward(ctx, x):
                return x * k

            @staticmethod
            def backward(ctx, g):
                return g * k
        return Scale

    scales = [make(k) for k in range(8)]
    affine = minihop.function(Affine, dynamic={"x": [0]})
    errors = []
    barrier = threading.Barrier(8)

    def worker(i):
        barrier.wait()
        try:
            x = torch.randn(3, 3, requires_grad=True)
            if i % 2:
                out = affine(x, torch.randn(3))
                torch.testing.assert_close(out, Affine.apply(x, torch.randn(3)) * 0 + out)
            else:
                out = minihop.apply(scales[i], x)
                torch.testing.assert_close(out, x * i)
            out.sum().backward()
        except Exception as e:
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("\\n".join(errors) or "ok")
""")


def test_first_captures_of_a_process_race() -> None:
    """In fresh processes, the very first captures (static and dynamic) run from 8 threads at once all succeed."""
    root = pathlib.Path(__file__).resolve().parent.parent
    runs = [subprocess.Popen([sys.executable, "-c", COLD_START], cwd=root, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True) for _ in range(3)]
    results = [run.communicate(timeout=300)[0].strip() for run in runs]
    failures = [r for r in results if r != "ok"]
    assert failures == [], "first captures racing in a fresh process failed:\n" + "\n---\n".join(failures)
