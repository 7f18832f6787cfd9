"""Python state a Function reads and writes (tracer/pystate.py), against eager.

Every case runs one sequence of calls three times, each on freshly reset state: with eager
``F.apply``, with strict ``minihop.apply``, and with ``minihop.function(F, fallback="eager")``;
outputs, every input's ``.grad`` and the Python state after each step must be eager's. A
sequence changes the state between calls and between forward and ``.backward()`` the way a
user's program would (a scale set on the class, a config object, a global, a closure).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

import minihop

# ---- state the Functions below read and write (reset before each run) ----------------------

SCALE = 2.0
DEBUG = False
CALLS = 0
LOG: list[Any] = []
HISTORY: list[Any] = []


class Config:
    def __init__(self, scale: float = 2.0) -> None:
        self.scale = scale
        self.calls = 0


class Recorder:
    last_size: int | None = None


RECORDER = Recorder()
settings = types.ModuleType("user_settings")  # a user's own settings module
settings.FACTOR = 2.0
sys.modules["user_settings"] = settings


def _factor() -> float:
    return settings.FACTOR  # a helper: its reads count as forward's


def reset() -> None:
    global SCALE, DEBUG, CALLS
    SCALE, DEBUG, CALLS = 2.0, False, 0
    LOG.clear()
    HISTORY.clear()
    RECORDER.last_size = None
    settings.FACTOR = 2.0
    ClassScale.scale = 2.0
    ClassCounter.calls = 0
    minihop.reset()


# ---- the user's Functions ----------------------------------------------------------------

class ClassScale(torch.autograd.Function):
    """A scale set on the Function's class (a mode flag or a hyperparameter)."""

    scale = 2.0

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin() * ClassScale.scale

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos() * ClassScale.scale


class ConfigScale(torch.autograd.Function):
    """Reads ``cfg.scale`` in forward, and in backward through ``ctx.cfg``."""

    @staticmethod
    def forward(ctx, x, cfg):
        ctx.cfg = cfg
        return x * cfg.scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.cfg.scale, None


class GlobalScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * SCALE

    @staticmethod
    def backward(ctx, g):
        return g * SCALE


class StashedScale(torch.autograd.Function):
    """Forward keeps the global's value on ctx: backward must use that one, not today's."""

    @staticmethod
    def forward(ctx, x):
        ctx.s = SCALE
        return x * SCALE

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s * SCALE


class ModuleScale(torch.autograd.Function):
    """Reads a user module's attribute directly and through a helper function."""

    @staticmethod
    def forward(ctx, x):
        return x * settings.FACTOR + _factor()

    @staticmethod
    def backward(ctx, g):
        return g * _factor()


def make_closure_scaled() -> tuple[type, Callable[[float], None]]:
    scale = 2.0

    class ClosureScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * scale

        @staticmethod
        def backward(ctx, g):
            return g * scale

    def set_scale(value: float) -> None:
        nonlocal scale
        scale = value

    return ClosureScale, set_scale


class ClassCounter(torch.autograd.Function):
    """Counts its forward and backward calls on the class."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        ClassCounter.calls += 1
        return x * 2

    @staticmethod
    def backward(ctx, g):
        ClassCounter.calls += 10
        return g * 2


class ConfigCounter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cfg):
        cfg.calls += 1
        return x * cfg.scale

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class Logs(torch.autograd.Function):
    """Logs what ran, with the shape it saw."""

    @staticmethod
    def forward(ctx, x):
        LOG.append(("forward", x.shape[0]))
        return x.exp()

    @staticmethod
    def backward(ctx, g):
        LOG.append("backward")
        return g


class RecordsSize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        RECORDER.last_size = x.shape[0]
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class GlobalCounter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        global CALLS
        CALLS += 1
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Prints(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        print("forward", tuple(x.shape))
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class DebugPrints(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if DEBUG:
            print("forward", tuple(x.shape))
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class KeepsHistory(torch.autograd.Function):
    """Appends a dict (an object minihop cannot repeat) to a global list."""

    @staticmethod
    def forward(ctx, x):
        HISTORY.append({"shape": x.shape})
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class SpikeWithSurrogate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        soft = x.sigmoid()
        hard = (soft > 0.5).to(x.dtype)
        hard._soft = soft
        return hard

    @staticmethod
    def backward(ctx, g):
        return g


class StashesActivation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, stash):
        stash.append(x * 10)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class Holder:
    t: torch.Tensor | None = None


class CachesOnHolder(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, holder):
        holder.t = x * 10
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class RunningMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, running):
        running.mul_(0.5).add_(x.detach().mean())
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


# ---- the harness ---------------------------------------------------------------------------

Apply = Callable[..., Any]
Sequence = Callable[[Apply], list[Any]]


def _eager(fn_cls: type, *args: Any) -> Any:
    return fn_cls.apply(*args)


def _strict(fn_cls: type, *args: Any) -> Any:
    return minihop.apply(fn_cls, *args)


_FALLBACKS: dict[type, Any] = {}


def _fallback(fn_cls: type, *args: Any) -> Any:
    found = _FALLBACKS.get(fn_cls)
    if found is None:
        found = _FALLBACKS[fn_cls] = minihop.function(fn_cls, fallback="eager")
    return found(*args)


def record(*values: Any) -> list[Any]:
    """Values to compare, tensors detached and cloned (later calls must not change them)."""
    return [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in values]


def run_three_ways(sequence: Sequence, *, refused: bool = False) -> dict[str, list[Any]]:
    """``sequence`` with eager, strict minihop and fallback minihop, each on reset state;
    asserts that fallback equals eager, and strict too unless ``refused`` (then strict must
    raise ``SideEffectError``). Returns each run's record."""
    runs: dict[str, list[Any]] = {}
    for name, apply in (("eager", _eager), ("strict", _strict), ("fallback", _fallback)):
        reset()
        _FALLBACKS.clear()
        if name == "strict" and refused:
            with pytest.raises(minihop.SideEffectError):
                sequence(apply)
            continue
        runs[name] = sequence(apply)
    for name in ("strict", "fallback"):
        if name in runs:
            assert_same(runs[name], runs["eager"], name)
    return runs


