"""Effects of a Function's code, against eager: what it writes, draws, caches, logs and raises.

Each case is written the way Functions in the wild write it and run three times eagerly,
through ``minihop.function(F)`` (strict) and ``minihop.function(F, fallback="eager")``, each
on fresh state (``tests/fuzz/oracle_effects.py``): outputs, every ``.grad``, the Python state
between forward and ``.backward()`` and after, warnings, and torch's random stream after the
calls must be eager's. Strict may instead refuse with a coded error where a case cannot be
captured; fallback must always be eager.
"""

from __future__ import annotations

import functools
import inspect
import logging
import pathlib
import sys
import warnings
from typing import Any
from warnings import warn

import pytest
import torch
from torch.autograd import Function

import minihop

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "fuzz"))

from oracle_effects import compare  # noqa: E402


def _x(i: int) -> tuple[torch.Tensor]:
    return (torch.randn(3, generator=torch.Generator().manual_seed(i)).requires_grad_(),)


def _captured(make: Any) -> None:
    assert compare(make) == {"strict": "same", "fallback": "same"}


def _refused(make: Any, words: str) -> None:
    verdicts = compare(make)
    assert verdicts["fallback"] == "same"
    assert verdicts["strict"].startswith("refused SideEffectError: [MH106]"), verdicts
    assert words in verdicts["strict"], verdicts


# -- randomness ------------------------------------------------------------------------------

def _generator_in_forward() -> Any:
    class Noisy(Function):
        @staticmethod
        def forward(ctx, x):
            g = torch.Generator().manual_seed(0)
            return x + torch.randn(3, generator=g)

        @staticmethod
        def backward(ctx, grad):
            return grad

    return Noisy, _x, lambda: None


def _generator_in_backward() -> Any:
    class NoisyGrad(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            g = torch.Generator()
            g.manual_seed(7)
            return grad * torch.rand(3, generator=g)

    return NoisyGrad, _x, lambda: None


def _generator_argument() -> Any:
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]

    class Jitter(Function):
        @staticmethod
        def forward(ctx, x, gen):
            return x + torch.rand(3, generator=gen)

        @staticmethod
        def backward(ctx, grad):
            return grad, None

    return Jitter, lambda i: (*_x(i), gens[i]), lambda: [g.initial_seed() for g in gens]


def test_a_generator_made_in_forward_is_refused_not_advanced() -> None:
    # Captured, the graph held the traced generator: call 2 drew its next numbers, where eager
    # makes and seeds a fresh one each call.
    _refused(_generator_in_forward, "torch.Generator")


def test_a_generator_made_in_backward_is_refused() -> None:
    _refused(_generator_in_backward, "NoisyGrad.backward")


def test_a_generator_argument_is_refused() -> None:
    _refused(_generator_argument, "torch.Generator")


def _initial_seed() -> Any:
    class SeedScaled(Function):
        @staticmethod
        def forward(ctx, x):
            return x * (torch.initial_seed() % 7)

        @staticmethod
        def backward(ctx, grad):
            return grad

    return SeedScaled, _x, lambda: None


def _dropout_with_stream() -> Any:
    class Dropish(Function):
        @staticmethod
        def forward(ctx, x):
            mask = torch.rand(3) > 0.5
            ctx.save_for_backward(mask)
            return x * mask

        @staticmethod
        def backward(ctx, grad):
            mask, = ctx.saved_tensors
            return grad * mask * torch.rand(3)

    return Dropish, _x, lambda: None


@pytest.mark.parametrize("make", [_initial_seed, _dropout_with_stream], ids=["initial_seed", "global stream"])
def test_the_global_random_stream_ends_where_eager_leaves_it(make: Any) -> None:
    _captured(make)


