"""Hostile inputs and fault safety: what minihop does with unusual or bad input, and what an exception leaves behind.

Each row of ``docs/hostile_inputs.md`` names the test here that proves it. Every behaviour is
decided by running eager ``F.apply`` on twin copies of the same arguments: minihop must give
eager's outputs and grads, or refuse with a documented ``MinihopError``, or let the user's own
exception through (its type, its traceback ending at the user's line). The fault-safety tests
make a capture fail in each way it can and check that no cache entry, grad mode, profiler hook,
patched ``Function.apply``, torch function mode or fake mode is left behind, and that the next
call works.
"""

from __future__ import annotations

import inspect
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.autograd import Function

import minihop
from minihop.testing import assert_matches_eager


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    minihop.clear_cache()
    yield
    minihop.clear_cache()


def twins(fn_cls: type, make_args: Callable[[], tuple[Any, ...]],
          loss: Callable[[Any], torch.Tensor] = lambda o: o.sum(),
          call: Callable[..., Any] | None = None) -> tuple[Any, Any, tuple[Any, ...], tuple[Any, ...]]:
    """Run eager and minihop on two ``make_args()`` (same values, their own layout) and compare
    outputs, output strides and every tensor argument's ``.grad`` (values and strides)."""
    eager_args, mine_args = make_args(), make_args()
    eager_out = fn_cls.apply(*eager_args)
    mine_out = (call or (lambda *a: minihop.apply(fn_cls, *a)))(*mine_args)
    torch.testing.assert_close(mine_out, eager_out, equal_nan=True)
    assert mine_out.stride() == eager_out.stride()
    assert mine_out.requires_grad == eager_out.requires_grad
    if eager_out.requires_grad:
        loss(eager_out).backward()
        loss(mine_out).backward()
    for e, m in zip(eager_args, mine_args, strict=True):
        if isinstance(e, torch.Tensor) and e.requires_grad and e.is_leaf:
            assert (m.grad is None) == (e.grad is None)
            if e.grad is not None:
                torch.testing.assert_close(m.grad, e.grad, equal_nan=True)
                assert m.grad.stride() == e.grad.stride()
    return eager_out, mine_out, eager_args, mine_args


def user_line(fn: Any, marker: str) -> int:
    """The line number of the line holding ``marker`` in ``fn``'s source."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def raised_at(error: BaseException) -> traceback.FrameSummary:
    return traceback.extract_tb(error.__traceback__)[-1]


class MulAdd(Function):
    """x * y + x.sum(): two tensor inputs, both saved."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y + x.sum()

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y + g.sum(), g * x