def assert_same(found: Any, expected: Any, where: str) -> None:
    """Tensors equal in values and dtype (``assert_close``), everything else ``==``."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(found, torch.Tensor), f"{where}: {found!r} is not a tensor"
        torch.testing.assert_close(found, expected, msg=lambda m: f"{where}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert type(found) is type(expected) and len(found) == len(expected), f"{where}: {found!r} != {expected!r}"
        for i, (f, e) in enumerate(zip(found, expected, strict=True)):
            assert_same(f, e, f"{where}[{i}]")
    else:
        assert found == expected, f"{where}: {found!r} != {expected!r}"


def steps(fn_cls: type, apply: Apply, values: list[tuple[Callable[[], None], Callable[[], None]]],
          make_args: Callable[[], tuple[Any, ...]]) -> list[Any]:
    """Per step: set the state for forward, call, set the state for backward, backward;
    records outputs, grads and Python state seen after each."""
    out: list[Any] = []
    for before_forward, before_backward in values:
        args = make_args()
        before_forward()
        y = apply(fn_cls, *args)
        before_backward()
        y.sum().backward()
        out.append(record(y, *(a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad)))
    return out


def x() -> torch.Tensor:
    return torch.arange(1.0, 4.0).requires_grad_()


def setter(target: Any, name: str, value: Any) -> Callable[[], None]:
    return lambda: setattr(target, name, value)


def nothing() -> None:
    return None


def set_global(name: str, value: Any) -> Callable[[], None]:
    return lambda: globals().__setitem__(name, value)


# ---- reads --------------------------------------------------------------------------------

class TestGuardedReads:
    def test_class_attribute_changed_between_calls(self) -> None:
        """A class attribute changed between calls is seen by the next call (a new capture
        for a new value; the first capture reused when the value comes back)."""
        values = [(setter(ClassScale, "scale", v), nothing) for v in (2.0, 3.0, 2.0)]
        run_three_ways(lambda apply: steps(ClassScale, apply, values, lambda: (x(),)))
        reset()
        steps(ClassScale, _strict, values, lambda: (x(),))
        assert minihop.counters()["captures"] == 2 and minihop.counters()["cache_hits"] == 1

    def test_argument_attribute_changed_between_calls(self) -> None:
        """An argument object's attribute changed between calls."""
        cfg = Config()
        values = [(setter(cfg, "scale", v), nothing) for v in (2.0, 3.0, 2.0)]
        run_three_ways(lambda apply: steps(ConfigScale, apply, values, lambda: (x(), cfg)))

    def test_global_changed_between_calls(self) -> None:
        """A module global rebound between calls."""
        values = [(set_global("SCALE", v), nothing) for v in (2.0, 3.0, 2.0)]
        run_three_ways(lambda apply: steps(GlobalScale, apply, values, lambda: (x(),)))

    def test_closure_cell_changed_between_calls(self) -> None:
        """A closure variable rebound between calls (``nonlocal``)."""
        fn_cls, set_scale = make_closure_scaled()

        def sequence(apply: Apply) -> list[Any]:
            set_scale(2.0)
            values = [(lambda v=v: set_scale(v), nothing) for v in (2.0, 3.0, 2.0)]
            return steps(fn_cls, apply, values, lambda: (x(),))

        run_three_ways(sequence)

    def test_user_module_attribute_and_helper(self) -> None:
        """A user module's attribute, read directly and by a helper function forward calls."""
        values = [(setter(settings, "FACTOR", v), nothing) for v in (2.0, 5.0, 2.0)]
        run_three_ways(lambda apply: steps(ModuleScale, apply, values, lambda: (x(),)))

    def test_unchanged_reads_hit(self) -> None:
        """Guards do not cost recaptures while nothing changes."""
        reset()
        for _ in range(4):
            minihop.apply(GlobalScale, x()).sum().backward()
        assert minihop.counters() == {"captures": 1, "cache_hits": 3, "fallbacks": 0, "internal_errors": 0}

    def test_explain_lists_reads(self) -> None:
        """``explain`` names each Python value read and the method that reads it."""
        reset()
        report = str(minihop.explain(ClassScale, x()))
        assert "ClassScale.scale" in report and "forward" in report and "backward" in report