def _draw_then_branch(phase: str) -> Any:
    class NoisyBranch(Function):
        @staticmethod
        def forward(ctx, x):
            y = x + torch.rand(3)
            ctx.save_for_backward(y)
            if phase == "forward" and y.sum() > 0:
                return y * 2
            return y * 3

        @staticmethod
        def backward(ctx, grad):
            y, = ctx.saved_tensors
            if phase == "backward" and y.sum() > 0:
                return grad * 2
            return grad * 3

    return NoisyBranch, _x, lambda: None


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_branch_on_a_draw_is_refused_without_extra_draws(phase: str) -> None:
    # A value guard that recomputed the branch from the draw would draw again (or see other
    # numbers): refused (MH103), and fallback's stream is exactly eager's after the calls.
    verdicts = compare(functools.partial(_draw_then_branch, phase))
    assert verdicts["fallback"] == "same"
    assert verdicts["strict"].startswith("refused DataDependentError: [MH103]"), verdicts


# -- caches ----------------------------------------------------------------------------------

def _lru_table(through_helper: bool) -> Any:
    @functools.lru_cache(maxsize=None)
    def positions(n):
        return torch.arange(n, dtype=torch.float32)

    def scaled(x):
        return x * positions(x.shape[0])

    class Positional(Function):
        @staticmethod
        def forward(ctx, x):
            return scaled(x) if through_helper else x * positions(x.shape[0])

        @staticmethod
        def backward(ctx, grad):
            return grad * positions(grad.shape[0])

    def state():
        info = positions.cache_info()  # eager's entries and counts (also between fwd and bwd)
        table = positions(3)  # the user's own later call: a real tensor, eager's numbers
        return (info.hits, info.misses, info.currsize), type(table).__name__, table.tolist()

    return Positional, _x, state


@pytest.mark.parametrize("through_helper", [False, True], ids=["named", "through a helper"])
def test_an_lru_cache_helper_never_keeps_a_fake_tensor(through_helper: bool) -> None:
    # Before: the trace's call filled the cache with a fake tensor; the user's next call got
    # it back (DataDependentOutputException on .tolist()). Then: the cache was bypassed, so its
    # hits, misses and entries were not eager's (each call is now made again when it runs).
    _captured(functools.partial(_lru_table, through_helper))


def _causal_mask_cache() -> Any:
    masks: dict[int, torch.Tensor] = {}

    class CausalMix(Function):
        @staticmethod
        def forward(ctx, x):
            n = x.shape[0]
            if n not in masks:
                masks[n] = torch.tril(torch.ones(n, n))
            ctx.n = n
            return masks[n] @ x

        @staticmethod
        def backward(ctx, grad):
            return masks[ctx.n].t() @ grad

    return CausalMix, _x, lambda: {n: m.tolist() for n, m in masks.items()}


def test_a_memo_dict_filled_in_forward_is_read_by_backward() -> None:
    # Before: KeyError in the user's backward in both modes (the trace took forward's write
    # back out before it traced backward).
    _captured(_causal_mask_cache)


# -- ctx -------------------------------------------------------------------------------------

