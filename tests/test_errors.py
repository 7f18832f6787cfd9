"""Every deliberate minihop error: its class, its pinned message, and what eager does instead.

Each error must be a ``minihop.MinihopError`` and the built-in a user would catch. Where eager
raises too (bad gradients from backward), eager's error is checked; where eager works
(data-dependent control flow, tensor subclasses, unmarked in-place writes), the error is a
documented refusal and eager is checked to run.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import minihop
import minihop.errors


def r(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape).requires_grad_(grad)


def capture_error(cls: type[minihop.MinihopError], fn_cls: Any, *args: Any,
                  match: str) -> minihop.MinihopError:
    """``minihop.capture(fn_cls, *args)`` raises ``cls`` with a message matching ``match``."""
    with pytest.raises(cls, match=match) as info:
        minihop.capture(fn_cls, *args)
    return info.value


def eager_backward(fn_cls: type, *args: Any) -> None:
    """Run ``fn_cls.apply`` and a backward through its first output, as a user would."""
    out = fn_cls.apply(*args)
    first = out[0] if isinstance(out, tuple) else out
    first.sum().backward()


# ---------------------------------------------------------------------------------------------
# The error hierarchy
# ---------------------------------------------------------------------------------------------

_BUILTIN = {
    "UnsupportedArgumentError": TypeError,
    "UnsupportedOutputError": TypeError,
    "DataDependentError": NotImplementedError,
    "UnsupportedOperationError": NotImplementedError,
    "InplaceInputError": RuntimeError,
    "BackwardOutputError": ValueError,
    "GuardMismatchError": ValueError,
    "InconsistentGraphsError": ValueError,
}


class TestHierarchy:
    @pytest.mark.parametrize("name", sorted(_BUILTIN))
    def test_public_and_subclasses(self, name: str) -> None:
        """Each error class is exported, a MinihopError, and subclasses its built-in."""
        cls = getattr(minihop, name)
        assert name in minihop.__all__
        assert issubclass(cls, minihop.MinihopError)
        assert issubclass(cls, _BUILTIN[name])

    @pytest.mark.parametrize("name", sorted(set(minihop.errors.__all__) - {"MinihopError"}))
    def test_every_error_catchable_as_builtin(self, name: str) -> None:
        """Every class in minihop.errors (new ones too) is a MinihopError and a built-in error."""
        cls = getattr(minihop.errors, name)
        assert issubclass(cls, minihop.MinihopError)
        assert issubclass(cls, (TypeError, ValueError, NotImplementedError, RuntimeError))

    def test_codes_unique(self) -> None:
        """Each error class has its own stable code."""
        codes = [getattr(minihop.errors, name).code for name in minihop.errors.__all__]
        assert len(set(codes)) == len(codes)
        assert all(re.fullmatch(r"MH\d{3}", c) for c in codes)

    def test_message_layout(self) -> None:
        """Messages read: [code] found / at where / Why / What to do."""
        err = minihop.BackwardOutputError("found it", "because", "fix it", where="file.py:3")
        assert str(err) == "[MH201] found it\n  at file.py:3\nWhy: because\nWhat to do: fix it"
        assert (err.found, err.why, err.todo, err.where) == ("found it", "because", "fix it", "file.py:3")


# ---------------------------------------------------------------------------------------------
# DataDependentError: documented refusals (eager runs these)
# ---------------------------------------------------------------------------------------------

class IfOnSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if x.sum() > 0:
            return x * 2
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g


class Item(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * x.max().item()

    @staticmethod
    def backward(ctx, g):
        return g


class ToList(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * sum(x.tolist())

    @staticmethod
    def backward(ctx, g):
        return g


class IfInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        if g.sum() > 0:
            return g * 2
        return g


class NonZero(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x[x > 0] * 2

    @staticmethod
    def backward(ctx, g):
        return None


class BranchOnCount(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x[x > 0]
        if y.shape[0] > 2:
            return y * 2
        return y * 3

    @staticmethod
    def backward(ctx, g):
        return None


class Numpy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * float(x.detach().numpy().sum())

    @staticmethod
    def backward(ctx, g):
        return g


class FloatOfTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * float(x.sum())

    @staticmethod
    def backward(ctx, g):
        return g


class RandomItem(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * torch.rand((), generator=torch.Generator().manual_seed(0)).item()

    @staticmethod
    def backward(ctx, g):
        return g


def same_as_eager(fn_cls: type, x: torch.Tensor) -> None:
    """The capture of ``fn_cls`` for ``x`` gives eager's output and grad."""
    a, b = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    out = minihop.capture(fn_cls, a)(a)
    out.sum().backward()
    ref = fn_cls.apply(b)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