class TestReadsBeforeBackward:
    def test_class_attribute_changed_before_backward(self) -> None:
        """Set after forward, before ``.backward()``: backward sees the new value."""
        values = [(setter(ClassScale, "scale", 2.0), setter(ClassScale, "scale", b)) for b in (3.0, 2.0, 5.0)]
        run_three_ways(lambda apply: steps(ClassScale, apply, values, lambda: (x(),)))

    def test_argument_attribute_changed_before_backward(self) -> None:
        """``ctx.cfg.scale`` read by backward after the caller changed ``cfg.scale``."""
        cfg = Config()
        values = [(setter(cfg, "scale", 2.0), setter(cfg, "scale", b)) for b in (3.0, 2.0, 7.0)]
        run_three_ways(lambda apply: steps(ConfigScale, apply, values, lambda: (x(), cfg)))

    def test_argument_object_is_the_calls_own(self) -> None:
        """Two config objects: backward reads the one its own call got."""
        a, b = Config(2.0), Config(2.0)

        def sequence(apply: Apply) -> list[Any]:
            a.scale = b.scale = 2.0
            xa, xb = x(), x()
            ya = apply(ConfigScale, xa, a)
            yb = apply(ConfigScale, xb, b)
            b.scale = 9.0
            ya.sum().backward()
            yb.sum().backward()
            return record(ya, yb, xa.grad, xb.grad)

        run_three_ways(sequence)

    def test_global_changed_before_backward(self) -> None:
        values = [(set_global("SCALE", 2.0), set_global("SCALE", b)) for b in (3.0, 2.0, 3.0)]
        run_three_ways(lambda apply: steps(GlobalScale, apply, values, lambda: (x(),)))

    def test_value_forward_kept_on_ctx(self) -> None:
        """Backward reads both forward's kept value (``ctx.s``, the old one) and today's."""
        values = [(set_global("SCALE", 2.0), set_global("SCALE", b)) for b in (3.0, 4.0)]
        runs = run_three_ways(lambda apply: steps(StashedScale, apply, values, lambda: (x(),)))
        torch.testing.assert_close(runs["eager"][0][1], torch.full((3,), 6.0))  # 2 * 3, not 3 * 3

    def test_closure_cell_changed_before_backward(self) -> None:
        fn_cls, set_scale = make_closure_scaled()

        def sequence(apply: Apply) -> list[Any]:
            values = [(lambda: set_scale(2.0), lambda v=v: set_scale(v)) for v in (3.0, 2.0)]
            return steps(fn_cls, apply, values, lambda: (x(),))

        run_three_ways(sequence)


# ---- writes -------------------------------------------------------------------------------

def n_calls(fn_cls: type, n: int, make_args: Callable[[], tuple[Any, ...]],
            state: Callable[[], Any]) -> Callable[[Apply], list[Any]]:
    """N forward+backward calls, recording the Python state after each forward and backward."""
    def sequence(apply: Apply) -> list[Any]:
        out: list[Any] = []
        for _ in range(n):
            args = make_args()
            y = apply(fn_cls, *args)
            out.append(record(y, state()))
            y.sum().backward()
            out.append(record(state()))
        return out

    return sequence