class Sin2(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin() * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos() * 2


def leaf(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, grad: bool = True) -> torch.Tensor:
    t = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return t.requires_grad_(grad)


# ---------------------------------------------------------------------------------------------
# Values and shapes
# ---------------------------------------------------------------------------------------------

class TestValues:
    def test_nan_and_inf_propagate_like_eager(self) -> None:
        """NaN and ±Inf in the inputs give eager's NaN/Inf outputs and grads, position for position."""
        x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")], requires_grad=True)
        y = torch.tensor([float("inf"), 2.0, 0.0, -1.0], requires_grad=True)
        cmp = assert_matches_eager(MulAdd, x, y)
        assert torch.equal(cmp.captured_output.isnan(), cmp.eager_output.isnan())
        assert torch.equal(cmp.captured_output.isinf(), cmp.eager_output.isinf())
        for e, m in zip(cmp.eager_args, cmp.captured_args, strict=True):
            assert torch.equal(m.grad.isnan(), e.grad.isnan())

    @pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3)])
    def test_empty_tensors(self, shape: tuple[int, ...]) -> None:
        """Empty tensors (a zero-size dimension) match eager, outputs and grads."""
        assert_matches_eager(MulAdd, leaf(*shape), leaf(*shape, seed=1))

    def test_empty_matmul_and_mean(self) -> None:
        """An empty contraction gives zeros, an empty mean NaN, as in eager."""

        class EmptyOps(Function):
            @staticmethod
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return a @ b + b.mean()

            @staticmethod
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                return g @ b.mT, a.mT @ g

        cmp = assert_matches_eager(EmptyOps, leaf(2, 0), leaf(0, 3, seed=1))
        assert cmp.captured_output.isnan().all()

    def test_zero_dim_tensors(self) -> None:
        """0-dim tensor inputs and outputs match eager."""
        cmp = assert_matches_eager(MulAdd, leaf(), leaf(seed=1))
        assert cmp.captured_output.dim() == 0

    def test_integer_and_bool_tensors(self) -> None:
        """Integer and bool tensor arguments (no grad) beside a float one match eager."""

        class Masked(Function):
            @staticmethod
            def forward(ctx, y, idx, mask):
                ctx.save_for_backward(idx, mask)
                return torch.where(mask, y * idx, y), idx * 2

            @staticmethod
            def backward(ctx, g, _gidx):
                idx, mask = ctx.saved_tensors
                return torch.where(mask, g * idx, g), None, None

        cmp = assert_matches_eager(Masked, leaf(4), torch.arange(4), torch.tensor([True, False, True, False]))
        assert cmp.captured_output[1].dtype == torch.int64

    def test_integer_argument_given_a_gradient(self) -> None:
        """backward returns a tensor for an integer argument: eager drops it; minihop must too (or refuse)."""

        class IntArg(Function):
            @staticmethod
            def forward(ctx, idx, y):
                return y * idx

            @staticmethod
            def backward(ctx, g):
                return torch.zeros(g.shape), g * 2

        assert_matches_eager(IntArg, torch.arange(4), leaf(4))

    def test_complex_dtypes(self) -> None:
        """complex64 inputs: outputs and (conjugate-convention) grads match eager."""

        class CMul(Function):
            @staticmethod
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return a * b.conj()

            @staticmethod
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                return g * b, (g * a.conj()).conj()

        twins(CMul, lambda: (leaf(3, dtype=torch.complex64), leaf(3, dtype=torch.complex64, seed=1)),
              loss=lambda o: torch.view_as_real(o).sum())

    def test_meta_tensors(self) -> None:
        """Tensors on the meta device: eager runs forward and backward there; minihop does the same."""
        make = lambda: (torch.empty(3, 4, device="meta", requires_grad=True),  # noqa: E731
                        torch.empty(3, 4, device="meta", requires_grad=True))
        eager_args, mine_args = make(), make()
        eager_out = MulAdd.apply(*eager_args)
        mine_out = minihop.apply(MulAdd, *mine_args)
        assert (mine_out.device, mine_out.shape, mine_out.dtype) == (eager_out.device, eager_out.shape, eager_out.dtype)
        eager_out.sum().backward()
        mine_out.sum().backward()
        for e, m in zip(eager_args, mine_args, strict=True):
            assert (m.grad.device, m.grad.shape) == (e.grad.device, e.grad.shape)


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------

class ByLayout(Function):
    @staticmethod
    def forward(ctx, x):
        return x * (2 if x.is_contiguous() else 3)

    @staticmethod
    def backward(ctx, g):
        return g


class TestLayouts:
    def test_transposed_and_strided_inputs(self) -> None:
        """Transposed and step-sliced inputs: eager's values, output strides and grads."""
        base = torch.randn(4, 6)
        other = torch.randn(4, 12)
        twins(MulAdd, lambda: (base.clone().t().requires_grad_(), other.clone()[:, ::2].t().requires_grad_()))
        twins(Sin2, lambda: (base.clone()[::2, ::3].requires_grad_(),))

    def test_expanded_inputs(self) -> None:
        """Stride-0 inputs: an expanded leaf, and an expanded view of a leaf (grads reach the base)."""
        row = torch.randn(1, 3)
        twins(Sin2, lambda: (row.clone().expand(4, 3).requires_grad_(),))
        bases: list[torch.Tensor] = []

        def expanded_view() -> tuple[Any, ...]:
            bases.append(row.clone().requires_grad_())
            return (bases[-1].expand(4, 3),)

        twins(Sin2, expanded_view)
        torch.testing.assert_close(bases[1].grad, bases[0].grad)

    def test_channels_last(self) -> None:
        """channels_last inputs keep eager's memory format in outputs and grads."""
        data = torch.randn(2, 3, 4, 5)
        _, out, _, args = twins(Sin2, lambda: (data.clone().to(memory_format=torch.channels_last).requires_grad_(),))
        assert out.is_contiguous(memory_format=torch.channels_last)
        assert args[0].grad.is_contiguous(memory_format=torch.channels_last)

    def test_forward_reads_layout(self) -> None:
        """forward branches on is_contiguous(): minihop.apply captures per layout; a capture called with another layout is refused (MH301)."""
        data = torch.randn(4, 3)
        twins(ByLayout, lambda: (data.clone().requires_grad_(),))
        twins(ByLayout, lambda: (data.clone().t().contiguous().t().requires_grad_(),))
        cap = minihop.capture(ByLayout, data.clone())
        with pytest.raises(minihop.GuardMismatchError, match=r"^\[MH301\] Capture of ByLayout called with tensors laid out differently"):
            cap(data.clone().t().contiguous().t())