class TestDataDependentError:
    def test_if_on_tensor(self) -> None:
        """`if x.sum() > 0` in forward is captured for the branch taken (value-guarded)."""
        same_as_eager(IfOnSum, torch.tensor([1.0, 2.0]))
        same_as_eager(IfOnSum, torch.tensor([-1.0, -2.0]))

    def test_item(self) -> None:
        """`.item()` in forward of a value known only when the call runs (random) is refused."""
        err = capture_error(minihop.DataDependentError, RandomItem, r(3),
                            match=r"RandomItem\.forward calls item, whose result depends on tensor values")
        assert 'What to do: Compute with tensor ops instead' in str(err)
        assert 'torch._check' in str(err) and 'fallback="eager"' in str(err)
        assert isinstance(err, NotImplementedError) and isinstance(err, minihop.MinihopError)
        eager_backward(RandomItem, r(3))
        same_as_eager(Item, r(3))  # from the inputs: captured, value-guarded

    def test_tolist(self) -> None:
        """`.tolist()` in forward is captured for the values of the call."""
        same_as_eager(ToList, r(3))

    def test_if_in_backward(self) -> None:
        """Data-dependent control flow on a grad in backward is captured: each backward's
        grads are checked against the values its bwd was traced for (tests/test_data_dependent.py)."""
        cap = minihop.capture(IfInBackward, r(3))
        for sign in (1.0, -1.0, 1.0):
            a, b = r(3), r(3)
            b.data.copy_(a.data)
            grad = torch.full((3,), sign)
            cap(a).backward(grad)
            IfInBackward.apply(b).backward(grad)
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)

    def test_data_dependent_shape(self) -> None:
        """Boolean-mask indexing (an output shape that depends on values) is captured with an
        unbacked size; a Python branch on that size is refused, naming the op and the line."""
        same_as_eager(NonZero, r(4))
        err = capture_error(minihop.DataDependentError, BranchOnCount, r(4),
                            match=r"(?s)BranchOnCount\.forward calls __getitem__, whose result "
                                  r"depends on tensor values.*at .*if y\.shape\[0\] > 2:")
        assert "output size u0 comes from tensor values" in str(err)
        assert "torch._check" in str(err) and 'fallback="eager"' in str(err)
        assert BranchOnCount.apply(r(4)).dim() == 1

    def test_float_of_tensor(self) -> None:
        """float(t) in forward is captured (value-guarded)."""
        same_as_eager(FloatOfTensor, r(3))

    def test_numpy(self) -> None:
        """float() of a numpy round trip in forward (docs/numpy.md: torch._numpy records it) is a
        value read like float(t): captured, value-guarded, equal to eager."""
        same_as_eager(Numpy, r(3))

    def test_through_apply(self) -> None:
        """minihop.apply raises the same error."""
        minihop.clear_cache()
        with pytest.raises(minihop.DataDependentError, match=r"RandomItem\.forward calls item"):
            minihop.apply(RandomItem, r(3))


# ---------------------------------------------------------------------------------------------
# In-place writes into inputs without mark_dirty: captured as eager runs them
# (tests/test_inplace_buffers.py); InplaceInputError is for mark_dirty misuse
# ---------------------------------------------------------------------------------------------