class TestSideEffects:
    def test_class_counter(self) -> None:
        """``ClassCounter.calls += 1`` in forward and ``+= 10`` in backward, N calls."""
        run_three_ways(n_calls(ClassCounter, 4, lambda: (x(),), lambda: ClassCounter.calls))
        reset()
        n_calls(ClassCounter, 4, lambda: (x(),), lambda: 0)(_strict)
        assert minihop.counters()["captures"] == 1 and minihop.counters()["cache_hits"] == 3
        assert ClassCounter.calls == 44

    def test_argument_counter(self) -> None:
        """``cfg.calls += 1`` on an argument object (left out of the key: the capture hits)."""
        cfg = Config()

        def sequence(apply: Apply) -> list[Any]:
            cfg.calls = 0
            return n_calls(ConfigCounter, 4, lambda: (x(), cfg), lambda: cfg.calls)(apply)

        run_three_ways(sequence)
        reset()
        cfg.calls = 0
        n_calls(ConfigCounter, 4, lambda: (x(), cfg), lambda: 0)(_strict)
        assert cfg.calls == 4 and minihop.counters()["cache_hits"] == 3

    def test_log_append(self) -> None:
        """Python values appended to a global list, in forward and in backward."""
        run_three_ways(n_calls(Logs, 3, lambda: (x(),), lambda: list(LOG)))

    def test_attribute_on_outside_object(self) -> None:
        """``RECORDER.last_size = x.shape[0]``, with sizes changing between calls."""
        def sequence(apply: Apply) -> list[Any]:
            out = []
            for n in (3, 4, 3, 5):
                RECORDER.last_size = None
                y = apply(RecordsSize, torch.ones(n, requires_grad=True))
                out.append(record(y, RECORDER.last_size))
            return out

        run_three_ways(sequence)

    def test_global_assignment(self) -> None:
        """``global CALLS; CALLS += 1``: a counter in a global, replayed."""
        run_three_ways(n_calls(GlobalCounter, 3, lambda: (x(),), lambda: CALLS))

    def test_capture_alone_changes_nothing(self) -> None:
        """Tracing undoes its own writes: ``minihop.capture`` leaves the counters as they were."""
        reset()
        minihop.capture(ClassCounter, x())
        minihop.capture(Logs, x())
        assert ClassCounter.calls == 0 and LOG == []

    def test_print(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A print that runs is refused in strict mode; fallback prints as eager does."""
        reset()
        with pytest.raises(minihop.SideEffectError,
                           match=r"\[MH106\] Prints\.forward calls `print` \(line \d+\)"):
            minihop.apply(Prints, x())
        assert capsys.readouterr().out == ""  # tracing printed nothing
        Prints.apply(x())
        eager = capsys.readouterr().out
        with pytest.warns(UserWarning, match="eagerly"):
            minihop.function(Prints, fallback="eager")(x())
        assert capsys.readouterr().out == eager == "forward (3,)\n"

    def test_debug_print_disabled_captures(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``if DEBUG: print(...)`` with DEBUG off captures; turning DEBUG on is a guard miss,
        and that capture (which would print) is refused."""
        run_three_ways(n_calls(DebugPrints, 2, lambda: (x(),), lambda: None))
        assert capsys.readouterr().out == ""
        reset()
        minihop.apply(DebugPrints, x())
        global DEBUG
        DEBUG = True
        with pytest.raises(minihop.SideEffectError, match="calls `print`"):
            minihop.apply(DebugPrints, x())
        DEBUG = False

    def test_unreplayable_write_refused(self) -> None:
        """Appending a dict (an object it made) is refused, naming the list and the line;
        fallback runs eagerly and leaves eager's state."""
        with pytest.raises(minihop.SideEffectError,
                           match=r"\[MH106\] KeepsHistory\.forward appends objects minihop cannot "
                                 r"repeat to HISTORY"):
            reset()
            minihop.capture(KeepsHistory, x())
        assert HISTORY == []
        run_three_ways(n_calls(KeepsHistory, 3, lambda: (x(),), lambda: len(HISTORY)), refused=True)


# ---- tensors leaving forward other than as its outputs --------------------------------------

class TestTensorsLeavingForward:
    def test_output_attribute(self) -> None:
        """``hard._soft = soft``: the real output carries the attribute, on every call."""
        def sequence(apply: Apply) -> list[Any]:
            out = []
            for _ in range(3):
                a = x()
                y = apply(SpikeWithSurrogate, a)
                out.append(record(y, y._soft, y._soft.requires_grad))
            return out

        run_three_ways(sequence)

    def test_tensor_into_list_argument(self) -> None:
        """``stash.append(x * 10)`` into the caller's list, every call."""
        def sequence(apply: Apply) -> list[Any]:
            stash: list[Any] = []
            for _ in range(3):
                apply(StashesActivation, x(), stash)
            return record(*stash, len(stash), [t.requires_grad for t in stash])

        run_three_ways(sequence)

    def test_tensor_onto_argument_object(self) -> None:
        """``holder.t = x * 10`` on the caller's object."""
        def sequence(apply: Apply) -> list[Any]:
            holder = Holder()
            out = []
            for k in range(3):
                a = torch.full((3,), float(k), requires_grad=True)
                apply(CachesOnHolder, a, holder)
                out.append(record(holder.t, type(holder.t).__name__))
            return out

        run_three_ways(sequence)


class TestUnreturnedBuffer:
    def test_inplace_update_without_mark_dirty(self) -> None:
        """A running-mean buffer updated in place, not returned, not marked dirty."""
        def sequence(apply: Apply) -> list[Any]:
            running = torch.zeros(())
            out = []
            for _ in range(3):
                a = x()
                y = apply(RunningMean, a, running)
                y.sum().backward()
                out.append(record(y, a.grad, running, running._version))
            return out

        run_three_ways(sequence)


# ---- written the way real packages write them ------------------------------------------------

SLOPE = 25.0
STATS: dict[str, int] = {"forward": 0, "backward": 0}


def custom_fast_sigmoid(input_, grad_input, spikes):
    # snntorch's documented custom surrogate, with its hyperparameter in a global
    return grad_input / (SLOPE * torch.abs(input_) + 1.0) ** 2


class CustomSurrogate(torch.autograd.Function):
    """As snntorch's ``surrogate.CustomSurrogate``: a user function on ctx, called by backward."""

    @staticmethod
    def forward(ctx, input_, custom_surrogate_function):
        out = (input_ > 0).float()
        ctx.save_for_backward(input_, out)
        ctx.custom_surrogate_function = custom_surrogate_function
        return out

    @staticmethod
    def backward(ctx, grad_output):
        input_, out = ctx.saved_tensors
        custom_surrogate_function = ctx.custom_surrogate_function
        grad_input = grad_output.clone()
        grad = custom_surrogate_function(input_, grad_input, out)
        return grad, None


class ATan(torch.autograd.Function):
    """As snntorch's ``ATan``/spikingjelly's surrogates: the hyperparameter comes as an argument
    from a closure factory (``atan(alpha)``) and is kept on ctx."""

    @staticmethod
    def forward(ctx, input_, alpha=2.0):
        ctx.save_for_backward(input_)
        ctx.alpha = alpha
        return (input_ > 0).float()

    @staticmethod
    def backward(ctx, grad_output):
        (input_,) = ctx.saved_tensors
        grad = ctx.alpha / 2 / (1 + (torch.pi / 2 * ctx.alpha * input_).pow_(2)) * grad_output
        return grad, None


def atan(alpha: float = 2.0) -> Callable[[torch.Tensor], torch.Tensor]:
    def inner(x: torch.Tensor) -> torch.Tensor:
        return minihop.apply(ATan, x, alpha)
    return inner


class Profiled(torch.autograd.Function):
    """Profiling code that counts calls in a module-level dict."""

    @staticmethod
    def forward(ctx, x):
        STATS["forward"] += 1
        return x.tanh()

    @staticmethod
    def backward(ctx, g):
        STATS["backward"] += 1
        return g


class TestRealPackageStyles:
    def test_custom_surrogate_reads_a_global(self) -> None:
        """The user's surrogate function passed in (snntorch style) reads a global that changes
        between calls and before backward: its reads are guarded like backward's own."""
        global SLOPE

        def sequence(apply: Apply) -> list[Any]:
            global SLOPE
            out = []
            for fwd, bwd in ((25.0, 25.0), (25.0, 5.0), (1.0, 1.0)):
                SLOPE = fwd
                a = torch.linspace(-1, 1, 5, requires_grad=True)
                y = apply(CustomSurrogate, a, custom_fast_sigmoid)
                SLOPE = bwd
                y.sum().backward()
                out.append(record(y, a.grad))
            return out

        run_three_ways(sequence)
        SLOPE = 25.0

    def test_atan_factory(self) -> None:
        """``atan(alpha)`` closures with different alphas: one capture each, reused."""
        reset()
        for alpha in (2.0, 4.0, 2.0):
            a = torch.linspace(-1, 1, 5, requires_grad=True)
            atan(alpha)(a).sum().backward()
            e = torch.linspace(-1, 1, 5, requires_grad=True)
            ATan.apply(e, alpha).sum().backward()
            torch.testing.assert_close(a.grad, e.grad)
        assert minihop.counters()["captures"] == 2

    def test_dict_counters(self) -> None:
        """``STATS["forward"] += 1`` in forward and backward: replayed, the capture hits."""
        def sequence(apply: Apply) -> list[Any]:
            STATS.update(forward=0, backward=0)
            return n_calls(Profiled, 3, lambda: (x(),), lambda: dict(STATS))(apply)

        run_three_ways(sequence)
        reset()
        sequence(_strict)
        assert minihop.counters()["captures"] == 1 and STATS == {"forward": 3, "backward": 3}


# ---- state in library objects that only hold the user's values, and the environment -------

LOCAL = threading.local()
OPTIONS = argparse.Namespace(scale=2.0, calls=0)


class ThreadLocalCounter(torch.autograd.Function):
    """Counts its calls on a ``threading.local`` (per-thread state a training loop keeps)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        LOCAL.calls += 1
        return x * LOCAL.calls

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class OptionsCounter(torch.autograd.Function):
    """Reads a scale from parsed command-line options and counts its calls there."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        OPTIONS.calls += 1
        return x * OPTIONS.scale + OPTIONS.calls

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * OPTIONS.scale


class EnvironmentScale(torch.autograd.Function):
    """Reads a setting from the environment, the way a config flag is often read."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.scale = float(os.environ.get("MINIHOP_TEST_SCALE", "1"))
        return x * ctx.scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * ctx.scale


def _set_environ(value: str) -> Callable[[], None]:
    return lambda: os.environ.__setitem__("MINIHOP_TEST_SCALE", value)


class TestLibraryHolders:
    def test_thread_local_counter(self) -> None:
        """A counter on a ``threading.local``: counted on every call, as eager does (tracing
        used to leave its own increment behind, and the capture never counted again)."""

        def sequence(apply: Apply) -> list[Any]:
            LOCAL.calls = 0
            out = steps(ThreadLocalCounter, apply, [(nothing, nothing)] * 3, lambda: (x(),))
            return [*out, LOCAL.calls]

        runs = run_three_ways(sequence)
        assert runs["strict"][-1] == 3

    def test_argparse_namespace_read_and_counter(self) -> None:
        """Options in an ``argparse.Namespace``: a changed scale is seen, calls are counted."""

        def sequence(apply: Apply) -> list[Any]:
            OPTIONS.calls = 0
            values = [(setter(OPTIONS, "scale", v), nothing) for v in (2.0, 3.0, 2.0)]
            return [*steps(OptionsCounter, apply, values, lambda: (x(),)), OPTIONS.calls]

        runs = run_three_ways(sequence)
        assert runs["strict"][-1] == 3

    def test_capture_leaves_thread_local_as_it_was(self) -> None:
        """Tracing's own increment is taken back (a thread-local needs its own setattr)."""
        LOCAL.calls = 5
        minihop.capture(ThreadLocalCounter, x())
        assert LOCAL.calls == 5


class TestEnvironment:
    def test_environment_changed_between_calls(self) -> None:
        """``os.environ.get`` is a read like a global's: a changed variable is seen."""
        values = [(_set_environ(v), nothing) for v in ("2", "3", "2")]
        try:
            run_three_ways(lambda apply: steps(EnvironmentScale, apply, values, lambda: (x(),)))
        finally:
            os.environ.pop("MINIHOP_TEST_SCALE", None)

    def test_environment_read_is_a_listed_guard(self) -> None:
        """``explain`` lists the environment among the reads a call must match."""
        text = str(minihop.explain(EnvironmentScale, x()))
        assert "the environment (os.environ) read by forward" in text


# ---- reads and writes inside nested code, and a mutable default ------------------------------

class ScaleInGenerator(torch.autograd.Function):
    """The global is read only inside a generator expression (its own code object)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * sum(SCALE for _ in range(2))

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * sum(SCALE for _ in range(2))


class ScaleInComprehension(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * [SCALE for _ in range(1)][0]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * [SCALE for _ in range(1)][0]


class ScaleInInnerFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        def scale() -> float:
            return SCALE

        get = lambda: scale()  # noqa: E731
        return x * get()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * (lambda: SCALE)()


class CountsInDefault(torch.autograd.Function):
    """A mutable default argument as a call counter (``seen=[]``): the same list every call."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seen: list[float] = []) -> torch.Tensor:  # noqa: B006
        seen.append(1.0)
        return x * len(seen)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g


class TestNestedCode:
    @pytest.mark.parametrize("fn_cls", [ScaleInGenerator, ScaleInComprehension, ScaleInInnerFunction],
                             ids=lambda c: c.__name__)
    def test_global_read_in_nested_code(self, fn_cls: type) -> None:
        """A global read inside a generator expression, comprehension, lambda or inner def
        (code objects of their own) is guarded like one read directly, forward and backward."""
        values = [(set_global("SCALE", v), set_global("SCALE", v + 0.5)) for v in (2.0, 3.0, 2.0)]
        run_three_ways(lambda apply: steps(fn_cls, apply, values, lambda: (x(),)))

    def test_mutable_default_counts(self) -> None:
        """A default list the call does not pass is state: appended to and read on every call."""
        seen = CountsInDefault.forward.__defaults__[0]

        def sequence(apply: Apply) -> list[Any]:
            seen.clear()
            return [*steps(CountsInDefault, apply, [(nothing, nothing)] * 3, lambda: (x(),)), len(seen)]

        runs = run_three_ways(sequence)
        assert runs["strict"][-1] == 3


# ---- reads through the user's methods and globals() -----------------------------------------

class Settings:
    """Settings read through a classmethod and a method, the way config classes are used."""

    slope = 2.0

    def __init__(self) -> None:
        self.gain = 2.0

    @classmethod
    def current_slope(cls) -> float:
        return cls.slope

    def current_gain(self) -> float:
        return self.gain


SETTINGS = Settings()


class SlopeFromClassmethod(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * Settings.current_slope()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * Settings.current_slope()


class GainFromMethod(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * SETTINGS.current_gain()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * SETTINGS.current_gain()


class ScaleFromGlobalsDict(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * globals()["SCALE"]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * globals()["SCALE"]


class TestIndirectReads:
    def test_classmethod_reads_class_attribute(self) -> None:
        """``cls.slope`` read inside a classmethod the Function calls is guarded."""
        values = [(setter(Settings, "slope", v), setter(Settings, "slope", v + 1)) for v in (2.0, 3.0, 2.0)]
        try:
            run_three_ways(lambda apply: steps(SlopeFromClassmethod, apply, values, lambda: (x(),)))
        finally:
            Settings.slope = 2.0

    def test_method_reads_global_object_attribute(self) -> None:
        """``self.gain`` read inside a method of a global object is guarded."""
        values = [(setter(SETTINGS, "gain", v), setter(SETTINGS, "gain", v + 1)) for v in (2.0, 3.0, 2.0)]
        run_three_ways(lambda apply: steps(GainFromMethod, apply, values, lambda: (x(),)))

    def test_globals_subscript(self) -> None:
        """``globals()["SCALE"]`` is a read of ``SCALE``."""
        values = [(set_global("SCALE", v), set_global("SCALE", v + 1)) for v in (2.0, 3.0, 2.0)]
        run_three_ways(lambda apply: steps(ScaleFromGlobalsDict, apply, values, lambda: (x(),)))


# ---- Python attributes set on tensors --------------------------------------------------------

SCALED = torch.ones(3)
SCALED.gain = 2.0


class AttributeScale(torch.autograd.Function):
    """Reads a Python attribute its input tensor carries (as frameworks tag parameters)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.scale = x.scale
        return x * x.scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * ctx.scale


class AttributeScaleOrOne(torch.autograd.Function):
    """The same through ``getattr`` with a default: a tensor without the attribute is 1."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.scale = getattr(x, "scale", 1.0)
        return x * ctx.scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * ctx.scale


class GlobalTensorAttribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * SCALED.gain

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * SCALED.gain


def tagged(scale: float | None) -> Callable[[], tuple[Any, ...]]:
    def make() -> tuple[Any, ...]:
        t = x()
        if scale is not None:
            t.scale = scale
        return (t,)

    return make


class TestTensorAttributes:
    @pytest.mark.parametrize("fn_cls", [AttributeScale, AttributeScaleOrOne], ids=lambda c: c.__name__)
    def test_argument_attribute_changed_between_calls(self, fn_cls: type) -> None:
        """A Python attribute on an input tensor is seen by the trace and is part of the key:
        a new value is a new capture (it used to be missing on the fake copy: the default,
        or an AttributeError)."""

        def sequence(apply: Apply) -> list[Any]:
            out: list[Any] = []
            for scale in (2.0, 3.0, 2.0, *((None,) if fn_cls is AttributeScaleOrOne else ())):
                out += steps(fn_cls, apply, [(nothing, nothing)], tagged(scale))
            return out

        run_three_ways(sequence)

    def test_global_tensor_attribute_changed_between_calls(self) -> None:
        """An attribute of a global tensor is a read like a global's, guarded."""
        values = [(setter(SCALED, "gain", v), setter(SCALED, "gain", v + 1)) for v in (2.0, 3.0, 2.0)]
        try:
            run_three_ways(lambda apply: steps(GlobalTensorAttribute, apply, values, lambda: (x(),)))
        finally:
            SCALED.gain = 2.0

    def test_mismatch_names_the_attribute(self) -> None:
        """A capture called with another attribute value says which attribute differs."""
        cap = minihop.capture(AttributeScale, *tagged(2.0)())
        with pytest.raises(minihop.GuardMismatchError, match=r"captured: Tensor\(shape=\[3\].*\.scale=2\.0\)"):
            cap(*tagged(3.0)())


# ---- tensors held in global containers and objects -------------------------------------------

class Weights:
    """A plain object holding a tensor, as a model-less training script keeps its weights."""

    def __init__(self) -> None:
        self.w = torch.ones(3)


HELD_LIST = [torch.ones(3)]
HELD_DICT = {"w": torch.ones(3)}
HELD_OBJECT = Weights()


class ScalesByHeld(torch.autograd.Function):
    """Multiplies by tensors found in a global list, dict and object."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * HELD_LIST[0] * HELD_DICT["w"] * HELD_OBJECT.w.sum()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * HELD_LIST[0] * HELD_DICT["w"] * HELD_OBJECT.w.sum()


def _replace_held(v: float, n: int) -> Callable[[], None]:
    def replace() -> None:
        HELD_LIST[0] = torch.full((3,), v)
        HELD_DICT["w"] = torch.full((3,), v + 1)
        HELD_OBJECT.w = torch.full((n,), v)

    return replace


class TestHeldTensors:
    def test_replaced_between_calls(self) -> None:
        """A tensor replaced in a global list, dict or object is the one the next call uses,
        also at another shape (it used to keep using the tensor seen while tracing)."""
        values = [(_replace_held(v, n), nothing) for v, n in ((2.0, 3), (3.0, 3), (2.0, 5))]
        try:
            run_three_ways(lambda apply: steps(ScalesByHeld, apply, values, lambda: (x(),)))
        finally:
            _replace_held(1.0, 3)()

    def test_lifted_inputs_are_named_by_where_they_are_held(self) -> None:
        """Each held tensor is a fwd input named by its route (``g_held_list_0_``, ...); backward's
        reads of the same places are inputs of their own (``..._bwd``, fetched when backward runs)."""
        names = [n.name for n in minihop.capture(ScalesByHeld, x()).fwd.graph.nodes if n.op == "placeholder"]
        assert names == ["l_x_", "g_held_list_0_", "g_held_dict_w_", "g_held_object_w_",
                         "g_held_list_0_bwd", "g_held_dict_w_bwd", "g_held_object_w_bwd"]


# ---- process-wide torch settings the code asks for -------------------------------------------

class DeterministicScale(torch.autograd.Function):
    """Takes another path when deterministic algorithms are on (as kernels with a slow exact
    fallback do)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * (2.0 if torch.are_deterministic_algorithms_enabled() else 3.0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * (2.0 if torch.are_deterministic_algorithms_enabled() else 3.0)


class DefaultDtypeBias(torch.autograd.Function):
    """Makes a bias of the default dtype and reports its size in the output."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        width = torch.finfo(torch.get_default_dtype()).bits
        return x * width

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * torch.finfo(torch.get_default_dtype()).bits


class TestTorchSettings:
    def test_deterministic_flag_changed_between_calls(self) -> None:
        """``torch.are_deterministic_algorithms_enabled()`` is a guarded read."""
        values = [(lambda v=v: torch.use_deterministic_algorithms(v), nothing) for v in (False, True, False)]
        try:
            run_three_ways(lambda apply: steps(DeterministicScale, apply, values, lambda: (x(),)))
        finally:
            torch.use_deterministic_algorithms(False)

    def test_default_dtype_changed_between_calls(self) -> None:
        """``torch.get_default_dtype()`` is a guarded read."""
        values = [(lambda d=d: torch.set_default_dtype(d), nothing)
                  for d in (torch.float32, torch.float64, torch.float32)]
        try:
            run_three_ways(lambda apply: steps(DefaultDtypeBias, apply, values, lambda: (x(),)))
        finally:
            torch.set_default_dtype(torch.float32)


# ---- functools.partial: the surrogate built with its parameters --------------------------------

def _surrogate(x: torch.Tensor, slope: float) -> torch.Tensor:
    return x * slope * SCALE


SURROGATE = functools.partial(_surrogate, slope=2.0)


class PartialGlobal(torch.autograd.Function):
    """Calls a global ``partial`` (its keywords may be changed in place between calls)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return SURROGATE(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return SURROGATE(g)


class PartialArgument(torch.autograd.Function):
    """Takes the surrogate as an argument, as spiking packages pass ``spike_grad``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fn: Any) -> torch.Tensor:
        ctx.fn = fn
        return fn(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return ctx.fn(g), None


class TestPartials:
    def test_global_partial_keywords_changed_in_place(self) -> None:
        """A global partial's keywords, changed in place, and the global its function reads,
        are guarded."""
        values = [(lambda v=v: SURROGATE.keywords.__setitem__("slope", v), nothing) for v in (2.0, 3.0, 2.0)]
        values.append((set_global("SCALE", 4.0), nothing))
        try:
            run_three_ways(lambda apply: steps(PartialGlobal, apply, values, lambda: (x(),)))
        finally:
            SURROGATE.keywords["slope"] = 2.0

    def test_partial_argument_with_other_keywords(self) -> None:
        """A partial argument is keyed by what it passes, not only by which object it is: the
        same partial with its keywords changed in place is a new capture."""

        def sequence(apply: Apply) -> list[Any]:
            fn = functools.partial(_surrogate, slope=2.0)
            values = [(lambda v=v: fn.keywords.__setitem__("slope", v), nothing) for v in (2.0, 3.0, 2.0)]
            return steps(PartialArgument, apply, values, lambda: (x(), fn))

        run_three_ways(sequence)
