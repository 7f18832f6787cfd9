"""The exceptions that reach a caller: minihop's refusals, eager's own types, the user's own.

Every hostile Function below runs eagerly (``F.apply``) and through each public entry point
(``minihop.apply``, ``minihop.capture``, ``minihop.function(dynamic=True)``, ``minihop.trace``).
Whatever reaches the caller must be a ``minihop.MinihopError``, the exception the user's own
code raised (unchanged), or of the type eager raises for the same call; never a class of
torch's tracing machinery (``torch._subclasses``, ``torch.fx``, ``torch._dynamo``, sympy, ...).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import pickle
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.autograd import Function

import minihop

THIS_FILE = __file__
INTERNAL = ("torch._", "torch.fx", "torch.utils._sympy", "sympy")


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    minihop.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    minihop.reset()


class UserError(Exception):
    """An exception class of the user's own."""


def fn(forward: Callable[..., Any], backward: Callable[..., Any], name: str = "F") -> type:
    """An autograd.Function from a forward and a backward (ctx first, as in the class form)."""
    return type(name, (Function,), {"forward": staticmethod(forward), "backward": staticmethod(backward),
                                    "__module__": __name__, "__qualname__": name})


# -- hostile Functions -----------------------------------------------------------------------

@torch.library.custom_op("minihop_error_types::opaque", mutates_args=())
def _opaque(a: torch.Tensor) -> torch.Tensor:
    return a * 2  # no fake kernel registered: fake tensors cannot run it


OTHER_MODE = FakeTensorMode()
OTHER_FAKE = OTHER_MODE.from_tensor(torch.ones(3))
SCALES: dict[int, float] = {}


def _generator_forward(ctx: Any, a: torch.Tensor) -> Any:
    yield a * 2


def _recurse_forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
    return RecurseForever.apply(a)


RecurseForever = fn(_recurse_forward, lambda ctx, g: g, "RecurseForever")