class MulInplace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class AddToSecond(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        y.add_(1)
        return x * y

    @staticmethod
    def backward(ctx, g):
        return g, None


class SetItemInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x[0] = 1
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class MulInplaceMarked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class TestInplaceInputError:
    """Writes into inputs that require grad without mark_dirty were refused (MH105); eager runs
    them (forward runs under no_grad), and so does a capture now, writing the caller's tensor
    (issue 31; more in tests/test_inplace_buffers.py::TestInputsRequiringGrad)."""

    @pytest.mark.parametrize("fn_cls,nargs", [(MulInplace, 1), (AddToSecond, 2), (SetItemInput, 1)],
                             ids=["method", "second_argument", "setitem"])
    def test_matches_eager(self, fn_cls: type, nargs: int) -> None:
        base = [torch.randn(3) for _ in range(nargs)]
        seen = []
        for run in (fn_cls.apply, minihop.capture(fn_cls, *[r(3) for _ in range(nargs)])):
            args = [b.clone().requires_grad_() for b in base]
            out = run(*args)
            out.sum().backward()
            seen.append((out.detach(), [a.detach().clone() for a in args], [a._version for a in args],
                         [a.grad for a in args]))
        torch.testing.assert_close(seen[1], seen[0])

    def test_marked_dirty_is_fine(self) -> None:
        """The same write with ctx.mark_dirty is captured."""
        cap = minihop.capture(MulInplaceMarked, torch.randn(3))
        x = torch.ones(3)
        cap(x)
        assert x.tolist() == [2.0, 2.0, 2.0]


# ---------------------------------------------------------------------------------------------
# BackwardOutputError: eager raises too (at backward time)
# ---------------------------------------------------------------------------------------------

class TooFewGrads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return x * y

    @staticmethod
    def backward(ctx, g):
        return g


class TooManyGrads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g, g


class GradForFloat(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        return x * scale

    @staticmethod
    def backward(ctx, g):
        return g * 2, g.sum()


class BadShape(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.sum()

    @staticmethod
    def backward(ctx, g):
        return g.expand(4)


class PythonFloatGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return 2.0


class TrailingNones(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None, None


_BACKWARD_CASES: dict[str, tuple[type, tuple[Any, ...], str, str]] = {
    # name: (Function, args, minihop message, eager message)
    "too_few": (TooFewGrads, (r(3), r(3)),
                re.escape("TooFewGrads.backward returned 1 gradient(s), but forward takes 2 argument(s) (x, y)."),
                re.escape("returned an incorrect number of gradients (expected 2, got 1)")),
    "too_many": (TooManyGrads, (r(3),),
                 re.escape("TooManyGrads.backward returned 2 gradient(s), but forward takes 1 argument(s) (x)."),
                 re.escape("returned an incorrect number of gradients (expected 1, got 2)")),
    "non_tensor_input": (GradForFloat, (r(3), 2.0),
                         re.escape("GradForFloat.backward returned a tensor as the gradient for argument 1 "
                                   "(scale), which is a float, not a tensor."),
                         "returned a gradient different than None at position 2, but the corresponding "
                         "forward input was not a Variable"),
    "bad_shape": (BadShape, (r(3),),
                  re.escape("BadShape.backward returned a gradient of shape [4] for argument 0 (x).\n"
                            "  expected: [3] (the shape of x)\n  found:    [4]"),
                  re.escape("returned an invalid gradient at index 0 - got [4] but expected shape "
                            "compatible with [3]")),
    "python_float": (PythonFloatGrad, (r(3),),
                     re.escape("PythonFloatGrad.backward returned a float as the gradient for argument 0 (x)."),
                     re.escape("expected Variable or None (got float)")),
}


class TestBackwardOutputError:
    @pytest.mark.parametrize("case", sorted(_BACKWARD_CASES))
    def test_minihop_raises(self, case: str) -> None:
        """A bad backward result is a BackwardOutputError (a ValueError) at capture time."""
        fn_cls, args, pattern, _ = _BACKWARD_CASES[case]
        err = capture_error(minihop.BackwardOutputError, fn_cls, *args, match=pattern)
        assert isinstance(err, ValueError) and isinstance(err, minihop.MinihopError)
        assert "What to do: " in str(err)

    @pytest.mark.parametrize("case", sorted(_BACKWARD_CASES))
    def test_eager_raises(self, case: str) -> None:
        """Eager autograd rejects the same backward, at backward time."""
        fn_cls, args, _, pattern = _BACKWARD_CASES[case]
        with pytest.raises(RuntimeError, match=pattern):
            eager_backward(fn_cls, *args)

    @pytest.mark.parametrize("case", sorted(_BACKWARD_CASES))
    def test_caught_like_eager(self, case: str) -> None:
        """Code that catches eager's RuntimeError for a bad backward also catches minihop's error."""
        fn_cls, args, _, _ = _BACKWARD_CASES[case]
        minihop.clear_cache()
        with pytest.raises(RuntimeError):
            minihop.apply(fn_cls, *args)

    def test_trailing_nones_accepted(self) -> None:
        """Extra trailing Nones are dropped, as eager does."""
        x = r(3)
        minihop.capture(TrailingNones, x)(x).sum().backward()
        torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
        eager_backward(TrailingNones, r(3))

    def test_broadcastable_shape_accepted(self) -> None:
        """A gradient that sums back to the input's shape is not an error (eager reduces it)."""

        class Broadcast(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g.expand(5, 3)

        x = r(3)
        minihop.capture(Broadcast, x)(x).sum().backward()
        torch.testing.assert_close(x.grad, torch.full((3,), 5.0))


# ---------------------------------------------------------------------------------------------
# UnsupportedArgumentError
# ---------------------------------------------------------------------------------------------

class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Sub(torch.Tensor):
    pass


class TestUnsupportedArgumentError:
    @pytest.mark.filterwarnings("ignore:.*should not be instantiated")
    @pytest.mark.parametrize("kind", ["lambda", "apply", "instance", "other_class", "builtin_type"])
    def test_not_a_function(self, kind: str) -> None:
        """capture() of something that is not an autograd.Function subclass."""
        thing = {"lambda": lambda: (lambda x: x * 2), "apply": lambda: Double.apply,
                 "instance": lambda: Double(), "other_class": lambda: torch.nn.Module,
                 "builtin_type": lambda: int}[kind]()
        err = capture_error(minihop.UnsupportedArgumentError, thing, r(3),
                            match=r"minihop\.capture got .*, which is not a torch\.autograd\.Function subclass\.")
        assert "Pass the class itself (MyFunction), not an instance or MyFunction.apply." in str(err)
        assert isinstance(err, TypeError) and isinstance(err, minihop.MinihopError)

    def test_tensor_subclass(self) -> None:
        """A tensor subclass argument is refused; eager accepts it."""
        x = torch.randn(3).as_subclass(Sub).requires_grad_()
        err = capture_error(minihop.UnsupportedArgumentError, Double, x,
                            match=r"Double\.apply got a Sub \(a tensor subclass\) at x\.")
        assert "t.as_subclass(torch.Tensor)" in str(err)
        assert isinstance(err, TypeError)
        eager_backward(Double, torch.randn(3).as_subclass(Sub).requires_grad_())

    def test_tensor_subclass_nested(self) -> None:
        """A tensor subclass inside a container argument is refused, naming its path."""

        class First(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, xs):
                return x * xs[0]

            @staticmethod
            def backward(ctx, g):
                return g, None

        capture_error(minihop.UnsupportedArgumentError, First, r(3), [torch.randn(3).as_subclass(Sub)],
                      match=r"First\.apply got a Sub \(a tensor subclass\) at xs\[0\]\.")

    def test_parameter_accepted(self) -> None:
        """nn.Parameter is not refused as a subclass."""
        p = torch.nn.Parameter(torch.randn(3))
        minihop.capture(Double, p)(p).sum().backward()
        torch.testing.assert_close(p.grad, torch.full((3,), 2.0))


# ---------------------------------------------------------------------------------------------
# UnsupportedOutputError: documented refusal (eager rewrites the tensor's history in place)
# ---------------------------------------------------------------------------------------------

class ReturnLifted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        return x * 2, p["w"]

    @staticmethod
    def backward(ctx, g, _gw):
        return g * 2, None


class TestUnsupportedOutputError:
    def test_lifted_tensor_returned(self) -> None:
        """Returning a tensor reached through a container argument is refused, naming its path."""
        err = capture_error(minihop.UnsupportedOutputError, ReturnLifted, r(3), {"w": r(3)},
                            match=re.escape("ReturnLifted.forward returns p['w'], a tensor it reached "
                                            "through an object, container, closure or module"))
        assert "What to do: Return p['w'].clone(), or pass the tensor as a direct argument." in str(err)
        assert isinstance(err, TypeError) and isinstance(err, minihop.MinihopError)
        w = r(3)
        _, out = ReturnLifted.apply(r(3), {"w": w})
        assert out is w and not w.is_leaf  # eager turns the user's leaf into a non-leaf


# ---------------------------------------------------------------------------------------------
# UnsupportedOperationError
# ---------------------------------------------------------------------------------------------

@torch.library.custom_op("minihop_test_errors::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class UsesOpaqueOp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _twice(x)

    @staticmethod
    def backward(ctx, g):
        return g * 2


class TestUnsupportedOperationError:
    def test_op_without_fake_kernel(self) -> None:
        """A custom op without a fake implementation is refused with minihop's error; eager runs it."""
        err = capture_error(minihop.UnsupportedOperationError, UsesOpaqueOp, r(3),
                            match=r"UsesOpaqueOp\.forward calls .*twice.*, which has no fake-tensor implementation")
        assert isinstance(err, NotImplementedError)
        eager_backward(UsesOpaqueOp, r(3))


# ---------------------------------------------------------------------------------------------
# GuardMismatchError
# ---------------------------------------------------------------------------------------------

class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x * s

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s, None


def _guard(cap: minihop.Capture, *args: Any, match: str) -> minihop.GuardMismatchError:
    with pytest.raises(minihop.GuardMismatchError, match=match) as info:
        cap(*args)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, minihop.MinihopError)
    return err


_CALLED = "Capture of Double called with arguments unlike the captured ones: argument 0 (x):\n"


class TestGuardMismatchError:
    def test_shape(self) -> None:
        """A differently shaped argument, with captured and found on separate lines."""
        cap = minihop.capture(Double, r(3))
        err = _guard(cap, r(4), match=re.escape(
            _CALLED + "  captured: Tensor(shape=[3], dtype=torch.float32, device=cpu, requires_grad=True)\n"
            "  found:    Tensor(shape=[4], dtype=torch.float32, device=cpu, requires_grad=True)"))
        assert "What to do: Capture again for these arguments, or use minihop.apply" in str(err)

    def test_dtype(self) -> None:
        """A different dtype."""
        cap = minihop.capture(Double, r(3))
        _guard(cap, r(3).double().detach().requires_grad_(),
               match=re.escape("found:    Tensor(shape=[3], dtype=torch.float64"))

    def test_requires_grad(self) -> None:
        """A different requires_grad flag."""
        cap = minihop.capture(Double, r(3))
        _guard(cap, r(3, grad=False), match=re.escape("requires_grad=False)"))

    def test_constant_value(self) -> None:
        """A different Python constant."""
        cap = minihop.capture(Scale, r(3), 2.0)
        _guard(cap, r(3), 3.0, match=re.escape(
            "argument 1 (s):\n  captured: 2.0\n  found:    3.0"))

    def test_grad_mode(self) -> None:
        """Called under no_grad when captured with grad mode on."""
        cap = minihop.capture(Double, r(3))
        with torch.no_grad():
            _guard(cap, r(3), match=re.escape("grad mode: captured with True, called with False"))

    def test_dynamic_sizes_outside_guards(self) -> None:
        """A dynamic capture called with a size its guards exclude (a size of 1)."""
        cap = minihop.capture(Double, r(3, 4), dynamic=True)
        assert cap(r(6, 7)).shape == (6, 7)
        _guard(cap, r(1, 7), match="Capture of Double called with dynamic sizes outside what it was traced for")

    def test_apply_recaptures_instead(self) -> None:
        """minihop.apply never raises GuardMismatchError: it captures again."""
        minihop.clear_cache()
        assert minihop.apply(Double, r(3)).shape == (3,)
        assert minihop.apply(Double, r(4)).shape == (4,)
        minihop.clear_cache()