# ---------------------------------------------------------------------------------------------
# Argument kinds
# ---------------------------------------------------------------------------------------------

class Twice(Function):
    @staticmethod
    def forward(ctx, x, extras=None):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


class Sub(torch.Tensor):
    pass


class LoggingSub(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return super().__torch_function__(func, types, args, kwargs or {})


class TestArguments:
    @pytest.mark.parametrize("subclass", [Sub, LoggingSub])
    def test_tensor_subclass_refused(self, subclass: type) -> None:
        """A tensor subclass argument is refused (MH101), directly or inside a container; one with
        a ``__torch_function__`` of its own before its key is read (which would run that code)."""
        x = torch.randn(3).as_subclass(subclass)
        own = r" with code of its own \(LoggingSub.__torch_function__\)\."
        where, inside = (own, own) if subclass is LoggingSub else (r" at x\.", r" at extras\[0\]\.")
        with pytest.raises(minihop.UnsupportedArgumentError,
                           match=rf"^\[MH101\] Twice.apply got a {subclass.__name__} \(a tensor subclass\){where}"):
            minihop.apply(Twice, x)
        with pytest.raises(minihop.UnsupportedArgumentError,
                           match=rf"^\[MH101\] Twice.apply got a {subclass.__name__} \(a tensor subclass\){inside}"):
            minihop.apply(Twice, torch.randn(3), [x])

    def test_parameter_accepted(self) -> None:
        """nn.Parameter is not refused: it is what modules pass."""
        twins(Twice, lambda: (torch.nn.Parameter(torch.ones(3)),))

    def test_huge_python_argument(self) -> None:
        """A 10^6-element list of ints: captured, keyed by its value (a hit when equal, a new capture when changed)."""

        class CountAndSum(Function):
            @staticmethod
            def forward(ctx, x, items):
                return x * (len(items) + sum(items[:3]))

            @staticmethod
            def backward(ctx, g):
                return g, None

        items = list(range(10**6))
        cf = minihop.function(CountAndSum)
        x = torch.ones(3, dtype=torch.float64)
        torch.testing.assert_close(cf(x, items), CountAndSum.apply(x, items))
        torch.testing.assert_close(cf(x, list(items)), CountAndSum.apply(x, items))
        assert (cf.stats.captures, cf.stats.hits) == (1, 1)
        items[1] = 10  # same length, other value: another key
        torch.testing.assert_close(cf(x, items), CountAndSum.apply(x, items))
        assert cf.stats.captures == 2


# ---------------------------------------------------------------------------------------------
# User code that raises
# ---------------------------------------------------------------------------------------------

class FwdRaises(Function):
    @staticmethod
    def forward(ctx, x):
        y = x * 2
        raise ValueError(f"bad input of shape {tuple(y.shape)}")  # RAISES-HERE

    @staticmethod
    def backward(ctx, g):
        return g


class BwdRaises(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError("BwdRaises has no backward")  # RAISES-HERE


class ShapeError(Function):
    @staticmethod
    def forward(ctx, a, b):
        return a @ b  # RAISES-HERE

    @staticmethod
    def backward(ctx, g):
        return g, g


class TestUserExceptions:
    @pytest.mark.parametrize("entry", ["apply", "capture"])
    def test_forward_raises(self, entry: str) -> None:
        """The user's own exception from forward surfaces: its type, message, and a traceback ending at the user's line."""
        run = (lambda x: minihop.apply(FwdRaises, x)) if entry == "apply" else (lambda x: minihop.capture(FwdRaises, x))
        with pytest.raises(ValueError, match=r"^bad input of shape \(3,\)$") as info:
            run(torch.randn(3, requires_grad=True))
        assert not isinstance(info.value, minihop.MinihopError)
        frame = raised_at(info.value)
        assert (frame.filename, frame.lineno) == (__file__, user_line(FwdRaises.forward, "RAISES-HERE"))

    def test_torch_error_in_forward(self) -> None:
        """A torch op failing in forward (matmul shapes) raises eager's exception type, through the user's line."""
        a, b = torch.randn(2, 3), torch.randn(2, 3)
        with pytest.raises(RuntimeError) as eager:
            ShapeError.apply(a, b)
        with pytest.raises(type(eager.value)) as mine:
            minihop.apply(ShapeError, a, b)
        assert not isinstance(mine.value, minihop.MinihopError)
        lines = [(f.filename, f.lineno) for f in traceback.extract_tb(mine.value.__traceback__)]
        assert (__file__, user_line(ShapeError.forward, "RAISES-HERE")) in lines

    def test_backward_raises(self) -> None:
        """The user's own exception from backward surfaces (minihop traces backward when it captures; eager raises at .backward())."""
        x = torch.randn(3, requires_grad=True)
        with pytest.raises(NotImplementedError, match="^BwdRaises has no backward$") as info:
            minihop.apply(BwdRaises, x).sum().backward()
        assert not isinstance(info.value, minihop.MinihopError)
        frame = raised_at(info.value)
        assert (frame.filename, frame.lineno) == (__file__, user_line(BwdRaises.backward, "RAISES-HERE"))

    @pytest.mark.parametrize("how", ["no_grad", "inputs_without_grad"])
    def test_backward_raises_forward_only_use(self, how: str) -> None:
        """Eager never calls backward when no grad can flow (no_grad, or no input requiring grad): the forward works there, so it must under minihop."""
        x = torch.randn(3, requires_grad=how == "no_grad")
        with torch.set_grad_enabled(how != "no_grad"):
            expected = BwdRaises.apply(x)
            got = minihop.apply(BwdRaises, x)
        torch.testing.assert_close(got, expected)

    def test_backward_raises_for_one_none_pattern(self) -> None:
        """With materialize_grads off, a backward raising only when a grad is None raises at .backward(), in eager and minihop alike."""

        class PickyNone(Function):
            @staticmethod
            def forward(ctx, x):
                ctx.set_materialize_grads(False)
                return x * 2, x * 3

            @staticmethod
            def backward(ctx, ga, gb):
                if gb is None:
                    raise ValueError("PickyNone needs both grads")  # RAISES-HERE
                return ga * 2 + gb * 3

        x = torch.randn(3, requires_grad=True)
        a, b = minihop.apply(PickyNone, x)
        (a.sum() + b.sum()).backward()  # both grads: the captured backward
        torch.testing.assert_close(x.grad, torch.full((3,), 5.0))
        for run in (PickyNone.apply, lambda t: minihop.apply(PickyNone, t)):
            a, _ = run(x)
            with pytest.raises(ValueError, match="^PickyNone needs both grads$") as info:
                a.sum().backward()
            frame = raised_at(info.value)
            assert (frame.filename, frame.lineno) == (__file__, user_line(PickyNone.backward, "RAISES-HERE"))
        assert_no_leftover_state()


# ---------------------------------------------------------------------------------------------
# Recursion
# ---------------------------------------------------------------------------------------------

class Recurse(Function):
    """forward applies itself (plain F.apply) to a smaller input: eager runs the inner apply as plain ops."""

    @staticmethod
    def forward(ctx, x):
        if x.shape[0] <= 1:
            return x * 2
        return torch.cat([x[:1] * 2, Recurse.apply(x[1:])])

    @staticmethod
    def backward(ctx, g):
        return g * 2


class RecurseApply(Function):
    """The same through minihop.apply."""

    @staticmethod
    def forward(ctx, x):
        if x.shape[0] <= 1:
            return x * 2
        return torch.cat([x[:1] * 2, minihop.apply(RecurseApply, x[1:])])

    @staticmethod
    def backward(ctx, g):
        return g * 2


@minihop.captured
class RecurseCaptured(Function):
    """The same with @minihop.captured (its apply is minihop's)."""

    @staticmethod
    def forward(ctx, x):
        if x.shape[0] <= 1:
            return x * 2
        return torch.cat([x[:1] * 2, RecurseCaptured.apply(x[1:])])

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Forever(Function):
    @staticmethod
    def forward(ctx, x):
        return Forever.apply(x)

    @staticmethod
    def backward(ctx, g):
        return g


class TestRecursion:
    @pytest.mark.parametrize("fn_cls", [Recurse, RecurseApply], ids=["F.apply", "minihop.apply"])
    def test_forward_applies_itself(self, fn_cls: type) -> None:
        """A forward applying its own Function to a smaller input matches eager (the inner applies are inlined)."""
        assert_matches_eager(fn_cls, leaf(5))
        twins(fn_cls, lambda: (leaf(4),))

    def test_captured_class_applies_itself(self) -> None:
        """@minihop.captured: the recursive apply inside forward is inlined; outputs and grads are eager's."""
        eager = RecurseCaptured.minihop._eager_apply
        for n in (1, 3, 5):
            twins(RecurseCaptured, lambda: (leaf(n),), call=RecurseCaptured.apply)
            torch.testing.assert_close(RecurseCaptured.apply(leaf(n)), eager(leaf(n)))

    def test_unbounded_recursion(self) -> None:
        """Infinite self-application raises RecursionError, as in eager, and leaves no state behind."""
        x = torch.randn(3, requires_grad=True)
        with pytest.raises(RecursionError):
            Forever.apply(x)
        with pytest.raises(RecursionError):
            minihop.apply(Forever, x)
        assert_no_leftover_state()
        assert_matches_eager(Sin2, x)


# ---------------------------------------------------------------------------------------------
# Fault safety
# ---------------------------------------------------------------------------------------------

_APPLY = torch.autograd.Function.__dict__["apply"]


def assert_no_leftover_state(grad_mode: bool = True, profiler: Any = None) -> None:
    """Nothing of a (failed) capture is left active in this thread."""
    assert torch.is_grad_enabled() is grad_mode
    assert sys.getprofile() is profiler
    assert torch.autograd.Function.__dict__["apply"] is _APPLY
    assert torch._C._len_torch_function_stack() == 0
    assert torch._C._len_torch_dispatch_stack() == 0
    assert torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None


class Stop(BaseException):
    """Not an Exception (like KeyboardInterrupt): cleanup must still run."""


class FwdValueError(Function):
    @staticmethod
    def forward(ctx, x):
        raise ValueError("forward failed")

    @staticmethod
    def backward(ctx, g):
        return g


class BwdValueError(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        y = g * x
        raise ValueError("backward failed")


class FwdStop(Function):
    @staticmethod
    def forward(ctx, x):
        x = x * 2
        raise Stop()

    @staticmethod
    def backward(ctx, g):
        return g


class DataDependent(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2 if torch.rand((), generator=torch.Generator().manual_seed(0)) > 0.5 else x

    @staticmethod
    def backward(ctx, g):
        return g


class WrongGradCount(Function):
    @staticmethod
    def forward(ctx, x, y):
        return x * y

    @staticmethod
    def backward(ctx, g):
        return g


class BadMatmul(Function):
    @staticmethod
    def forward(ctx, x):
        return x @ x

    @staticmethod
    def backward(ctx, g):
        return g


FAILURES: dict[str, tuple[type, Callable[[], tuple[Any, ...]], type[BaseException]]] = {
    "forward ValueError": (FwdValueError, lambda: (torch.randn(3, requires_grad=True),), ValueError),
    "backward ValueError": (BwdValueError, lambda: (torch.randn(3, requires_grad=True),), ValueError),
    "forward BaseException": (FwdStop, lambda: (torch.randn(3, requires_grad=True),), Stop),
    "MH103 refusal": (DataDependent, lambda: (torch.randn(3, requires_grad=True),), minihop.DataDependentError),
    "MH201 refusal": (WrongGradCount, lambda: (torch.randn(3, requires_grad=True), torch.randn(3)),
                      minihop.BackwardOutputError),
    "torch op error": (BadMatmul, lambda: (torch.randn(2, 3, requires_grad=True),), RuntimeError),
}


# Failures that happen in backward: with grad mode off eager never calls backward, so they are
# no failures there (tests/test_hostile.py::TestUserExceptions::test_backward_raises_forward_only_use).
_IN_BACKWARD = {"backward ValueError", "MH201 refusal"}
FAILURE_CASES = [(failure, grad_mode) for failure in sorted(FAILURES) for grad_mode in (True, False)
                 if grad_mode or failure not in _IN_BACKWARD]


def _profiler(frame: Any, event: str, arg: Any) -> None:
    return None


class TestFaultSafety:
    @pytest.mark.parametrize(("failure", "grad_mode"), FAILURE_CASES)
    def test_failed_capture_leaves_nothing(self, failure: str, grad_mode: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
        """A capture failing this way leaves no cache entry, restores grad mode, profiler hook, Function.apply, torch function and fake modes; the next call works."""
        fn_cls, make_args, error = FAILURES[failure]
        attempts: list[type] = []
        real = minihop.cache.capture

        def counting(cls: type, *args: Any, **kwargs: Any) -> Any:
            attempts.append(cls)
            return real(cls, *args, **kwargs)

        monkeypatch.setattr(minihop.cache, "capture", counting)
        cf = minihop.function(fn_cls)

        def run(call: Any) -> None:
            out = call(fn_cls, *make_args()) if call is minihop.apply else call(*make_args())
            if failure == "backward ValueError":
                # The user's own error, raised while backward was traced: the call ran eagerly,
                # and the error comes at .backward(), as in eager.
                out.sum().backward()

        with torch.set_grad_enabled(grad_mode):
            for attempt in (1, 2):
                with pytest.raises(error):
                    run(cf)
                assert_no_leftover_state(grad_mode)
                assert cf.stats.captures == 0 and cf.captures == []
                assert len(attempts) == attempt, "a failed capture must not be remembered (fallback='raise')"
            with pytest.raises(error):
                run(minihop.apply)
            assert_no_leftover_state(grad_mode)
        assert_matches_eager(Sin2, torch.randn(4, requires_grad=True))
        assert_no_leftover_state()

    @pytest.mark.parametrize("failure", sorted(FAILURES))
    def test_failed_capture_leaves_profiler(self, failure: str) -> None:
        """With the user's own profile hook installed, a failed capture leaves that hook in place."""
        fn_cls, make_args, error = FAILURES[failure]
        sys.setprofile(_profiler)
        try:
            with pytest.raises(error):
                minihop.capture(fn_cls, *make_args())
            assert_no_leftover_state(profiler=_profiler)
        finally:
            sys.setprofile(None)
        assert_matches_eager(Sin2, torch.randn(4, requires_grad=True))

    @pytest.mark.parametrize("failure", sorted(FAILURES))
    def test_failed_trace_restores_function_apply(self, failure: str) -> None:
        """minihop.trace over a function whose Function.apply fails: Function.apply is unpatched, no mode is left; trace works after."""
        fn_cls, make_args, error = FAILURES[failure]

        def program(*args: Any) -> Any:
            return fn_cls.apply(*args) * 2

        with pytest.raises(error):
            minihop.trace(program, *make_args())
        assert_no_leftover_state()

        def good(x: torch.Tensor) -> torch.Tensor:
            return Sin2.apply(x) + 1

        x = torch.randn(4)
        torch.testing.assert_close(minihop.trace(good, x)(x), Sin2.apply(x) + 1)
        assert_no_leftover_state()

    def test_user_function_raising_inside_trace(self) -> None:
        """The traced function itself raising after an apply: Function.apply is unpatched, state restored."""

        def program(x: torch.Tensor) -> torch.Tensor:
            y = Sin2.apply(x)
            raise KeyError("program failed")

        with pytest.raises(KeyError, match="program failed"):
            minihop.trace(program, torch.randn(3))
        assert_no_leftover_state()

    def test_eager_fallback_after_refusal(self) -> None:
        """fallback='eager': a refused key runs eagerly (and says so once); a user exception is not swallowed."""
        cf = minihop.function(DataDependent, fallback="eager")
        x = torch.randn(3, requires_grad=True)
        with pytest.warns(UserWarning, match="running DataDependent eagerly"):
            torch.testing.assert_close(cf(x), DataDependent.apply(x))
        assert cf.stats.eager_calls == 1
        assert_no_leftover_state()
        with pytest.raises(ValueError, match="forward failed"):
            minihop.function(FwdValueError, fallback="eager")(x)
        assert_no_leftover_state()


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

def test_table_names_real_tests() -> None:
    """Every test named in docs/hostile_inputs.md exists in this file."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    doc = (root / "docs" / "hostile_inputs.md").read_text()
    prefixes = {"TV": TestValues, "TL": TestLayouts, "TA": TestArguments, "TU": TestUserExceptions,
                "TR": TestRecursion, "TF": TestFaultSafety}
    named = re.findall(r"`(T[A-Z])::(test_\w+)`", doc)
    assert len(named) >= 20
    missing = [f"{p}::{name}" for p, name in named if not hasattr(prefixes[p], name)]
    assert missing == []