class InnerSave(Function):
    @staticmethod
    def forward(ctx: Any, g: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(d)
        return g / d

    @staticmethod
    def backward(ctx: Any, gg: torch.Tensor) -> Any:
        (d,) = ctx.saved_tensors
        return gg / d, None


def _save_dim(ctx: Any, a: torch.Tensor, device: Any = None) -> torch.Tensor:
    d = torch.tensor(a.shape[0]) if device is None else torch.tensor(a.shape[0], device=device)
    ctx.save_for_backward(d)
    return a * 2


def _inner_with_dim(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    (d,) = ctx.saved_tensors
    return InnerSave.apply(g, d) + g * torch.arange(3) / d


def _raise_value_error(ctx: Any, a: torch.Tensor) -> torch.Tensor:
    raise ValueError("forward refuses this input")


def _raise_user_error(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    raise UserError("backward refuses this grad")


def _save_int(ctx: Any, a: torch.Tensor) -> torch.Tensor:
    ctx.save_for_backward(a, 3)
    return a * 2


def _save_for_forward_str(ctx: Any, a: torch.Tensor) -> torch.Tensor:
    ctx.save_for_forward(a, "a")
    return a * 2


def _mark_nondiff_none(ctx: Any, a: torch.Tensor) -> torch.Tensor:
    ctx.mark_non_differentiable(None)
    return a * 2


def _mark_dirty_int(ctx: Any, a: torch.Tensor) -> torch.Tensor:
    ctx.mark_dirty(1)
    return a * 2


def _id_lookup(ctx: Any, a: torch.Tensor) -> torch.Tensor:
    return a * SCALES[id(a)]


def _outside_fake(ctx: Any, a: torch.Tensor) -> torch.Tensor:
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        real = torch.ones(3)
    return a * real


def _torch_save(ctx: Any, a: torch.Tensor) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(a, buffer)
    return a * 2


def _backward_inside_backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    # backward() into the Function's own input, not detached: eager's reaches through it into
    # the caller's graph (one the Function makes itself, or a module's parameter, is captured:
    # tests/test_recompute.py).
    a, = ctx.saved_tensors
    with torch.enable_grad():
        (a * 2).sum().backward()
    return g * 2


def _double(t: torch.Tensor) -> torch.Tensor:
    return t * 2


_compiled_double = torch.compile(_double, backend="eager")

G = lambda ctx, g: g * 2  # noqa: E731  (the common backward)
ID = lambda ctx, g: g  # noqa: E731

HOSTILE: dict[str, type] = {
    "op without a fake kernel": fn(lambda ctx, a: _opaque(a), G),
    "nonzero": fn(lambda ctx, a: a[a.nonzero()[:, 0]], ID),
    "boolean mask": fn(lambda ctx, a: a[a > 0].sum() * a, ID),
    "unique": fn(lambda ctx, a: torch.unique(a).sum() * a, ID),
    "item": fn(lambda ctx, a: a * a.sum().item(), G),
    "tolist": fn(lambda ctx, a: a * len([v for v in a.tolist() if v > 0]), G),
    "bool of a tensor": fn(lambda ctx, a: a * 2 if bool(a.sum() > 0) else a * 3, G),
    "numpy": fn(lambda ctx, a: a * float(a.detach().numpy().sum()), G),
    "numpy in backward": fn(lambda ctx, a: a * 2, lambda ctx, g: g * float(g.numpy().sum())),
    "data_ptr": fn(lambda ctx, a: a * (1 + a.data_ptr() % 1), G),
    "storage size": fn(lambda ctx, a: a * (len(a.untyped_storage()) > 0), G),
    "id() lookup": fn(_id_lookup, G),
    "too many grads": fn(lambda ctx, a: a * 2, lambda ctx, g: (g, g)),
    "a string as a grad": fn(lambda ctx, a: a * 2, lambda ctx, g: "g"),
    "grad of the wrong shape": fn(lambda ctx, a: a * 2, lambda ctx, g: g[:2]),
    "save_for_backward an int": fn(_save_int, G),
    "save_for_forward a str": fn(_save_for_forward_str, G),
    "mark_non_differentiable None": fn(_mark_nondiff_none, G),
    "mark_dirty an int": fn(_mark_dirty_int, G),
    "a real tensor made outside fake mode": fn(_outside_fake, G),
    "a fake of another FakeTensorMode": fn(lambda ctx, a: a * OTHER_FAKE, G),
    "torch.tensor of a fake": fn(lambda ctx, a: torch.tensor(a) * 2, G),
    "torch.tensor of a fake's elements": fn(lambda ctx, a: torch.tensor([a.sum(), a.max()]).sum() * a, G),
    "forward is a generator": fn(_generator_forward, G),
    "generator expression": fn(lambda ctx, a: sum(a * i for i in range(1, 3)), lambda ctx, g: g * 3),
    "endless recursion": RecurseForever,
    "user ValueError in forward": fn(_raise_value_error, G),
    "user exception in backward": fn(lambda ctx, a: a * 2, _raise_user_error),
    "meta tensor in backward": fn(lambda ctx, a: a * 2, lambda ctx, g: g * torch.tensor(2.0, device="meta")),
    "meta tensor in forward": fn(lambda ctx, a: a * torch.ones(3, device="meta"), G),
    "sparse round trip": fn(lambda ctx, a: a.to_sparse().to_dense() * 2, G),
    "shape mismatch": fn(lambda ctx, a: a @ torch.ones(2, 2), G),
    "torch.tensor(dim) saved, used by another Function": fn(_save_dim, _inner_with_dim),
    "torch.tensor(dim) on the meta device": fn(lambda ctx, a: _save_dim(ctx, a, "meta"), _inner_with_dim),
    "torch.save": fn(_torch_save, G),
    "pickle": fn(lambda ctx, a: pickle.loads(pickle.dumps(a.detach())) * 2, G),
    "copy.deepcopy": fn(lambda ctx, a: copy.deepcopy(a) * 2, G),
    "torch.func.grad in forward": fn(lambda ctx, a: torch.func.grad(lambda t: (t * t).sum())(a), G),
    "backward() inside backward": fn(lambda ctx, a: ctx.save_for_backward(a) or a * 2, _backward_inside_backward),
    "hook on a no-grad tensor": fn(lambda ctx, a: (a * 2).register_hook(lambda g: g), G),
    "torch.compile inside forward": fn(lambda ctx, a: _compiled_double(a), G),
    "torch._assert fails": fn(lambda ctx, a: torch._assert(a.shape[0] == 4, "needs four") or a * 2, G),
    "python values in backward": fn(lambda ctx, a: a * 2, lambda ctx, g: g * torch.tensor(2.0)
                                    + torch.arange(3) * torch.ones(3) // torch.tensor(2)),
}


# -- running one call ------------------------------------------------------------------------

def _apply(F: type, x: torch.Tensor) -> Any:
    return minihop.apply(F, x)


def _capture(F: type, x: torch.Tensor) -> Any:
    return minihop.capture(F, x)(x)


def _function_dynamic(F: type, x: torch.Tensor) -> Any:
    return minihop.function(F, dynamic=True).apply(x)


def _trace(F: type, x: torch.Tensor) -> Any:
    def program(a: torch.Tensor) -> Any:
        return F.apply(a)

    return minihop.trace(program, x)(x)


ENTRIES = {"apply": _apply, "capture": _capture, "function(dynamic=True)": _function_dynamic,
           "trace": _trace}


@dataclasses.dataclass
class Outcome:
    error: BaseException | None
    grad: torch.Tensor | None


def _run(call: Callable[[], Any], x: torch.Tensor) -> Outcome:
    """Call, then backward through the first tensor output; what came out."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)  # endless recursion ends quickly
    try:
        out = call()
        if isinstance(out, Iterator):
            out = list(out)
        leaves = out if isinstance(out, (tuple, list)) else [out]
        if any(isinstance(v, FakeTensor) for v in leaves):
            raise AssertionError(f"a fake tensor reached the caller: {out}")
        while isinstance(out, (tuple, list)):
            out = out[0]
        out.sum().backward()
        return Outcome(None, x.grad)
    except Exception as e:
        return Outcome(e, None)
    finally:
        sys.setrecursionlimit(limit)


def _raised_by_user_code(error: BaseException) -> bool:
    """The innermost frame of the traceback is this file: the user's code raised it."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename == THIS_FILE


def _acceptable(found: BaseException, eager: BaseException | None) -> str | None:
    """Why ``found`` may reach the caller, or None if it may not."""
    if isinstance(found, minihop.MinihopError):
        return "minihop's refusal"
    if "fake tensor reached the caller" in str(found):
        return None
    if _raised_by_user_code(found) and type(found).__module__ in ("builtins", __name__):
        return "the user's own exception"
    if eager is not None and type(eager).__module__ == "builtins" and isinstance(found, type(eager)):
        return "eager's exception type"
    return None


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_no_torch_internal_exception_reaches_the_caller(case: str, entry: str) -> None:
    """A hostile Function gives the caller minihop's refusal, eager's exception type or the user's own exception, never a class of torch's tracing machinery."""
    F = HOSTILE[case]
    x = torch.randn(3, requires_grad=True)
    SCALES[id(x)] = 2.0
    eager = _run(lambda: F.apply(x), x)
    x.grad = None
    found = _run(lambda: ENTRIES[entry](F, x), x)
    if found.error is None:
        if eager.error is None:
            torch.testing.assert_close(found.grad, eager.grad)
        return
    module = type(found.error).__module__
    assert not module.startswith(INTERNAL), (
        f"{case} via {entry}: {type(found.error).__module__}.{type(found.error).__name__} "
        f"reached the caller: {found.error}")
    assert _acceptable(found.error, eager.error), (
        f"{case} via {entry}: {type(found.error).__name__}: {found.error}\n"
        f"  eager: {type(eager.error).__name__ if eager.error else 'ran'}: {eager.error}")


# -- ctx given non-tensors: eager's exception types ------------------------------------------

CTX_CASES = {
    "save_for_backward an int": (TypeError, r"\[MH107\] F\.forward passes a value of type int to "
                                 r"ctx\.save_for_backward \(argument 1\)\.\n  at File .*test_error_types\.py"),
    "save_for_forward a str": (AssertionError, r"\[MH107\] F\.forward passes a value of type str to "
                               r"ctx\.save_for_forward \(argument 1\)\."),
    "mark_non_differentiable None": (RuntimeError, r"\[MH107\] F\.forward passes a value of type "
                                     r"NoneType to ctx\.mark_non_differentiable \(argument 0\)\."),
    "mark_dirty an int": (RuntimeError, r"\[MH107\] F\.forward passes a value of type int to "
                          r"ctx\.mark_dirty \(argument 0\)\."),
}


@pytest.mark.parametrize("case", sorted(CTX_CASES))
def test_ctx_non_tensor_raises_eagers_type(case: str) -> None:
    """A non-tensor given to a ctx method is MH107, an instance of the exception eager raises for it."""
    F = HOSTILE[case]
    expected, message = CTX_CASES[case]
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(expected):
        F.apply(x)
    with pytest.raises(minihop.CtxArgumentError, match=message) as info:
        minihop.apply(F, x)
    assert isinstance(info.value, expected)


@pytest.mark.parametrize("bad", [1, "s", 1.5, [torch.ones(1)]], ids=["int", "str", "float", "list"])
def test_save_for_backward_types(bad: Any) -> None:
    """save_for_backward of any non-tensor but None is refused, naming its position and type."""
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(None, a, bad)
        return a * 2

    F = fn(forward, G)
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="argument 2 is of type"):
        F.apply(x)
    with pytest.raises(minihop.CtxArgumentError,
                       match=rf"passes a value of type {type(bad).__name__} to ctx\.save_for_backward \(argument 2\)"):
        minihop.apply(F, x)


def test_save_for_backward_non_tensor_without_grad_runs() -> None:
    """As in eager, save_for_backward is not checked when no gradient can flow."""
    F = HOSTILE["save_for_backward an int"]
    x = torch.randn(3)
    torch.testing.assert_close(minihop.apply(F, x), F.apply(x))
    with torch.no_grad():
        y = torch.randn(3, requires_grad=True)
        torch.testing.assert_close(minihop.apply(F, y), F.apply(y))


# -- pinned messages -------------------------------------------------------------------------

def test_user_value_error_is_unchanged() -> None:
    """A ValueError the user's forward raises reaches the caller as that same ValueError."""
    F = HOSTILE["user ValueError in forward"]
    x = torch.randn(3, requires_grad=True)
    for call in (lambda: minihop.apply(F, x), lambda: minihop.capture(F, x),
                 lambda: minihop.trace(lambda a: F.apply(a), x)):
        with pytest.raises(ValueError, match="^forward refuses this input$") as info:
            call()
        assert type(info.value) is ValueError
        assert info.value.__cause__ is None


def test_user_exception_in_backward_is_unchanged() -> None:
    """The user's own exception class from backward reaches the caller as itself, when
    ``.backward()`` runs, as in eager (raised while tracing, the call runs eagerly)."""
    F = HOSTILE["user exception in backward"]
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(UserError, match="^backward refuses this grad$"):
        F.apply(x).sum().backward()
    y = minihop.apply(F, x)
    with pytest.raises(UserError, match="^backward refuses this grad$") as info:
        y.sum().backward()
    assert type(info.value) is UserError


def test_device_mismatch_is_mh104() -> None:
    """A tensor on another device mixed with the grads is MH104 (a RuntimeError, as eager's), not torch's FakeTensorDeviceMismatchError."""
    F = HOSTILE["meta tensor in backward"]
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError):
        F.apply(x).sum().backward()
    for call in (lambda: minihop.apply(F, x), lambda: minihop.trace(lambda a: F.apply(a), x)):
        with pytest.raises(minihop.UnsupportedOperationError,
                           match=r"\[MH104\] F\.backward calls mul on tensors on different devices\.\n"
                                 r"  found: .*cpu and meta.*\n  at File .*test_error_types\.py") as info:
            call()
        assert isinstance(info.value, RuntimeError)
        assert type(info.value.__cause__).__name__ == "FakeTensorDeviceMismatchError"


def test_saved_python_value_tensor_feeds_another_function() -> None:
    """torch.tensor(dim) made in forward, saved, and passed by backward to another Function matches eager (also dynamic, traced, and twice differentiated)."""
    F = HOSTILE["torch.tensor(dim) saved, used by another Function"]
    for entry in ENTRIES.values():
        x = torch.randn(3, requires_grad=True)
        expected = _run(lambda: F.apply(x), x).grad
        x.grad = None
        torch.testing.assert_close(_run(lambda: entry(F, x), x).grad, expected)


def test_no_fake_kernel_is_mh104() -> None:
    """An op without a fake kernel is MH104, naming the op and the user's line."""
    F = HOSTILE["op without a fake kernel"]
    with pytest.raises(minihop.UnsupportedOperationError,
                       match=r"\[MH104\] F\.forward calls minihop_error_types\.opaque\.default, which has no fake-tensor "
                             r"implementation\.\n  at File .*test_error_types\.py"):
        minihop.apply(F, torch.randn(3, requires_grad=True))


def test_dynamic_data_dependent_shape_is_mh103() -> None:
    """Under dynamic shapes a data-dependent output size is captured (an unbacked symbol, grads
    equal to eager's); a Python branch on it is MH103, as without them (not torch's
    GuardOnDataDependentSymNode)."""
    F = HOSTILE["boolean mask"]
    for n in (3, 5):
        x = torch.randn(n, requires_grad=True)
        expected = _run(lambda: F.apply(x), x).grad
        x.grad = None
        torch.testing.assert_close(_run(lambda: minihop.function(F, dynamic=True).apply(x), x).grad,
                                   expected, rtol=0, atol=0)
    branch = fn(lambda ctx, a: a * 2 if a[a > 0].shape[0] > 1 else a, G)
    with pytest.raises(minihop.DataDependentError,
                       match=r"\[MH103\] F\.forward calls __getitem__, whose result depends on tensor values\."):
        minihop.function(branch, dynamic=True).apply(torch.randn(3, requires_grad=True))


def test_dynamic_op_without_fake_kernel_is_mh104() -> None:
    """Under dynamic shapes an op fake tensors cannot run is MH104, not torch's UnsupportedOperatorException."""
    F = HOSTILE["sparse round trip"]
    x = torch.randn(3, requires_grad=True)
    F.apply(x)
    with pytest.raises(minihop.UnsupportedOperationError,
                       match=r"\[MH104\] F\.forward calls to_sparse, which has no fake-tensor implementation\."):
        minihop.function(F, dynamic=True).apply(x)


def test_tensor_of_fake_elements_is_mh103() -> None:
    """torch.tensor of a tensor's elements needs their values: MH103, not a bare RuntimeError."""
    F = HOSTILE["torch.tensor of a fake's elements"]
    x = torch.randn(3, requires_grad=True)
    F.apply(x)
    with pytest.raises(minihop.DataDependentError,
                       match=r"\[MH103\] F\.forward calls tensor, whose result depends on tensor values\.\n"
                             r"  at File .*test_error_types\.py"):
        minihop.apply(F, x)


def test_dynamic_fake_only_error_is_mh104() -> None:
    """An error only symbolic fake tensors raise (a dict keyed by a dynamic size: a SymInt is
    unhashable) is MH104. (``data_ptr``, the example before, is refused as a storage read.)"""
    F = fn(lambda ctx, a: a * {a.shape[0]: 2}[a.shape[0]], G)
    x = torch.randn(3, requires_grad=True)
    F.apply(x)
    with pytest.raises(minihop.UnsupportedOperationError,
                       match=r"\[MH104\] F\.forward fails on minihop's fake tensors with a TypeError "
                             r"that only fake tensors raise\."):
        minihop.function(F, dynamic=True).apply(x)


def test_storage_read_of_a_tensor_argument_is_mh104() -> None:
    F = HOSTILE["data_ptr"]
    x = torch.randn(3, requires_grad=True)
    F.apply(x)
    with pytest.raises(minihop.UnsupportedOperationError,
                       match=r"\[MH104\] F\.forward reads a\.data_ptr, the storage of a tensor argument\."):
        minihop.function(F, dynamic=True).apply(x)


def test_returned_generator_is_mh102() -> None:
    """A forward that returns a generator is MH102: replaying the graphs could not make it, and it would yield fake tensors."""
    F = HOSTILE["forward is a generator"]
    x = torch.randn(3, requires_grad=True)
    assert not isinstance(next(F.apply(x)), FakeTensor)
    with pytest.raises(minihop.UnsupportedOutputError,
                       match=r"\[MH102\] F\.forward returns a generator \(an iterator\)\."):
        minihop.apply(F, x)


def _nested_minihop_backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
    (d,) = ctx.saved_tensors
    return minihop.apply(InnerSave, g, d) * d


class DimSquare(Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        d = torch.tensor(a.shape[0])
        ctx.save_for_backward(a, d)
        return a * a / d

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        a, d = ctx.saved_tensors
        return InnerSave.apply(2 * a * g, d) * d


def test_saved_python_value_tensor_through_nested_minihop_apply() -> None:
    """A saved torch.tensor(dim) handed to minihop.apply inside backward matches eager through every entry point."""
    F = fn(_save_dim, _nested_minihop_backward)
    for entry in ENTRIES.values():
        minihop.reset()
        x = torch.randn(3, requires_grad=True)
        expected = _run(lambda: F.apply(x), x).grad
        x.grad = None
        torch.testing.assert_close(_run(lambda: entry(F, x), x).grad, expected)


def test_saved_python_value_tensor_double_backward() -> None:
    """Double backward through a backward that passes a saved torch.tensor(dim) to another
    Function: eager's calls InnerSave.backward, so strict mode refuses it (MH104: the graph would
    differentiate InnerSave's forward ops) and fallback mode matches eager."""
    def second(call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        (g,) = torch.autograd.grad(call(x).sum(), x, create_graph=True)
        (g * g).sum().backward()
        assert x.grad is not None
        return x.grad

    x = torch.randn(3, requires_grad=True)
    expected = second(DimSquare.apply, x).clone()
    for dynamic in (None, True):
        x.grad = None
        with pytest.raises(minihop.UnsupportedOperationError, match=r"\[MH104\] DimSquare\.backward .*InnerSave\.apply"):
            second(minihop.function(DimSquare, dynamic=dynamic), x)
        x.grad = None
        torch.testing.assert_close(second(minihop.function(DimSquare, dynamic=dynamic, fallback="eager"), x), expected)


def test_backward_call_inside_traced_code_is_mh106() -> None:
    """Tensor.backward() inside backward that reaches the Function's own input is MH106: eager's reaches through it into the caller's graph, which the capture does not record."""
    F = HOSTILE["backward() inside backward"]
    with pytest.raises(minihop.SideEffectError,
                       match=r"\[MH106\] F\.backward calls backward\(\), which reaches a tensor of shape \[3\] "
                             r"that the Function did not make .* and accumulates into its \.grad\.\n"
                             r"  at File .*test_error_types\.py"):
        minihop.apply(F, torch.randn(3, requires_grad=True))


def test_torch_save_in_forward_is_mh104_torch_io() -> None:
    """torch.save in forward is refused where the code names it, a buffer or a file alike
    (docs/unsupported.md MH104-torch-io): what torch's writers and readers touch, a capture
    cannot repeat."""
    F = HOSTILE["torch.save"]
    x = torch.randn(3, requires_grad=True)
    F.apply(x)
    with pytest.raises(minihop.UnsupportedOperationError, match=r"\[MH104\] F\.forward calls torch's save, which reads or writes files"):
        minihop.apply(F, x)


@pytest.mark.parametrize("case", ["pickle", "copy.deepcopy"])
def test_serialising_a_tensor_is_mh103(case: str) -> None:
    """pickle and deepcopy of a tensor in forward need its values: MH103, not pickle's AttributeError on a fake."""
    F = HOSTILE[case]
    x = torch.randn(3, requires_grad=True)
    F.apply(x)
    with pytest.raises(minihop.DataDependentError,
                       match=r"\[MH103\] F\.forward calls __(reduce_ex|deepcopy)__, whose result depends on tensor values\."):
        minihop.apply(F, x)


def test_torch_internal_assertion_is_mh104() -> None:
    """An AssertionError from torch's own tracing code (torch.func.grad over a fake tensor) is MH104 with the original as its cause."""
    F = HOSTILE["torch.func.grad in forward"]
    x = torch.randn(3, requires_grad=True)
    F.apply(x)
    with pytest.raises(minihop.UnsupportedOperationError,
                       match=r"\[MH104\] F\.forward fails on minihop's fake tensors with torch's internal "
                             r"AssertionError\.") as info:
        minihop.apply(F, x)
    assert type(info.value.__cause__) is AssertionError


def test_torch_compile_inside_forward_matches_eager() -> None:
    """A torch.compile'd helper that eager has already run (and cached) is traced as written, and the capture matches eager."""
    F = HOSTILE["torch.compile inside forward"]
    x = torch.randn(3, requires_grad=True)
    expected = _run(lambda: F.apply(x), x)  # compiles and caches _double for real tensors
    for entry in ENTRIES.values():
        minihop.reset()
        x.grad = None
        found = _run(lambda: entry(F, x), x)
        assert found.error is None, found.error
        torch.testing.assert_close(found.grad, expected.grad)
    assert not isinstance(minihop.apply(F, x), FakeTensor)


def test_users_torch_assert_stays_an_assertion_error() -> None:
    """A failing torch._assert in forward is the user's own assertion: the same AssertionError as eager, not MH104."""
    F = HOSTILE["torch._assert fails"]
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(AssertionError, match="^needs four$"):
        F.apply(x)
    with pytest.raises(AssertionError, match="^needs four$") as info:
        minihop.apply(F, x)
    assert type(info.value) is AssertionError