def _ctx_written_in_backward() -> Any:
    class Counted(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.calls = 0
            ctx.trail = ["forward"]
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            ctx.calls += 1
            ctx.trail.append("backward")
            return grad * (len(ctx.trail) + ctx.calls)

    return Counted, _x, lambda: None


def test_ctx_written_in_backward() -> None:
    _captured(_ctx_written_in_backward)


# -- exceptions and messages -----------------------------------------------------------------

def _raises_after_a_write() -> Any:
    log: list[str] = []

    class Checked(Function):
        @staticmethod
        def forward(ctx, x):
            log.append("checked")
            if x.shape[0] == 3:
                raise ValueError(f"size {x.shape[0]} is not supported")
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad

    return Checked, _x, lambda: list(log)


def test_writes_before_the_users_exception_stay_made() -> None:
    _captured(_raises_after_a_write)


def _warns() -> Any:
    class Warned(Function):
        @staticmethod
        def forward(ctx, x, k):
            warnings.warn(f"k is {k}")
            return x * k

        @staticmethod
        def backward(ctx, grad):
            return grad * 2, None

    return Warned, lambda i: (*_x(i), 2), lambda: None


def _warns_by_name() -> Any:
    class WarnedByName(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            warn("backward of WarnedByName is approximate")
            return grad * 2

    return WarnedByName, _x, lambda: None


def test_warnings_are_refused_never_given_once() -> None:
    # Before: given while tracing, then never again by the calls that reused the capture.
    _refused(_warns, "warnings.warn")


def test_a_warn_imported_by_name_is_refused() -> None:
    _refused(_warns_by_name, "warn")


def _logs(phase: str) -> Any:
    heard: list[str] = []

    class Heard(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            heard.append(record.getMessage())

    log = logging.getLogger(f"minihop.test_effects.{phase}.{id(heard)}")
    log.addHandler(Heard())
    log.setLevel(logging.INFO)
    log.propagate = False

    class Logged(Function):
        @staticmethod
        def forward(ctx, x, k):
            if phase == "forward":
                log.info("forward k=%s", k)
            return x * k

        @staticmethod
        def backward(ctx, grad):
            if phase == "backward":
                log.warning("backward")
            return grad * 2, None

    return Logged, lambda i: (*_x(i), i), lambda: list(heard)


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_logging_is_refused_never_sent_once(phase: str) -> None:
    # Before: sent while tracing, then never again.
    _refused(functools.partial(_logs, phase), "logging's")


# -- cycles ----------------------------------------------------------------------------------

class _TreeNode:
    def __init__(self, weight: Any, parent: "_TreeNode | None" = None) -> None:
        self.parent = parent
        self.children: list[_TreeNode] = []
        self.weight = weight
        if parent is not None:
            parent.children.append(self)


def _tree(with_tensors: bool) -> Any:
    def args(i: int) -> tuple[Any, ...]:
        root = _TreeNode(torch.full((3,), 2.0 + i) if with_tensors else 2.0 + i)
        return (*_x(i), _TreeNode(torch.ones(3) if with_tensors else 1.0, root))

    class FromParent(Function):
        @staticmethod
        def forward(ctx, x, node):
            return x * node.parent.weight + node.weight

        @staticmethod
        def backward(ctx, grad):
            return grad * 2, None

    return FromParent, args, lambda: None


@pytest.mark.parametrize("with_tensors", [False, True], ids=["numbers", "tensors"])
def test_a_cyclic_argument(with_tensors: bool) -> None:
    # Before: RecursionError in both modes.
    _captured(functools.partial(_tree, with_tensors))


# -- state writes replayed as eager makes them (issue 31) ------------------------------------

class _Holder:
    last = None


class _Recorder:
    meta: Any = None


def _tensor_on_a_class() -> Any:
    _Holder.last = None

    class Remember(Function):
        @staticmethod
        def forward(ctx, x):
            _Holder.last = x[0].detach()
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    return Remember, _x, lambda: _Holder.last


def _dict_constant_on_a_class() -> Any:
    _Recorder.meta = None

    class Meta(Function):
        @staticmethod
        def forward(ctx, x):
            _Recorder.meta = {"seen": [], "scale": 2}
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            _Recorder.meta["seen"].append("backward")
            return grad * 2

    def state():
        return _Recorder.meta, id(_Recorder.meta) == id(META_SEEN.setdefault("first", _Recorder.meta))

    META_SEEN: dict[str, Any] = {}
    return Meta, _x, state


def _class_level_cache() -> Any:
    class Table(Function):
        _table = None

        @staticmethod
        def forward(ctx, x):
            if Table._table is None:
                Table._table = torch.linspace(0, 1, 3)
            return x * Table._table

        @staticmethod
        def backward(ctx, grad):
            return grad * Table._table

    return Table, _x, lambda: Table._table


_EYE = None


def _global_per_size() -> Any:
    global _EYE
    _EYE = None

    class Project(Function):
        @staticmethod
        def forward(ctx, x):
            global _EYE
            n = x.shape[0]
            if _EYE is None or _EYE.shape[0] != n:
                _EYE = torch.eye(n) * 2
            return _EYE @ x

        @staticmethod
        def backward(ctx, grad):
            return _EYE.t() @ grad

    sizes = (3, 4, 4)
    return Project, lambda i: (torch.randn(sizes[i], requires_grad=True),), lambda: _EYE


def _argument_dict_popped() -> Any:
    class Options(Function):
        @staticmethod
        def forward(ctx, x, opts):
            method = opts.pop("method", "sum")
            return x * (2 if method == "sum" else 3)

        @staticmethod
        def backward(ctx, grad):
            return grad * 2, None

    passed: list[dict[str, Any]] = []

    def args(i: int) -> tuple[Any, ...]:
        passed.append({"method": ("sum", "mean")[i % 2], "eps": 0.1})
        return (*_x(i), passed[-1])

    return Options, args, lambda: [dict(p) for p in passed]


@pytest.mark.parametrize("make", [_tensor_on_a_class, _dict_constant_on_a_class, _class_level_cache,
                                  _global_per_size, _argument_dict_popped],
                         ids=["Holder.last = x[0]", "Recorder.meta = {...}", "class-level cache",
                              "_EYE = torch.eye(n)", "opts.pop"])
def test_state_writes_are_replayed_as_eager_makes_them(make: Any) -> None:
    # Before: each refused (MH106), so strict mode did not capture them.
    _captured(make)


def _raises_for_one_value() -> Any:
    log: list[int] = []

    class Lookup(Function):
        @staticmethod
        def forward(ctx, x, k):
            log.append(k)  # made before the error: eager keeps it
            if k == 1:
                raise KeyError(f"no table for k={k}")
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2, None

    return Lookup, lambda i: (*_x(i), i % 2), lambda: list(log)


def test_a_users_exception_on_one_call_keeps_its_writes() -> None:
    # Before: the trace undid log.append(1) and the KeyError propagated without it.
    _captured(_raises_for_one_value)


def test_a_list_on_ctx_mutated_before_backward() -> None:
    def run(call_of: Any) -> list[Any]:
        shared = [1, 2]

        class Sized(Function):
            @staticmethod
            def forward(ctx, x, items):
                ctx.items = items
                return x * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * len(ctx.items), None

        call = call_of(Sized)
        grads = []
        for i in range(3):
            x = torch.ones(3, requires_grad=True)
            y = call(x, shared)
            shared.append(i)  # between forward and .backward(): eager's backward sees it
            y.sum().backward()
            grads.append(x.grad.tolist())
        # The caller's list is the caller's: tracing backward again must not put the
        # contents forward saw back into it (it did: every backward saw [1, 2]).
        return [grads, shared]

    import minihop
    eager = run(lambda f: f.apply)
    assert eager == [[[3.0] * 3, [4.0] * 3, [5.0] * 3], [1, 2, 0, 1, 2]]
    assert run(lambda f: minihop.function(f, fallback="eager")) == eager
    assert run(lambda f: minihop.function(f)) == eager
    assert run(lambda f: lambda *a: minihop.apply(f, *a)) == eager


def test_an_lru_cache_helper_counts_as_eagers_across_sizes() -> None:
    """New sizes (automatic dynamic shapes: its argument is then a size symbol) fill the cache
    as eager's calls do; hits and misses between forward and backward too."""
    def run(mode: str) -> list[Any]:
        Positional, _make_x, _state = _lru_table(False)
        positions = inspect.getclosurevars(Positional.backward).nonlocals["positions"]
        minihop.reset()
        call = {"eager": Positional.apply, "strict": minihop.function(Positional),
                "fallback": minihop.function(Positional, fallback="eager"),
                "apply": lambda x: minihop.apply(Positional, x)}[mode]
        record: list[Any] = []
        for n in (3, 3, 4, 5, 4):
            x = torch.linspace(-1.0, 1.0, n, requires_grad=True)
            y = call(x)
            record.append(tuple(positions.cache_info()))
            y.sum().backward()
            record += [tuple(positions.cache_info()), y.detach().tolist(), x.grad.tolist()]
        return record

    expected = run("eager")
    for mode in ("strict", "fallback", "apply"):
        assert run(mode) == expected, mode
